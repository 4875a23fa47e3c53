"""Every rank: a dict-input, two-output model pipelined; gradients against a full-model tape.
And ``fit`` and ``evaluate`` of a two-output model (one head on each stage with K=2) with a
list or dict of losses, ``loss_weights``, metrics per output and sample weights, against one
process's Keras model of the same layers; with InfoBatch, its weights for the test to hold
against one process's tfsift, and those of a model of per-token logits sifted by InfoBatch.

usage: multi_io_check.py K M [fits]
  fits: the fit and evaluate checks alone (on K stages x replicas, against Keras' fit of
  the replicas' batches together). Both modes also fit a one-output model on arrays whose
  epochs end with a partial batch (``partial_fit``).
"""

from __future__ import annotations

import sys
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift
from mpi import report

CE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
MSE = keras.losses.MeanSquaredError()


class TwoInTwoOut(tfsift.DistributedModel):
    """Inputs {"a": (8,), "b": (5,)}; outputs (class logits, a regression value)."""

    def __init__(self) -> None:
        super().__init__()
        self.left = keras.layers.Dense(8, activation="tanh")
        self.right = keras.layers.Dense(8, activation="tanh")
        self.mix = keras.layers.Dense(12, activation="relu")
        self.classes = keras.layers.Dense(4)
        self.value = keras.layers.Dense(1)

    def call(self, inputs: dict[str, Any]) -> Any:
        h = keras.ops.concatenate([self.left(inputs["a"]), self.right(inputs["b"])], axis=-1)
        h = self.mix(h)
        return self.classes(h), self.value(h)


class Pair(tfsift.DistributedModel):
    """A list input unpacked inside call: ``left, right = inputs``."""

    def __init__(self) -> None:
        super().__init__()
        self.left = keras.layers.Dense(6)
        self.right = keras.layers.Dense(6)
        self.out = keras.layers.Dense(4)

    def call(self, inputs: list[Any]) -> Any:
        left, right = inputs
        return self.out(keras.ops.add(self.left(left), self.right(right)))


def data() -> tuple[dict[str, tf.Tensor], tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(0)
    a = tf.constant(rng.normal(size=(8, 8)), tf.float32)
    b = tf.constant(rng.normal(size=(8, 5)), tf.float32)
    return (
        {"a": a, "b": b},
        tf.constant(rng.integers(0, 4, 8)),
        tf.constant(rng.normal(size=(8, 1)), tf.float32),
    )


def loss_of(name: str, outputs: Any, y: tf.Tensor, v: tf.Tensor) -> tf.Tensor:
    if name == "dict":
        logits, value = outputs
        return CE(y, logits) + MSE(v, value)
    return CE(y, outputs)


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-12))


def check(name: str, K: int, M: int) -> dict[str, Any]:
    tfsift.init({"partitions": K, "microbatches": M, "profile_repeats": 1})
    keras.utils.set_random_seed(3)
    model = TwoInTwoOut() if name == "dict" else Pair()
    inputs, y, v = data()
    if name == "pair":
        inputs = [inputs["a"][:, :5], inputs["b"]]
    with tf.GradientTape() as tape:
        ref_loss = loss_of(name, model.call(inputs), y, v)
    ref = {
        w.path: g.numpy()
        for w, g in zip(
            model.trainable_variables,
            tape.gradient(ref_loss, model.trainable_variables),
            strict=True,
        )
    }

    @tfsift.step
    def train(inputs: Any, y: tf.Tensor, v: tf.Tensor) -> Any:
        loss = loss_of(name, model(inputs, training=True), y, v)
        return tfsift.gradients(loss, model.trainable_variables), loss

    grads, loss = train(inputs, y, v)
    errors = [
        float(
            np.max(np.abs(g.accumulate().numpy() - ref[w.path]))
            / (np.max(np.abs(ref[w.path])) + 1e-12)
        )
        for g, w in zip(grads, model.trainable_variables, strict=True)
    ]
    return {
        "grad_error": max(errors) if errors else 0.0,
        "num_grads": len(grads),
        "loss": float(loss.reduce_mean()),
        "ref_loss": float(ref_loss),
    }


def heads() -> list[keras.layers.Layer]:
    """The same initial weights in every model made of them, named for the reports."""
    init = keras.initializers.GlorotUniform
    return [
        keras.layers.Dense(8, "relu", kernel_initializer=init(1), name="hidden"),
        keras.layers.Dense(3, kernel_initializer=init(2), name="classes"),
        keras.layers.Dense(1, kernel_initializer=init(3), name="value"),
    ]


