"""Loaded at start-up by every rank a test launches (tests/mpi.py puts this folder first on
PYTHONPATH): keeps Keras from importing scikit-learn and matplotlib, and keeps Python's
cyclic garbage collector off the objects that importing TensorFlow makes.

Keras imports both at start-up when they are installed, only for its scikit-learn wrappers
and its image-gallery plot, which tfsift never uses. That took 1.1 of the 3.3 CPU seconds
a rank spent importing TensorFlow, Keras, tfsift and Horovod (before the freeze below), in
every rank the suite starts. Keras catches the ImportError this raises for an import made
from its own modules; any other module (an example that loads scikit-learn's datasets, the
CLI that plots a timeline) imports them as usual.

Importing TensorFlow makes about 450,000 objects that live as long as the process, and the
collector went over all of them again and again: during the import (its full collections
as the heap grew), and once more when the process ended. A rank that imported TensorFlow,
Keras, Horovod and tfsift and built a layer took 5.0 to 5.2 CPU seconds from start to
exit, and 3.0 to 3.2 with the collector off during TensorFlow's import and those objects
frozen after it (``gc.freeze``: the collector skips them from then on; they are freed as
ever when nothing refers to them). Objects made later, by the test itself, are collected
as usual.
"""

from __future__ import annotations

import gc
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
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


class _FrozenTensorFlow(importlib.abc.MetaPathFinder):
    """Imports ``tensorflow`` with the collector off, then freezes what the import made."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once: the other finders find it as usual
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader.exec_module = _frozen_after(spec.loader.exec_module)  # type: ignore[method-assign,assignment]
        return spec


def _frozen_after(exec_module: Callable[[Any], None]) -> Callable[[Any], None]:
    def run(module: Any) -> None:
        enabled = gc.isenabled()
        gc.disable()
        try:
            exec_module(module)
        finally:
            gc.freeze()
            if enabled:
                gc.enable()

    return run


sys.meta_path.insert(0, _KerasExtras())
sys.meta_path.insert(0, _FrozenTensorFlow())
