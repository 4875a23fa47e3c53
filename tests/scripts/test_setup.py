"""docs/install.md says what scripts/setup.sh does: its apt packages and its knobs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUP = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
INSTALL = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")


def test_install_md_lists_the_apt_packages_setup_installs() -> None:
    packages = re.search(r"^APT_PACKAGES=\((.*)\)$", SETUP, re.M)
    assert packages is not None
    row = next(line for line in INSTALL.splitlines() if line.startswith("| apt |"))
    assert re.search(r"`([^`]*)`", row)[1].split() == packages[1].split()  # type: ignore[index]


def test_install_md_names_every_knob_setup_reads() -> None:
    knobs = set(re.findall(r"\$\{(TFSIFT_\w+):-", SETUP))
    assert knobs == {"TFSIFT_PYTHON", "TFSIFT_VENV", "TFSIFT_CACHE"}
    assert all(f"`{knob}`" in INSTALL for knob in knobs)
