"""tfsift.shard: every replica gets as many elements, so every replica runs as many steps."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import tensorflow as tf

import mpi
import tfsift


def test_one_replica_gets_the_whole_dataset_in_order() -> None:
    tfsift.init({})
    dataset = tfsift.shard(tf.data.Dataset.range(5))
    assert [int(v) for v in dataset] == [0, 1, 2, 3, 4]
    assert int(dataset.cardinality()) == 5


@pytest.mark.mpi
@pytest.mark.slow
def test_uneven_data_gives_every_replica_as_many_steps_and_the_loop_ends() -> None:
    start = time.monotonic()
    got = mpi.reports(mpi.run(4, "uneven_check.py", "shard", "2", timeout=120))
    print(f"4 ranks, 2 epochs of uneven data: {time.monotonic() - start:.1f} s")
    assert sorted(got) == [0, 1, 2, 3]
    for rank, data in got.items():
        # 255 = 128 + 127 samples: 3 batches of 32 each (not 4 and 3); 191 = 96 + 95
        # filtered samples: 2 each (not 3 and 2); 127, 95 elements; a repeat() is endless
        assert (len(data["known"]), len(data["unknown"])) == (3, 2), (rank, data)
        assert data["elements"] == [127, 95, 200], (rank, data)
    for pipeline in ([0, 1], [2, 3]):  # the stages of a pipeline see the same batches
        assert got[pipeline[0]]["known"] == got[pipeline[1]]["known"]
        assert got[pipeline[0]]["unknown"] == got[pipeline[1]]["unknown"]
    assert got[0]["known"] != got[2]["known"]  # the replicas see different samples


@pytest.mark.mpi
@pytest.mark.fault
def test_data_sharded_by_hand_unevenly_ends_the_job_when_a_replica_runs_out() -> None:
    proc = mpi.run(
        2, "uneven_check.py", "by_hand", "1", timeout=120, env={"TFSIFT_EXIT_GRACE": "3"}
    )
    ended = time.time()
    short = json.loads((Path(proc.reports_dir) / "rank1.json").read_text())
    print(
        f"replica 1 ran out of data after 3 batches: job ended {ended - short['left']:.1f} s later"
    )
    assert proc.returncode != 0
    assert short["known"] and len(short["known"]) == 3  # 127 samples; replica 0 has 128: 4
    assert "tfsift: rank 1 exited (sys.exit() or the end of the script) while other" in proc.stderr
    assert ended - short["left"] < 3 + 15