def two_heads(self: Any, x: Any) -> Any:
    h = self.hidden(x)
    if self.as_dict:
        return {"classes": self.classes(h), "value": self.value(h)}
    return [self.classes(h), self.value(h)]


class KerasHeads(keras.Model):
    def __init__(self, as_dict: bool) -> None:
        super().__init__()
        self.as_dict = as_dict
        self.hidden, self.classes, self.value = heads()

    call = two_heads


class TwoHeads(tfsift.DistributedModel):
    """The class head on stage 0 beside the trunk, the value head on the last stage."""

    def __init__(self, as_dict: bool) -> None:
        super().__init__()
        self.as_dict = as_dict
        self.hidden, self.classes, value = heads()
        with tfsift.partition(tfsift.mp_size() - 1):
            self.value = value

    call = two_heads


FIT_CASES: dict[str, dict[str, Any]] = {
    "list": {
        "loss": [CE, "mse"],
        "loss_weights": [1.0, 0.5],
        "metrics": [["accuracy"], ["mae"]],
    },
    "dict": {
        "loss": {"classes": CE, "value": "mse"},
        "loss_weights": {"classes": 0.3, "value": 1.0},
        "metrics": {"classes": "accuracy"},
    },
}


def fit_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 5)).astype(np.float32)
    y = rng.integers(0, 3, 64)
    return x, y, rng.normal(size=(64, 1)).astype(np.float32), rng.uniform(size=64)


def placed(K: int, M: int) -> None:
    """tfsift on K stages cut where ``TwoHeads`` places its layers."""
    tfsift.init({"partitions": K, "microbatches": M, "auto_partition": False})


def fit_check(case: str, K: int, M: int) -> dict[str, Any]:
    """Keras' and tfsift's fit and evaluate of the same layers: the largest differences."""
    placed(K, M)
    batch = 16 * tfsift.dp_size()  # a step takes a batch of 16 on each replica
    x, y, v, weights = fit_data()
    targets = {"classes": y, "value": v} if case == "dict" else [y, v]
    runs = {}
    validation = (x[:32], keras.tree.map_structure(lambda t: t[:32], targets))
    for model in (KerasHeads(case == "dict"), TwoHeads(case == "dict")):
        model.compile(optimizer=keras.optimizers.SGD(0.1), **FIT_CASES[case])
        history = model.fit(
            x, targets, sample_weight=weights, epochs=2, shuffle=False,
            batch_size=batch if isinstance(model, KerasHeads) else 16,
            verbose=0, validation_data=validation,
        ).history  # fmt: skip
        evaluated = model.evaluate(x, targets, verbose=0)  # a list, in Keras' order
        # 60 samples: whole batches of 16 leave 12 (6 a replica of 2), a last batch, where
        # Keras logs each output's loss as the plain mean over the batches (the total: by
        # their sizes), and tfsift as Keras
        batch = 16 * tfsift.dp_size() if isinstance(model, KerasHeads) else 16
        head = keras.tree.map_structure(lambda t: t[:60], targets)
        evaluated += model.evaluate(x[:60], head, batch_size=batch, verbose=0)
        # 64 - R samples: each replica's last batch, of 15, is padded to split into M
        n = 64 - tfsift.dp_size()
        head = keras.tree.map_structure(lambda t, n=n: t[:n], targets)
        evaluated += model.evaluate(x[:n], head, batch_size=batch, verbose=0)
        runs[type(model).__name__] = history, evaluated, named_weights(model)
    (history, evaluated, ref), (got, got_eval, mine) = runs["KerasHeads"], runs["TwoHeads"]
    return {
        "keys": sorted(got),
        "same_keys": sorted(got) == sorted(history) and len(got_eval) == len(evaluated),
        "history": max(
            abs(a - b) for k in history for a, b in zip(history[k], got[k], strict=True)
        ),
        "evaluate": max(abs(a - b) for a, b in zip(evaluated, got_eval, strict=True)),
        "weights": max(float(np.max(np.abs(w - ref[k]))) for k, w in mine.items()),
    }


