"""Saves one small model to PATH (``tfsift.save_model``, or ``model.export`` with
``--export``) TIMES times, in one process, then prints SAVED: two of these run at once
write the same path (tests/tfsift/checkpoint/test_export.py).

usage: export_race.py PATH TIMES [--export]
"""

from __future__ import annotations

import sys
from typing import Any

import keras
import numpy as np

import tfsift


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = keras.layers.Dense(64), keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


tfsift.init({})
model = Net()
model.predict(np.ones((4, 5), np.float32), verbose=0)
for _ in range(int(sys.argv[2])):
    if "--export" in sys.argv:
        model.export(sys.argv[1], verbose=False)
    else:
        tfsift.save_model(model, sys.argv[1])
print("SAVED", flush=True)
