"""The examples run, shortened, so that none rots."""

from __future__ import annotations

import re

import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


def test_sift_mnist1d_trains_on_two_stages_by_two_replicas() -> None:
    proc = mpi.run(
        4, str(mpi.ROOT / "examples" / "sift_mnist1d.py"), "--samples", "2500", "--epochs", "2",
        "--batch", "32", "--delay", "2", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = re.findall(r"epoch (\d): kept ([\d.]+), loss ([\d.]+), held-out accuracy ([\d.]+)",
                       proc.stdout)  # fmt: skip
    assert [int(e) for e, *_ in lines] == [1, 2]  # printed by rank 0 only, once per epoch
    kept = [float(k) for _, k, _, _ in lines]
    assert all(0.4 < k < 0.7 for k in kept)  # beta 1 keeps about half, plus the delay
    assert float(lines[-1][3]) > 0.2  # better than chance (0.1) after two short epochs