class KerasOne(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.classes, _ = heads()

    def call(self, x: Any) -> Any:
        return self.classes(self.hidden(x))


class OneHead(tfsift.DistributedModel):
    """KerasOne's layers, the class head on the last stage."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden, classes, _ = heads()
        with tfsift.partition(tfsift.mp_size() - 1):
            self.classes = classes

    call = KerasOne.call


def partial_fit(K: int, M: int) -> dict[str, Any]:
    """Keras' and tfsift's fit and evaluate of 64 - R samples in batches of 16 a replica
    (Keras': 16 R): each epoch ends with a partial batch, on each replica its own rest (2 x
    2: rows 32-61 dealt, 15 each), padded to split into the microbatches with a copy
    weighed 0; the largest differences."""
    placed(K, M)
    x, y, _, weights = fit_data()
    runs = {}
    n = 64 - tfsift.dp_size()  # each replica's last batch, of 15, padded to 16
    for model in (KerasOne(), OneHead()):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=CE, metrics=["accuracy"])
        history = model.fit(
            x[:n], y[:n], sample_weight=weights[:n], epochs=2, shuffle=False, verbose=0,
            batch_size=16 * (tfsift.dp_size() if isinstance(model, KerasOne) else 1),
        ).history  # fmt: skip
        batch = n if isinstance(model, KerasOne) else 16
        history["evaluated"] = model.evaluate(
            x[:n], y[:n], sample_weight=weights[:n], batch_size=batch, verbose=0
        )
        runs[type(model).__name__] = history, named_weights(model)
    (history, ref), (got, mine) = runs["KerasOne"], runs["OneHead"]
    return {
        "keys": sorted(got) == sorted(history),
        "history": max(
            abs(a - b) for k in history for a, b in zip(history[k], got[k], strict=True)
        ),
        "weights": max(float(np.max(np.abs(w - ref[k]))) for k, w in mine.items()),
    }


def named_weights(model: keras.Model) -> dict[str, np.ndarray]:
    """This rank's trainable weights by layer and name (a stage's own, on a pipeline)."""
    return {f"{w.path.split('/')[-2]}/{w.name}": w.numpy() for w in model.trainable_weights}


def sifted(K: int, M: int) -> dict[str, Any]:
    """Two epochs of fit with InfoBatch on the list case: the history and this rank's weights."""
    placed(K, M)
    x, y, v, _ = fit_data()
    model = TwoHeads(False)
    model.compile(optimizer=keras.optimizers.SGD(0.1), **FIT_CASES["list"])
    history = model.fit(
        x, [y, v], batch_size=16, epochs=3, shuffle=False, verbose=0,
        sift=tfsift.SiftConfig(policy="infobatch"),
    ).history  # fmt: skip
    return {"history": history, "weights": {k: w.tolist() for k, w in named_weights(model).items()}}


class TokenModel(tfsift.DistributedModel):
    """A language model's shape: logits per token, the head on the last stage."""

    def __init__(self) -> None:
        super().__init__()
        init = keras.initializers.GlorotUniform
        self.embed = keras.layers.Embedding(32, 16, embeddings_initializer=init(1), name="embed")
        self.block = keras.layers.Dense(16, "gelu", kernel_initializer=init(2), name="block")
        with tfsift.partition(tfsift.mp_size() - 1):
            self.head = keras.layers.Dense(32, kernel_initializer=init(3), name="head")

    def call(self, ids: Any) -> Any:
        return self.head(self.block(self.embed(ids)))


def sifted_tokens(K: int, M: int) -> dict[str, Any]:
    """fit with InfoBatch on next-token targets: the history and this rank's weights."""
    placed(K, M)
    tokens = np.random.default_rng(2).integers(0, 32, (64, 8))
    model = TokenModel()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=CE)
    history = model.fit(
        tokens, np.roll(tokens, -1, axis=1), batch_size=16, epochs=3, shuffle=False,
        verbose=0, sift=tfsift.SiftConfig(policy="infobatch"),
    ).history  # fmt: skip
    return {"history": history, "weights": {k: w.tolist() for k, w in named_weights(model).items()}}


def main() -> None:
    K, M = int(sys.argv[1]), int(sys.argv[2])
    if sys.argv[3:] == ["fits"]:
        fits = {case: fit_check(case, K, M) for case in FIT_CASES}
        report(rank=tfsift.rank(), fits=fits, partial=partial_fit(K, M))
        return
    results = {name: check(name, K, M) for name in ["dict", "pair"]}
    fits = {case: fit_check(case, K, M) for case in FIT_CASES}
    runs = {"heads": sifted(K, M), "tokens": sifted_tokens(K, M)}
    report(rank=tfsift.rank(), results=results, fits=fits, sifted=runs, partial=partial_fit(K, M))


if __name__ == "__main__":
    main()
