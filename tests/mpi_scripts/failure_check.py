"""Rank 1 raises in its second step while rank 0 waits for its message: nobody may hang."""

from __future__ import annotations

import keras

import tfsift
from models import MODELS, data, training_step

tfsift.init({"partitions": 2, "microbatches": 2})
model = MODELS["conv"]()

forward_backward = training_step(model)


x, y = data(8)
for step in range(3):
    if step == 1 and tfsift.rank() == 1:
        raise RuntimeError("injected failure on rank 1")
    forward_backward(x, y)
keras.utils.set_random_seed(0)
