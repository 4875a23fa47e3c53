"""Data sifting: score candidate samples, keep the informative ones, refill full batches.

``tfsift.sift`` is both this package and the public transform function: importing any
``tfsift.sift.*`` module binds the package to the name ``sift`` on ``tfsift`` (Python
sets a parent's attribute for every sub-package it imports), which would shadow the
function. So the package itself is callable and forwards to
``tfsift.sift.transform.sift``; ``tests/tfsift/sift/test_transform.py`` pins it.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from tfsift.sift.transform import sift

        return sift(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
