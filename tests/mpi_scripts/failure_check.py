"""Rank 1 raises in its second step while rank 0 waits for its message: nobody may hang."""

from __future__ import annotations

import keras

import tfsift
from models import LOSS, MODELS, data

tfsift.init({"partitions": 2, "microbatches": 2})
model = MODELS["conv"]()


@tfsift.step
def forward_backward(images, labels):  # type: ignore[no-untyped-def]
    loss = LOSS(labels, model(images, training=True))
    return tfsift.gradients(loss, model.trainable_variables), loss


x, y = data(8)
for step in range(3):
    if step == 1 and tfsift.rank() == 1:
        raise RuntimeError("injected failure on rank 1")
    forward_backward(x, y)
keras.utils.set_random_seed(0)
