"""Loaded at start-up by every rank a test launches (tests/mpi.py puts this folder first on
PYTHONPATH): keeps Keras from importing scikit-learn and matplotlib.

Keras imports both at start-up when they are installed, only for its scikit-learn wrappers
and its image-gallery plot, which tfsift never uses. That took 1.1 of the 3.3 CPU seconds
a rank spends importing TensorFlow, Keras, tfsift and Horovod, and the suite starts about
200 ranks. Keras catches the ImportError this raises for an import made from its own
modules; any other module (an example that loads scikit-learn's datasets, the CLI that
plots a timeline) imports them as usual.
"""

from __future__ import annotations

import importlib.abc
import sys
from types import FrameType
from typing import Any

SKIPPED = ("sklearn", "matplotlib")


class _KerasExtras(importlib.abc.MetaPathFinder):
    """Refuses ``SKIPPED`` (and their sub-modules) to an importer in the ``keras`` package."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name.split(".")[0] in SKIPPED and _importer().startswith("keras."):
            raise ModuleNotFoundError(f"No module named {name!r} (tests/lean_site)", name=name)
        return None  # the other finders look for it as usual


def _importer() -> str:
    """The name of the module whose import statement is running (past importlib's frames)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith(
        ("importlib", "_frozen_importlib")
    ):
        frame = frame.f_back
    return "" if frame is None else str(frame.f_globals.get("__name__", ""))


sys.meta_path.insert(0, _KerasExtras())
