"""Loads one of ``scripts/`` as a module, for the tests of its pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load(name: str) -> ModuleType:
    """``scripts/<name>.py``, imported as the module ``name``, with ``scripts/`` on the
    path as when the script runs (its harness, ``bench``, and its sibling scripts)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def prose(section: str) -> list[str]:
    """The lines of a benchmark's rendered docs section that are neither a table row, a
    heading, an image nor its provenance line: a benchmark renders tables, and the docs
    say the rest by hand."""
    kinds = ("|", "### ", "![", "Measured ")
    return [line for line in section.splitlines() if line and not line.startswith(kinds)]
