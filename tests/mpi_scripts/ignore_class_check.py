"""Every rank: a token model trained by ``fit`` and measured by ``evaluate`` with
``SparseCategoricalCrossentropy(ignore_class=-1)``, the ignored targets spread unevenly
over the microbatches, sample weights, and a last batch that does not split into them;
against one process's Keras on the same samples (each step on every replica's batch).

usage: ignore_class_check.py K    (partitions; the world's other factor is replicas)
"""

from __future__ import annotations

import sys
from typing import Any

import keras
import numpy as np

import tfsift
from mpi import computed_once, report

N, T, B, M = 22, 6, 4, 2  # samples, tokens, each replica's batch, microbatches
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1)


def layers() -> list[keras.layers.Layer]:
    return [
        keras.layers.Embedding(
            20, 8, embeddings_initializer=keras.initializers.RandomNormal(seed=1)
        ),
        keras.layers.Dense(8, "tanh", kernel_initializer=keras.initializers.GlorotUniform(2)),
        keras.layers.Dense(5, kernel_initializer=keras.initializers.GlorotUniform(3)),
    ]


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = layers()

    def call(self, x: Any) -> Any:
        return self.c(self.b(self.a(x)))


def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.integers(1, 20, (N, T)).astype(np.int32)
    y = rng.integers(0, 5, (N, T)).astype(np.int32)
    y[::3, 1:] = -1  # every third sample mostly ignored: microbatches count unevenly
    return x, y, rng.uniform(0.5, 1.5, (N, T)).astype(np.float32)  # per token: Keras fails (N,)


def run(model: keras.Model, batch: int) -> dict[str, Any]:
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
    x, y, w = data()
    before = model.evaluate(x, y, sample_weight=w, batch_size=batch, verbose=0)
    history = model.fit(x, y, sample_weight=w, batch_size=batch, shuffle=False, verbose=0)
    return {"evaluate": before, "loss": history.history["loss"][0], "weights": model.get_weights()}


def reference(R: int) -> dict[str, Any]:
    """Keras in one process, each step on the R replicas' batches (replica r takes every
    R-th sample: the same samples, in another order)."""
    return run(keras.Sequential([keras.Input((T,), dtype="int32"), *layers()]), B * R)


def main() -> None:
    tfsift.init({"partitions": int(sys.argv[1]), "microbatches": M, "profile_repeats": 1})
    R = tfsift.dp_size()
    want = computed_once(f"ignore-class-{R}", lambda: reference(R))
    got = run(Net(), B)
    error = max(
        float(np.max(np.abs(a - b))) for a, b in zip(got["weights"], want["weights"], strict=True)
    )
    report(
        rank=tfsift.rank(),
        weights=error,
        evaluate=[got["evaluate"], want["evaluate"]],
        loss=[got["loss"], want["loss"]],
    )


if __name__ == "__main__":
    main()
