"""Bad set-ups that must fail on every rank, before training, with a clear message.

usage: errors_check.py too_many_partitions|memory_cap|synchronized_bn|other_features
(run on 2 ranks)
"""

from __future__ import annotations

import sys
from typing import Any

import keras

import tfsift
from models import MODELS, data, training_step


class OneLayer(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.flatten = keras.layers.Flatten()

    def call(self, x: Any) -> Any:
        return self.flatten(x)


class SynchronizedNorm(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.norm = keras.layers.BatchNormalization(synchronized=True, name="norm")
        self.head = keras.layers.Dense(10)

    def call(self, x: Any) -> Any:
        return self.head(keras.ops.reshape(self.norm(x), (-1, 8 * 8)))


class TwoDense(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(4)
        self.b = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


if sys.argv[1] == "other_features":  # a step on 6 features, then one on 5: TensorFlow's
    tfsift.init({"partitions": 2, "microbatches": 2})  # "Matrix size-incompatible" before
    step = training_step(TwoDense())
    labels = keras.ops.zeros((8,), "int32")
    step(keras.ops.ones((8, 6)), labels)  # every stage the same data
    step(keras.ops.ones((8, 5)), labels)
    print("TRAINED", flush=True)
    sys.exit()
if sys.argv[1] == "too_many_partitions":
    tfsift.init({"partitions": 2, "microbatches": 2})
    model: tfsift.DistributedModel = OneLayer()
elif sys.argv[1] == "synchronized_bn":  # 2 data-parallel replicas
    tfsift.init({"partitions": 1, "microbatches": 2})
    model = SynchronizedNorm()
else:
    tfsift.init({"partitions": 2, "microbatches": 2, "memory_cap": "1KiB"})
    model = MODELS["conv"]()

forward_backward = training_step(model)


x, y = data(8)
forward_backward(x, y)
print("TRAINED", flush=True)
