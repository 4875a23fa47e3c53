"""Every rank: 2 stages, the last without trainable variables (an activation alone), trained
by ``fit`` and by the README's loop with optimizers whose update sums over every stage
(``global_clipnorm``, a ``LossScaleOptimizer``'s finite check, both with
``gradient_accumulation_steps``); each against one process's Keras ``fit``. And what
Keras' own ``apply_gradients`` of a stage's gradients says of each optimizer. Last, 2
stages with regularized weights on each (an L2 kernel, an L1 bias): ``fit`` and
``evaluate`` against one process's Keras model, the penalties added as Keras adds them;
a layer that calls ``add_loss`` on the last stage, refused by ``fit`` on every rank; the
README's loop, ``model.losses`` in its step refused and ``tfsift.add_weight_penalties``
after ``tfsift.allreduce``, against the same reference; a regularized embedding tied to
the head across the 2 stages, trained by ``fit``, against one process's Keras model; a
model whose output carries a padding mask, and a layer frozen after the first step, each
refused by ``fit`` on every rank.

usage: update_check.py
  The weightless stage applies nothing but must still take its part in the other stage's
  pipeline sums; the config's short ``timeout`` turns a stage that waits for it in vain
  into a failed job within seconds instead of a hung one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

import tfsift
from mpi import computed_once, report

N, B, M, CLIP = 64, 16, 2, 0.01  # samples, batch, microbatches, a norm every step exceeds
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
OPTIMIZERS: dict[str, Callable[[], keras.optimizers.Optimizer]] = {
    "clipnorm": lambda: keras.optimizers.SGD(0.5, global_clipnorm=CLIP),
    "loss_scale": lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.5, global_clipnorm=CLIP)
    ),
    "accumulated": lambda: keras.optimizers.SGD(
        0.5, global_clipnorm=CLIP, gradient_accumulation_steps=2
    ),
    # fit ends with the moving averages, the stage without variables finalizing none
    "ema": lambda: keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=0.9),
}


def layers() -> list[keras.layers.Layer]:
    """The same initial weights in every model made of them."""
    return [
        keras.layers.Dense(8, "relu", kernel_initializer=keras.initializers.GlorotUniform(1)),
        keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(2)),
        keras.layers.Activation("tanh"),  # logits in (-1, 1): a head without weights
    ]


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, head = layers()
        with tfsift.partition(1):
            self.head = head

    def call(self, x: Any) -> Any:
        return self.head(self.b(self.a(x)))


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(N, 5)).astype(np.float32), rng.integers(0, 3, N)


def reference(name: str) -> list[np.ndarray]:
    """One process's Keras fit, the same batches in the same order."""
    model = keras.Sequential([keras.Input((5,)), *layers()])
    model.compile(optimizer=OPTIMIZERS[name](), loss=LOSS)
    model.fit(*data(), batch_size=B, epochs=1, shuffle=False, verbose=0)
    return [w.numpy() for w in model.trainable_weights]


def error(model: Net, want: list[np.ndarray]) -> float:
    """The largest difference from one process's weights over the whole model."""
    got = model.get_weights()  # collective: every rank gets every stage's
    return max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True))


def fitted(name: str) -> float:
    model = Net()
    model.compile(optimizer=OPTIMIZERS[name](), loss=LOSS)
    model.fit(*data(), batch_size=B, epochs=1, shuffle=False, verbose=0)
    return error(model, computed_once(f"bystander-{name}", lambda: reference(name)))


def readme_step(model: tfsift.DistributedModel, optimizer: Any = None) -> Any:
    """The README's step: the loss (scaled by ``optimizer``'s loss scale) and gradients."""

    @tfsift.step
    def train(x: Any, y: Any) -> Any:
        loss = LOSS(y, model(x, training=True))
        scaled = optimizer.scale_loss(loss) if optimizer is not None else loss
        return tfsift.gradients(scaled, model.trainable_variables), loss

    return train


def looped(name: str) -> tuple[float, int]:
    """The README's loop: ``update(grads)`` on every rank, ``update([])`` on the last."""
    model, optimizer = Net(), OPTIMIZERS[name]()
    update = tfsift.compiled_update(optimizer, model)

    train = readme_step(model, optimizer)
    x, y = data()
    for i in range(0, N, B):
        grads, _ = train(x[i : i + B], y[i : i + B])
        update(tfsift.allreduce(grads))
    return error(model, computed_once(f"bystander-{name}", lambda: reference(name))), len(
        model.trainable_variables
    )


