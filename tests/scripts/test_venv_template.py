"""scripts/venv_template.sh: a venv kept in the cache and linked into a fresh checkout."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "venv_template.sh"


def bash(*commands: str) -> subprocess.CompletedProcess[str]:
    script = f"set -euo pipefail; source {SCRIPT}; " + "; ".join(commands)
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)


def fake_venv(path: Path) -> None:
    """What the functions read of a venv: console scripts naming it, pyvenv.cfg, a stamp,
    the interpreter (a link) and the installed packages."""
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "tool").write_text(f"#!{path}/bin/python\nimport tool\n")
    (path / "bin" / "tool").chmod(0o755)
    (path / "bin" / "python").symlink_to("/usr/bin/python3")
    (path / "pyvenv.cfg").write_text(f"home = /usr/bin\ncommand = python -m venv {path}\n")
    (path / ".tfsift-stack").write_text("stack\n")
    (path / "lib").mkdir()
    (path / "lib" / "module.py").write_text("VALUE = 1\n")


def test_a_kept_venv_links_into_a_checkout_naming_it_and_shares_its_files(
    tmp_path: Path,
) -> None:
    made, template, linked = tmp_path / "made", tmp_path / "cache" / "abc", tmp_path / "ck"
    fake_venv(made)
    assert bash(f"venv_keep {made} {template}").returncode == 0
    assert bash(f"venv_link {template} {linked}").returncode == 0
    assert (linked / "bin" / "tool").read_text() == f"#!{linked}/bin/python\nimport tool\n"
    assert os.access(linked / "bin" / "tool", os.X_OK)
    assert f"venv {linked}\n" in (linked / "pyvenv.cfg").read_text()
    assert os.readlink(linked / "bin" / "python") == "/usr/bin/python3"
    # the packages are the template's files, not copies; the rewritten ones are the venv's own
    for name in ("lib/module.py", ".tfsift-stack"):
        assert (linked / name).stat().st_ino == (template / name).stat().st_ino, name
    assert (template / "bin" / "tool").read_text() == f"#!{template}/bin/python\nimport tool\n"
    assert (made / "bin" / "tool").read_text() == f"#!{made}/bin/python\nimport tool\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "ck", "made"]  # no leftovers


def test_linking_fails_and_leaves_nothing_without_a_complete_template(tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    fake_venv(partial)
    (partial / ".tfsift-stack").unlink()  # an install cut short never wrote its stamp
    assert bash(f"venv_link {partial} {tmp_path / 'ck'}").returncode == 1
    assert bash(f"venv_link {tmp_path / 'absent'} {tmp_path / 'ck'}").returncode == 1
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_keeping_a_template_keeps_the_newest_other_one_only(tmp_path: Path, keep: int) -> None:
    made, cache = tmp_path / "made", tmp_path / "cache"
    fake_venv(made)
    for k in range(keep):
        assert bash(f"venv_keep {made} {cache / str(k)}").returncode == 0
    assert bash(f"venv_keep {made} {cache / str(keep - 1)}").returncode == 1  # kept already
    assert sorted(p.name for p in cache.iterdir()) == [str(k) for k in range(keep)][-2:]
