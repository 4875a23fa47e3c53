"""The process-wide random generators a training script may draw from: Python's and NumPy's.

Keras layers draw from their own ``SeedGenerator``s, whose states are variables saved
with the weights; sifting seeds its draws by round. What remains is the global state of
``random`` and ``np.random`` (``keras.utils.set_random_seed`` seeds both).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np


def capture() -> dict[str, Any]:
    """This process's global generator states (tuples of numbers and NumPy arrays)."""
    return {"python": random.getstate(), "numpy": np.random.get_state()}


def restore(state: dict[str, Any]) -> None:
    """Puts back what ``capture`` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
