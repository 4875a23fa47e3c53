"""Every rank: a model whose token embedding is not tied to a head (its gradient a lookup's
``tf.IndexedSlices``, one row per lookup, rows looked up more than once in every batch),
trained by ``fit`` and by the README's loop with optimizers that read those rows as they
are (Adam squares each, ``global_clipnorm`` and ``clipnorm`` take their norm,
``clipvalue`` clips each), against one process's Keras ``fit`` (or loop) on the same samples.

usage: sparse_check.py CONFIG...
  each CONFIG is ``SCHEDULE:KIND[,KIND...]``: a schedule as ``models.schedule`` reads it
  (``-`` for the default, ``memory`` for ``optimize="memory"``, ``dp`` for one stage:
  the world's ranks are its replicas, ``shared`` for ``Shared``, its table looked up on
  both stages) and the optimizers (keys of ``OPTIMIZERS``,
  ``loop`` for the README's loop with ``tfsift.clip_by_global_norm``).
  The job's ranks are 2 stages x R replicas, but for ``dp``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift
from mpi import computed_once, report

V, T, D, N, B, M, EPOCHS, CLIP = 12, 6, 4, 64, 16, 2, 2, 0.01
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
OPTIMIZERS: dict[str, Callable[[], keras.optimizers.Optimizer]] = {
    "adam": lambda: keras.optimizers.Adam(0.05),
    "adamw_global_clipnorm": lambda: keras.optimizers.AdamW(0.05, global_clipnorm=CLIP),
    "rmsprop_clipnorm": lambda: keras.optimizers.RMSprop(0.05, clipnorm=CLIP),
    "adagrad_clipvalue": lambda: keras.optimizers.Adagrad(0.5, clipvalue=0.001),
    "loop": lambda: keras.optimizers.Adam(0.05),  # clipped in the loop
}


def layers() -> list[keras.layers.Layer]:
    """The same initial weights in every model made of them."""
    return [
        keras.layers.Embedding(
            V,
            D,
            embeddings_initializer=keras.initializers.RandomNormal(seed=1),
            name="tokens",
        ),
        keras.layers.GlobalAveragePooling1D(name="pool"),
        keras.layers.Dense(8, "tanh", kernel_initializer=keras.initializers.GlorotUniform(3)),
        keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(2), name="out"),
    ]


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__(name="net")
        self.tokens, self.pool, self.hidden, self.out = layers()

    def call(self, ids: Any) -> Any:
        return self.out(self.hidden(self.pool(self.tokens(ids))))


def shared_layers() -> dict[str, Any]:
    chain = [
        keras.layers.Dense(32, "tanh", kernel_initializer=keras.initializers.GlorotUniform(5 + i))
        for i in range(4)
    ]
    tokens, pool, _, out = layers()
    return {
        "tokens": tokens,
        "pool": pool,
        "chain": chain,
        "mix": keras.layers.Dense(D, kernel_initializer=keras.initializers.GlorotUniform(9)),
        "out": out,
    }


def shared_call(self: Any, ids: Any) -> Any:
    """The table looked up by the first half of the ids, and by the second after the
    chain: an embedding shared by an encoder and a decoder, on two stages."""
    h = self.pool(self.tokens(ids[:, : T // 2]))
    for layer in self.chain:
        h = layer(h)
    return self.out(self.mix(h) + self.pool(self.tokens(ids[:, T // 2 :])))


class Shared(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__(name="net")
        for name, layer in shared_layers().items():
            setattr(self, name, layer)

    call = shared_call


class SharedReference(keras.Model):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__(name="net")
        for name, layer in shared_layers().items():
            setattr(self, name, layer)

    call = shared_call


def data() -> tuple[np.ndarray, np.ndarray]:
    """Ids among 4 of the 12 rows: every batch looks each row up many times."""
    rng = np.random.default_rng(0)
    return rng.integers(0, 4, (N, T)).astype(np.int32), rng.integers(0, 3, N)


def reference(kind: str, R: int, shared: bool) -> list[np.ndarray]:
    """One process's Keras fit, each step on the R replicas' batches together (a replica
    takes every R-th sample, fit's ``n // R`` dealt by row)."""
    x, y = data()
    per = N // R
    steps = [np.arange(r, N, R)[s * B : (s + 1) * B] for s in range(per // B) for r in range(R)]
    order = np.concatenate(steps)
    model = (
        SharedReference()
        if shared
        else keras.Sequential([keras.Input((T,), dtype="int32"), *layers()])
    )
    model.compile(optimizer=OPTIMIZERS[kind](), loss=LOSS)
    if kind != "loop":
        model.fit(x[order], y[order], batch_size=B * R, epochs=EPOCHS, shuffle=False, verbose=0)
        return [w.numpy() for w in model.trainable_weights]
    for _ in range(EPOCHS):  # a Keras loop: tf.clip_by_global_norm keeps the slices too
        for s in range(N // (B * R)):
            rows = order[s * B * R : (s + 1) * B * R]
            with tf.GradientTape() as tape:
                loss = LOSS(y[rows], model(x[rows], training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            grads, _ = tf.clip_by_global_norm(grads, CLIP)
            model.optimizer.apply(grads, model.trainable_variables)
    return [w.numpy() for w in model.trainable_weights]


def trained(kind: str, shared: bool) -> tfsift.DistributedModel:
    model = Shared() if shared else Net()
    model.compile(optimizer=OPTIMIZERS[kind](), loss=LOSS)
    x, y = data()
    if kind != "loop":
        model.fit(x, y, batch_size=B, epochs=EPOCHS, shuffle=False, verbose=0)
        return model
    optimizer = model.optimizer
    update = tfsift.compiled_update(optimizer, model)

    @tfsift.step
    def train(xb: tf.Tensor, yb: tf.Tensor) -> Any:
        loss = LOSS(yb, model(xb, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    R, r = tfsift.dp_size(), tfsift.dp_rank()
    mine = np.arange(r, N, R)
    for _ in range(EPOCHS):
        for s in range(len(mine) // B):
            rows = mine[s * B : (s + 1) * B]
            grads, _ = train(tf.constant(x[rows]), tf.constant(y[rows]))
            grads = tfsift.allreduce(grads)
            grads, _ = tfsift.clip_by_global_norm(grads, CLIP, model)
            update(grads)
    return model


def main() -> None:
    found: dict[str, float] = {}
    tied: bool | None = None  # whether Shared's table is held by both stages
    for token in sys.argv[1:]:
        schedule, _, kinds = token.partition(":")
        shared = schedule == "shared"
        config: dict[str, Any] = {"microbatches": M, "profile_repeats": 1}
        config["partitions"] = 1 if schedule == "dp" else 2
        if schedule in ("memory", "shared"):
            # by memory the cut falls inside the chain (by speed, a near tie of noise)
            config["optimize"] = "memory"
        elif schedule not in ("-", "dp"):
            from models import schedule as parse  # the tests import this module too

            config.update(parse(schedule))
        tfsift.init(config)
        replicas = tfsift.dp_size()
        for kind in kinds.split(","):
            ref = computed_once(
                f"sparse-{kind}-{replicas}-{shared}",
                functools.partial(reference, kind, replicas, shared),
            )
            model = trained(kind, shared)
            if shared:
                tied = bool(model.partitioned.tied)
            weights = model.get_weights()
            error = max(float(np.max(np.abs(w - r))) for w, r in zip(weights, ref, strict=True))
            found[f"{token}/{kind}"] = error
    report(rank=tfsift.rank(), stage=tfsift.mp_rank(), errors=found, tied=tied)


if __name__ == "__main__":
    main()