def applied_eagerly() -> dict[str, str]:
    """Keras' own ``apply_gradients`` of a stage's gradients, per optimizer: what it says."""
    model = Net()

    train = readme_step(model)
    x, y = data()
    grads = tfsift.allreduce(train(x[:B], y[:B])[0])
    found = {}
    for name, make in {"plain": lambda: keras.optimizers.SGD(0.5), **OPTIMIZERS}.items():
        if not grads:  # Keras' apply_gradients takes no empty list
            found[name] = "no variables"
            continue
        try:
            make().apply_gradients(zip(grads, model.trainable_variables, strict=True))
            found[name] = "applied"
        except ValueError as err:
            found[name] = str(err)
    return found


def regularized_layers() -> list[keras.layers.Layer]:
    return [
        keras.layers.Dense(
            8,
            "relu",
            kernel_initializer=keras.initializers.GlorotUniform(1),
            kernel_regularizer=keras.regularizers.L2(0.1),
        ),
        keras.layers.Dense(
            3,
            kernel_initializer=keras.initializers.GlorotUniform(2),
            bias_initializer="ones",
            bias_regularizer=keras.regularizers.L1(0.05),
        ),
    ]


class Regularized(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__(name="regularized")
        self.a, head = regularized_layers()
        with tfsift.partition(1):
            self.head = head

    def call(self, x: Any) -> Any:
        return self.head(self.a(x))


def penalized(model: keras.Model) -> tuple[list[float], float]:
    model.compile(optimizer=keras.optimizers.SGD(0.5, global_clipnorm=1.0), loss=LOSS)
    history = model.fit(*data(), batch_size=B, epochs=2, shuffle=False, verbose=0)
    return history.history["loss"], model.evaluate(*data(), batch_size=B, verbose=0)


@functools.cache
def penalized_reference() -> tuple[list[float], float, list[np.ndarray], float]:
    """One process's Keras model: fit's losses, evaluate's, the weights, the penalty."""
    model = keras.Sequential([keras.Input((5,)), *regularized_layers()])
    losses, evaluated = penalized(model)
    return losses, evaluated, model.get_weights(), float(sum(model.losses))


def regularized() -> dict[str, Any]:
    """fit's and evaluate's losses and the weights against one process's Keras model."""
    want = computed_once("penalized", penalized_reference)
    want_losses, want_evaluated, want_weights, penalty = want
    model = Regularized()
    losses, evaluated = penalized(model)
    return {
        "penalty": penalty,
        "penalized_loss_error": max(abs(a - b) for a, b in zip(losses, want_losses, strict=True)),
        "penalized_evaluate_error": abs(evaluated - want_evaluated),
        "penalized_weights_error": error(model, want_weights),
    }


def looped_penalties() -> dict[str, Any]:
    """The README's loop on the same model: ``model.losses`` in the step refused, then the
    penalties added by ``tfsift.add_weight_penalties``; against the same reference."""
    model = Regularized()
    optimizer = keras.optimizers.SGD(0.5, global_clipnorm=1.0)
    update = tfsift.compiled_update(optimizer, model)

    @tfsift.step
    def inside(x: Any, y: Any) -> Any:
        loss = LOSS(y, model(x, training=True)) + sum(model.losses)
        return tfsift.gradients(loss, model.trainable_variables), loss

    train = readme_step(model)
    x, y = data()
    try:
        inside(x[:B], y[:B])
        refused = "not refused"
    except ValueError as err:
        refused = str(err)
    for _ in range(2):
        for i in range(0, N, B):
            grads, _ = train(x[i : i + B], y[i : i + B])
            grads, penalty = tfsift.add_weight_penalties(tfsift.allreduce(grads), model)
            update(grads)
    _, _, want_weights, _ = computed_once("penalized", penalized_reference)
    return {
        "losses_refused": refused,
        "loop_penalty": penalty,
        "loop_penalized_weights_error": error(model, want_weights),
    }


class Penalized(keras.layers.Layer):
    def call(self, x: Any) -> Any:
        self.add_loss(keras.ops.mean(x**2))  # a penalty on this stage's activations
        return x


class AddsLoss(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, _ = layers()
        with tfsift.partition(1):
            self.penalized = Penalized(name="penalized")

    def call(self, x: Any) -> Any:
        return self.penalized(self.b(self.a(x)))


def add_loss_refused() -> str:
    """What fit says, on every rank, of a layer that calls add_loss on the last stage."""
    model = AddsLoss()
    model.compile(optimizer="sgd", loss=LOSS)
    try:
        model.fit(*data(), batch_size=B, epochs=1, verbose=0)
    except ValueError as err:
        return str(err)
    return "not refused"


def refrozen() -> str:
    """What fit says, on every rank, after a layer of stage 0 was frozen since the model was
    partitioned (rank 1 holds that layer's flags too)."""
    model = Net()
    model.compile(optimizer="sgd", loss=LOSS)
    model.fit(*data(), batch_size=B, epochs=1, verbose=0)
    model.a.trainable = False
    model.compile(optimizer="sgd", loss=LOSS)
    try:
        model.fit(*data(), batch_size=B, epochs=1, verbose=0)
    except ValueError as err:
        return str(err).replace(model.a.name, "A")
    return "not refused"


class Padded(tfsift.DistributedModel):
    """Token ids with padding 0 (``mask_zero``): the mask reaches the output, across the cut."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = keras.layers.Embedding(6, 4, mask_zero=True, name="tokens")
        with tfsift.partition(1):
            self.head = keras.layers.Dense(3, name="token_head")

    def call(self, x: Any) -> Any:
        return self.head(self.embed(x))


def mask_refused() -> str:
    """What fit says, on every rank, of a model whose output carries a mask."""
    model = Padded()
    model.compile(optimizer="sgd", loss=LOSS)
    x, y = data()
    tokens = (np.abs(x[:, :4]) * 3).astype("int32") % 6  # some zeros: padding
    try:
        model.fit(tokens, np.stack([y] * 4, 1), batch_size=B, epochs=1, verbose=0)
    except ValueError as err:
        return str(err)
    return "not refused"


def tied_layers() -> list[keras.layers.Layer]:
    """A regularized embedding that is also the head, and a norm between its two calls."""
    return [
        keras.layers.ReversibleEmbedding(
            12,
            4,
            embeddings_initializer=keras.initializers.RandomUniform(seed=3),
            embeddings_regularizer=keras.regularizers.L2(0.1),
            name="embed",
        ),
        keras.layers.LayerNormalization(name="norm"),
    ]


class TiedLM(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__(name="tied")
        self.embed, self.norm = tied_layers()

    def call(self, ids: Any) -> Any:
        return self.embed(self.norm(self.embed(ids)), reverse=True)


def tokens() -> tuple[np.ndarray, np.ndarray]:
    ids = np.random.default_rng(1).integers(0, 12, (N, 3)).astype(np.int32)
    return ids, np.roll(ids, -1, axis=1)


@functools.cache
def tied_reference() -> tuple[list[float], list[np.ndarray]]:
    embed, norm = tied_layers()
    ids = keras.Input((3,), dtype="int32")
    model = keras.Model(ids, embed(norm(embed(ids)), reverse=True))
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
    history = model.fit(*tokens(), batch_size=B, epochs=2, shuffle=False, verbose=0)
    return history.history["loss"], model.get_weights()


def tied_penalty() -> dict[str, Any]:
    """fit with the regularized embedding tied across the 2 stages (3 nodes: any cut
    parts its calls): its penalty's gradient on both copies, its value counted once."""
    tfsift.init({"partitions": 2, "microbatches": M, "timeout": 20, "profile_repeats": 1})
    want_losses, want_weights = computed_once("tied", tied_reference)
    model = TiedLM()
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
    history = model.fit(*tokens(), batch_size=B, epochs=2, shuffle=False, verbose=0)
    losses = history.history["loss"]
    held = [v.path for v in model.trainable_variables if v.path == "embed/embeddings"]
    return {
        "tied_held": held,
        "tied_loss_error": max(abs(a - b) for a, b in zip(losses, want_losses, strict=True)),
        "tied_weights_error": error(model, want_weights),
    }


def main() -> None:
    tfsift.init({"partitions": 2, "microbatches": M, "auto_partition": False, "timeout": 20})
    # first, before anything imports tfsift.training (fit, compiled_update): Keras' own
    # apply is checked wherever a model is partitioned
    found: dict[str, Any] = {"apply_gradients": applied_eagerly()}
    found.update({f"fit_{name}": fitted(name) for name in OPTIMIZERS})
    found["loop_loss_scale"], found["variables"] = looped("loss_scale")
    found.update(regularized())
    found.update(looped_penalties())
    found["add_loss"] = add_loss_refused()
    found["output_mask"] = mask_refused()
    found["refrozen"] = refrozen()
    found.update(tied_penalty())  # last: it initialises another config
    report(rank=tfsift.rank(), stage=tfsift.mp_rank(), **found)


if __name__ == "__main__":
    main()
