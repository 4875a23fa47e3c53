"""The pinned stack works: TF 2.21, Keras 3, Horovod collectives and mpi4py across real ranks."""

from __future__ import annotations

import subprocess
import sys

import pytest

import mpi
from tfsift.version import __version__

pytestmark = pytest.mark.mpi


def test_two_ranks_run_horovod_collectives_and_mpi4py_point_to_point() -> None:
    got = mpi.reports(mpi.run(2, "toolchain_check.py", timeout=180))
    assert sorted(got) == [0, 1]
    for r in (0, 1):
        assert got[r]["tf"] == "2.21.0"
        assert got[r]["keras"].startswith("3.15.")
        assert got[r]["size"] == 2
        assert got[r]["total"] == [3.0, 20.0]
        assert got[r]["grouped"] == [[1.0], [[1.0]]]
        assert got[r]["in_set"] == [r + 1.0]
        assert got[r]["set_size"] == 1
        # tests/lean_site: Keras's optional imports refused, TensorFlow's objects frozen
        assert got[r]["skipped"] == []
        assert got[r]["gc_enabled"] and got[r]["frozen"] > 100_000
    assert got[1]["received"] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_horovod_build_lists_tensorflow_mpi_and_gloo() -> None:
    import horovod.tensorflow as hvd

    assert (hvd.mpi_built(), hvd.gloo_built()) == (True, True)


def test_console_script_prints_the_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tfsift.cli", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"tfsift {__version__}"
