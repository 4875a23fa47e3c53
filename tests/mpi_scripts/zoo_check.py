"""Every rank: realistic models pipelined, against the full model run per microbatch.

usage: zoo_check.py K MODELS PIPELINES OPTIMIZES [COVER]
       (comma-separated lists, a pipeline with virtual stages reads ``interleaved/2``; M = 2;
       COVER "all" (default) or "pairs": see ``models.grid``)

The reference runs before partitioning, on the whole model, one microbatch after the
other (as the pipeline does), so BatchNormalization statistics and dropout masks
follow the same sequence; every variable is then put back to its initial value and
seed state, and one pipelined step must give the same gradients (by variable path),
loss, and non-trainable state (BatchNorm moving statistics).
"""

from __future__ import annotations

import sys
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift
from models import grid, schedule
from mpi import report

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
M, BATCH = 2, 8


class ResNetBN(tfsift.DistributedModel):
    """Two conv + BatchNorm layers with a skip connection around the second."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = keras.layers.Conv2D(4, 3, padding="same")
        self.bn1 = keras.layers.BatchNormalization()
        self.conv2 = keras.layers.Conv2D(4, 3, padding="same")
        self.bn2 = keras.layers.BatchNormalization()
        self.flatten = keras.layers.Flatten()
        self.out = keras.layers.Dense(10)

    def call(self, x: Any) -> Any:
        h = keras.ops.relu(self.bn1(self.conv1(x)))
        h = keras.ops.relu(keras.ops.add(h, self.bn2(self.conv2(h))))
        return self.out(self.flatten(h))


class Encoder(tfsift.DistributedModel):
    """A transformer encoder block: attention and feed-forward with residuals and LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = keras.layers.Dense(16)
        self.attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)
        self.norm1 = keras.layers.LayerNormalization()
        self.ff1 = keras.layers.Dense(32, activation="relu")
        self.ff2 = keras.layers.Dense(16)
        self.norm2 = keras.layers.LayerNormalization()
        self.pool = keras.layers.GlobalAveragePooling1D()
        self.out = keras.layers.Dense(10)

    def call(self, x: Any) -> Any:
        h = self.embed(keras.ops.reshape(x, (-1, 8, 8)))
        h = self.norm1(keras.ops.add(h, self.attention(h, h)))
        h = self.norm2(keras.ops.add(h, self.ff2(self.ff1(h))))
        return self.out(self.pool(h))


class AttentionBlock(keras.layers.Layer):
    """Attention and feed-forward with residuals, one node of the graph: its attention reads
    the mask of the block's input from the tensor itself, not from an argument."""

    def __init__(self) -> None:
        super().__init__()
        self.supports_masking = True
        self.attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)
        self.norm = keras.layers.LayerNormalization()
        self.ff = keras.layers.Dense(16, activation="relu")

    def call(self, x: Any) -> Any:
        x = self.norm(keras.ops.add(x, self.attention(x, x)))
        return keras.ops.add(x, self.ff(x))


class MaskedAttention(tfsift.DistributedModel):
    """Padded time steps (rows of zeros, masked by Masking) through two attention blocks
    and a pooling that skips them: a block's input that crosses a cut (or, split into B
    and W, a node's call) must carry its mask."""

    def __init__(self) -> None:
        super().__init__()
        self.masking = keras.layers.Masking(0.0)
        self.embed = keras.layers.Dense(16)
        self.block1, self.block2 = AttentionBlock(), AttentionBlock()
        self.pool = keras.layers.GlobalAveragePooling1D()
        self.out = keras.layers.Dense(10)

    def call(self, x: Any) -> Any:
        rows = keras.ops.reshape(x, (-1, 8, 8))
        rows = keras.ops.where(rows[:, :, :1] > 0.4, 0.0, rows)  # about a third: padding
        h = self.block2(self.block1(self.embed(self.masking(rows))))
        return self.out(self.pool(h))


class Block(keras.layers.Layer):
    """A custom layer that owns two sub-layers."""

    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(16, activation="relu")
        self.b = keras.layers.Dense(16)

    def call(self, x: Any) -> Any:
        return keras.ops.add(x, self.b(self.a(x)))


