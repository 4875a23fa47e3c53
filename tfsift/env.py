"""Every environment variable tfsift reads, declared once."""

from __future__ import annotations

import os

#: JSON string, or path to a JSON file, read by ``tfsift.init()`` when no config is passed.
TFSIFT_CONFIG = "TFSIFT_CONFIG"


def get(name: str, default: str = "") -> str:
    """Returns the value of environment variable ``name``, or ``default``."""
    return os.environ.get(name, default)
