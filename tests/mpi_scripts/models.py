"""Small DistributedModels used by the multi-process tests, and their single-process reference."""

from __future__ import annotations

import itertools
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift


class ConvNet(tfsift.DistributedModel):
    """The model of the README: conv, flatten, two dense layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = keras.layers.Conv2D(4, 3, activation="relu")
        self.flatten = keras.layers.Flatten()
        self.dense1 = keras.layers.Dense(16, activation="relu")
        self.dense2 = keras.layers.Dense(10)

    def call(self, x: Any) -> Any:
        return self.dense2(self.dense1(self.flatten(self.conv(x))))


class SkipNet(tfsift.DistributedModel):
    """A skip connection from d1 to the add jumps over d2 and d3, so it crosses cuts."""

    def __init__(self) -> None:
        super().__init__()
        self.d1 = keras.layers.Dense(12, activation="tanh")
        self.d2 = keras.layers.Dense(12, activation="relu")
        self.d3 = keras.layers.Dense(12)
        self.d4 = keras.layers.Dense(10)

    def call(self, x: Any) -> Any:
        h = self.d1(keras.ops.reshape(x, (-1, 64)))
        return self.d4(keras.ops.add(h, self.d3(self.d2(h))))


class DropoutNet(tfsift.DistributedModel):
    """Dropout between dense layers: recomputation must reproduce its masks."""

    def __init__(self) -> None:
        super().__init__()
        self.flatten = keras.layers.Flatten()
        self.d1 = keras.layers.Dense(24, activation="relu")
        self.drop1 = keras.layers.Dropout(0.3)
        self.d2 = keras.layers.Dense(24, activation="relu")
        self.drop2 = keras.layers.Dropout(0.3)
        self.d3 = keras.layers.Dense(10)

    def call(self, x: Any) -> Any:
        return self.d3(self.drop2(self.d2(self.drop1(self.d1(self.flatten(x))))))


class OpsNet(tfsift.DistributedModel):
    """``keras.ops`` between layers: tanh, a product of two branches, a mean."""

    def __init__(self) -> None:
        super().__init__()
        self.flatten = keras.layers.Flatten()
        self.a = keras.layers.Dense(16)
        self.b = keras.layers.Dense(16)
        self.out = keras.layers.Dense(10)

    def call(self, x: Any) -> Any:
        h = keras.ops.tanh(self.flatten(x))
        g = keras.ops.multiply(self.a(h), keras.ops.sigmoid(self.b(h)))
        return self.out(g - keras.ops.mean(g, axis=-1, keepdims=True))


MODELS = {"conv": ConvNet, "skip": SkipNet, "dropout": DropoutNet, "ops": OpsNet}
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def training_step(model: tfsift.DistributedModel) -> Any:
    """The README's forward/backward step for ``model``: (gradients, loss)."""

    @tfsift.step
    def forward_backward(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = LOSS(labels, model(images, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    return forward_backward


def data(batch: int, seed: int = 0) -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 10, size=(batch,)).astype("int32")
    return tf.constant(x), tf.constant(y)


def layer_attrs(model: keras.Model) -> dict[str, keras.layers.Layer]:
    return {k: v for k, v in vars(model).items() if isinstance(v, keras.layers.Layer)}


def reference(
    name: str, x: tf.Tensor, y: tf.Tensor, microbatches: int, seed: int
) -> tuple[Any, ...]:
    """One process, no tfsift: the full batch at once (per microbatch for dropout masks)."""
    keras.utils.set_random_seed(seed)
    model = MODELS[name]()
    inputs = keras.Input(x.shape[1:])
    functional = keras.Model(inputs, model.call(inputs))  # passes `training` to every layer
    init = {id(v): v.numpy() for v in model.variables}
    parts = microbatches if name == "dropout" else 1
    grads, losses = [], []
    for xs, ys in zip(tf.split(x, parts), tf.split(y, parts), strict=True):
        with tf.GradientTape() as tape:
            loss = LOSS(ys, functional(xs, training=True))
        grads.append(tape.gradient(loss, model.trainable_variables))
        losses.append(float(loss))
    mean = [np.mean([g[i].numpy() for g in grads], axis=0) for i in range(len(grads[0]))]
    return model, init, mean, float(np.mean(losses))


def copy_stage_weights(src: keras.Model, init: dict[int, np.ndarray], dst: keras.Model) -> None:
    """Gives dst's stage layers the reference's initial weights (and dropout seed states)."""
    kept = {id(v) for v in dst.variables}
    for attr, layer in layer_attrs(dst).items():
        ref = layer_attrs(src)[attr]
        for mine, theirs in zip(layer.variables, ref.variables, strict=True):
            if id(mine) in kept:
                mine.assign(init[id(theirs)])


def gradient_map(src: keras.Model, dst: keras.Model) -> list[int]:
    """For each of dst's trainable variables, its index in src.trainable_variables."""
    index = {id(v): i for i, v in enumerate(src.trainable_variables)}
    out = []
    owner = {
        id(v): (a, j)
        for a, layer in layer_attrs(dst).items()
        for j, v in enumerate(layer.trainable_variables)
    }
    for var in dst.trainable_variables:
        attr, j = owner[id(var)]
        out.append(index[id(layer_attrs(src)[attr].trainable_variables[j])])
    return out


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-12))


def schedule(token: str) -> dict[str, Any]:
    """A script argument's schedule as config values: ``interleaved``, with virtual
    stages ``interleaved/2`` (``virtual_stages=2``), with a memory cap ``zero_bubble@1GB``
    (``memory_cap="1GB"``: room for ZB-H1's deferral)."""
    token, _, cap = token.partition("@")
    pipeline, _, v = token.partition("/")
    return {
        "pipeline": pipeline,
        **({"virtual_stages": int(v)} if v else {}),
        **({"memory_cap": cap} if cap else {}),
    }


def grid(lists: list[list[str]], cover: str = "all") -> list[tuple[str, ...]]:
    """Every combination of one value from each list, or with ``cover="pairs"`` those whose
    value indices sum to an even number: about half, and still every pair of values from two
    lists, where a third list has two values or more (its value's parity completes the sum).
    A config's traces are most of its seconds in a job; the pairs are where a model, a
    schedule, M and an optimize mode interact."""
    combos = itertools.product(*(enumerate(values) for values in lists))
    return [
        tuple(v for _, v in combo)
        for combo in combos
        if cover == "all" or sum(i for i, _ in combo) % 2 == 0
    ]