class CustomLayers(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.flatten = keras.layers.Flatten()
        self.proj = keras.layers.Dense(16)
        self.block1, self.block2 = Block(), Block()
        self.out = keras.layers.Dense(10)

    def call(self, x: Any) -> Any:
        return self.out(self.block2(self.block1(self.proj(self.flatten(x)))))


class Recurrent(tfsift.DistributedModel):
    """A GRU over the rows, then an LSTM, then a dense classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = keras.layers.GRU(12, return_sequences=True)
        self.lstm = keras.layers.LSTM(12)
        self.out = keras.layers.Dense(10)

    def call(self, x: Any) -> Any:
        return self.out(self.lstm(self.gru(keras.ops.reshape(x, (-1, 8, 8)))))


class SequentialBlock(tfsift.DistributedModel):
    """A keras.Sequential used as one block, with dropout inside: traced through, its layers
    are nodes of the graph, which a cut may fall between."""

    def __init__(self) -> None:
        super().__init__()
        self.flatten = keras.layers.Flatten()
        self.body = keras.Sequential(
            [
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dropout(0.3),
                keras.layers.Dense(16, activation="relu"),
            ]
        )
        self.out = keras.layers.Dense(10)

    def call(self, x: Any) -> Any:
        return self.out(self.body(self.flatten(x)))


class Shared(tfsift.DistributedModel):
    """One Dense layer called at two depths (tied weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.flatten = keras.layers.Flatten()
        self.inp = keras.layers.Dense(16, activation="relu")
        self.tied = keras.layers.Dense(16, activation="relu")
        self.mid = keras.layers.Dense(16, activation="relu")
        self.out = keras.layers.Dense(10)

    def call(self, x: Any) -> Any:
        h = self.tied(self.inp(self.flatten(x)))
        return self.out(self.tied(self.mid(h)))


ZOO = {
    "resnet_bn": ResNetBN,
    "encoder": Encoder,
    "masked": MaskedAttention,
    "custom": CustomLayers,
    "recurrent": Recurrent,
    "sequential": SequentialBlock,
    "shared": Shared,
}


def data() -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, 8, 8, 1)).astype("float32")
    return tf.constant(x), tf.constant(rng.integers(0, 10, BATCH).astype("int32"))


def reference(model: Any, x: tf.Tensor, y: tf.Tensor) -> tuple[dict[str, Any], ...]:
    """Per-microbatch tape on the whole model; returns (grads, state after, initial values)."""
    inputs = keras.Input(x.shape[1:])
    functional = keras.Model(inputs, model.call(inputs))  # passes `training` to every layer
    initial = {v.path: v.numpy() for v in model.variables}
    grads: dict[str, list[np.ndarray]] = {}
    losses = []
    for xs, ys in zip(tf.split(x, M), tf.split(y, M), strict=True):
        with tf.GradientTape() as tape:
            loss = LOSS(ys, functional(xs, training=True))
        for v, g in zip(
            model.trainable_variables, tape.gradient(loss, model.trainable_variables), strict=True
        ):
            grads.setdefault(v.path, []).append(np.asarray(g))
        losses.append(float(loss))
    after = {v.path: v.numpy() for v in model.non_trainable_variables}
    for v in model.variables:
        v.assign(initial[v.path])
    mean = {path: np.mean(gs, axis=0) for path, gs in grads.items()}
    return mean, after, {"loss": float(np.mean(losses))}


def check(name: str, K: int, pipeline: str, optimize: str) -> dict[str, Any]:
    tfsift.init(
        {
            "partitions": K,
            "microbatches": M,
            **schedule(pipeline),
            "optimize": optimize,
            "profile_repeats": 1,
        }
    )
    keras.utils.set_random_seed(7)
    model = ZOO[name]()
    x, y = data()
    want, state_after, ref = reference(model, x, y)

    @tfsift.step
    def train(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = LOSS(labels, model(images, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    config = f"K={K} {pipeline} {optimize}"
    try:
        grads, loss = train(x, y)
    except ValueError as err:
        return {"model": name, "config": config, "error": str(err)}
    grad_errors = [
        rel_error(g.accumulate().numpy(), want[v.path])
        for g, v in zip(grads, model.trainable_variables, strict=True)
    ]
    state_errors = [
        rel_error(v.numpy(), state_after[v.path])
        for v in model.non_trainable_variables
        if "seed" not in v.path
    ]
    return {
        "model": name,
        "config": config,
        "grad_error": max(grad_errors, default=0.0),
        "state_error": max(state_errors, default=0.0),
        "states": len(state_errors),
        "num_grads": len(grads),
        "copies": sum(not mine for mine in model.partitioned.tied.counted),
        "chunks": [s.index for s in model.partitioned.stage.stages],
        "layers": sorted(  # the kinds of layer the traced graph's nodes run
            {type(gn.node.operation).__name__ for gn in model.partitioned.graph.nodes}
        ),
        "tied_stages": [list(g.stages) for g in model.partitioned.tied.groups],
        "total_grads": len(want),
        "loss": float(loss.reduce_mean()),
        "ref_loss": ref["loss"],
    }


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    # floored: a bias in front of BatchNorm (or attention's key bias) has a true gradient of
    # zero, and its computed one is float noise (~3e-7): below a norm of 0.1, absolute
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 0.1))


def main() -> None:
    K = int(sys.argv[1])
    lists = [arg.split(",") for arg in sys.argv[2:5]]
    cover = sys.argv[5] if len(sys.argv) > 5 else "all"
    results = [check(n, K, p, o) for n, p, o in grid(lists, cover)]
    report(rank=tfsift.rank(), results=results)


if __name__ == "__main__":
    main()
