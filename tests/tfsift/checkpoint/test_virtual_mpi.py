"""Under mpirun: checkpoints restore across virtual stages (weights keyed by layer path)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

WHERE = Path(tempfile.mkdtemp(prefix="tfsift-virtual-"))  # the runs' checkpoints
atexit.register(shutil.rmtree, WHERE, True)
# a job of 2 stages: it runs beside the other scenarios of that layout (tests/mpi.py)
RUNS = mpi.TWO_STAGES.scenario("checkpoint_virtual.py", str(WHERE), timeout=480)


def merged(got: dict[int, Any], run: str, when: str) -> dict[str, Any]:
    """The optimizer variables of every rank of ``run`` at ``when``, by key."""
    found: dict[str, Any] = {}
    for rank in sorted(got):
        found.update(got[rank][run][when]["optimizer"])
    return found


def same(a: dict[str, Any], b: dict[str, Any], when: str = "weights") -> None:
    """Bitwise equal whole-model weights (``when="weights"``) or optimizer variables."""
    if when == "weights":
        assert len(a["weights"]) == len(b["weights"])
        for x, y in zip(a["weights"], b["weights"], strict=True):
            np.testing.assert_array_equal(np.array(x), np.array(y))
    else:
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(np.array(a[key]), np.array(b[key]), err_msg=key)


@mpi.TWO_STAGES.mark
def test_a_checkpoint_on_virtual_stages_restores_on_one_chunk_a_stage_and_back() -> None:
    got = RUNS()
    for rank in (0, 1):
        runs = got[rank]
        assert [runs[r]["chunks"] for r in "abcd"] == [[rank, rank + 2], [rank, rank + 2],
                                                       [rank], [rank, rank + 2]]  # fmt: skip
        assert [runs[r]["first"] for r in "abcd"] == [None, 2, 2, 3]
        # B (2 x 2 chunks again) and C (one chunk a stage) take what A saved after step 1
        same(runs["a"]["saved"], runs["b"]["restored"])
        same(runs["a"]["saved"], runs["c"]["restored"])
        # and compute A's step 2: the same loss (dropout's seed states are weights too)
        assert runs["b"]["losses"] == runs["c"]["losses"] == runs["a"]["losses"][2:]
        # D (2 x 2 chunks) takes what C (one chunk a stage) saved after its step 2
        same(runs["c"]["saved"], runs["d"]["restored"])
        for x, y in zip(runs["a"]["end"]["weights"], runs["c"]["end"]["weights"], strict=True):
            np.testing.assert_allclose(np.array(x), np.array(y), rtol=1e-6, atol=1e-7)
    for earlier, later in (("a", "b"), ("a", "c")):
        same(merged(got, earlier, "saved"), merged(got, later, "restored"), "optimizer")
    same(merged(got, "c", "saved"), merged(got, "d", "restored"), "optimizer")
    # every stage's optimizer variables, whichever chunks held them
    assert merged(got, "a", "saved").keys() == merged(got, "c", "saved").keys()
