"""tfsift.shard: every replica gets as many elements, so every replica runs as many steps."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import mpi
import tfsift
from tfsift.parallel.arrays import ArrayDataset
from tfsift.parallel.shard import prompt_end


def test_one_replica_gets_the_whole_dataset_in_order() -> None:
    tfsift.init({})
    dataset = tfsift.shard(tf.data.Dataset.range(5))
    assert [int(v) for v in dataset] == [0, 1, 2, 3, 4]
    assert int(dataset.cardinality()) == 5


def test_batch_of_a_shard_refuses_batches_that_do_not_split_into_the_microbatches() -> None:
    tfsift.init({"microbatches": 4})
    shard = tfsift.shard(tf.data.Dataset.range(102))
    with pytest.raises(ValueError) as err:
        shard.batch(30)
    assert str(err.value) == (
        "tfsift.shard(...).batch(30): every batch a step takes splits into microbatches=4 "
        "equal parts, so B must be a multiple of 4. Received: B=30"
    )
    with pytest.raises(ValueError) as err:
        shard.batch(32)
    assert str(err.value) == (
        "tfsift.shard(...).batch(32): this shard's 102 elements end in a batch of 6, which "
        "does not split into microbatches=4, so the epoch's last step would fail. Use "
        ".batch(32, drop_remainder=True). Received: 102 elements, B=32"
    )
    assert [len(b) for b in shard.batch(32, drop_remainder=True)] == [32, 32, 32]
    # 100 = 3 x 32 + 4, and 4 splits into 4
    assert [len(b) for b in tfsift.shard(tf.data.Dataset.range(100)).batch(32)] == [32] * 3 + [4]
    # the check is on the shard's own batch: what it returns is an ordinary dataset
    assert "batch" not in vars(shard.batch(32, drop_remainder=True))


def test_a_shard_of_unknown_size_or_one_microbatch_is_batched_unchecked() -> None:
    tfsift.init({"microbatches": 4})
    unknown = tfsift.shard(tf.data.Dataset.range(10).filter(lambda v: v < 7))
    assert [len(b) for b in unknown.batch(4)] == [4, 3]  # the step will say so
    tfsift.init({"microbatches": 1})
    assert [len(b) for b in tfsift.shard(tf.data.Dataset.range(10)).batch(3)] == [3, 3, 3, 1]


def test_a_shard_ends_its_epochs_without_the_autotuner_unless_the_user_set_it() -> None:
    tfsift.init({})
    assert tfsift.shard(tf.data.Dataset.range(4)).options().autotune.enabled is False
    # the options reach the user's own transformations of the shard
    batched = tfsift.shard(tf.data.Dataset.range(4)).batch(2).prefetch(tf.data.AUTOTUNE)
    assert batched.options().autotune.enabled is False
    on = tf.data.Options()
    on.autotune.enabled = True
    assert tfsift.shard(tf.data.Dataset.range(4).with_options(on)).options().autotune.enabled
    assert batched.with_options(on).options().autotune.enabled  # set after: on again


def test_prompt_end_leaves_python_datasets_and_explicit_options_alone() -> None:
    tfsift.init({})
    arrays = ArrayDataset((np.arange(4.0),), 2, False, 0, "test")
    assert prompt_end(arrays) is arrays  # iterated in Python: no tf.data iterator
    off = tf.data.Options()
    off.autotune.enabled = False
    explicit = tf.data.Dataset.range(3).with_options(off)
    assert prompt_end(explicit) is explicit
    assert prompt_end(tf.data.Dataset.range(3)).options().autotune.enabled is False


ON_2X2 = mpi.CLUSTER_2X2.scenario("uneven_check.py", "shard", "2", timeout=120)


@pytest.mark.mpi
@pytest.mark.slow
@mpi.CLUSTER_2X2.mark
def test_uneven_data_gives_every_replica_as_many_steps_and_the_loop_ends() -> None:
    got = ON_2X2()
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


def test_what_is_not_a_dataset_is_refused_naming_what_to_pass() -> None:
    # arrays passed as they are: Python's AttributeError ('tuple' object has no attribute
    # 'cardinality') before
    tfsift.init({})
    x, y = np.zeros((4, 2), np.float32), np.zeros(4, np.int64)
    with pytest.raises(TypeError) as err:
        tfsift.shard((x, y))  # type: ignore[arg-type]
    assert str(err.value) == (
        "tfsift.shard deals a tf.data.Dataset of samples to the replicas (for arrays: "
        "tfsift.shard(tf.data.Dataset.from_tensor_slices((x, y))), or "
        "tfsift.from_arrays((x, y), batch_size)). Received: tuple"
    )


def test_a_batch_larger_than_the_shard_with_drop_remainder_is_refused() -> None:
    # every epoch yielded no batch, and a loop over it trained nothing, without a word
    tfsift.init({})
    with pytest.raises(ValueError) as err:
        tfsift.shard(tf.data.Dataset.range(10)).batch(12, drop_remainder=True)
    assert str(err.value) == (
        "tfsift.shard(...).batch(12, drop_remainder=True): this shard has 10 elements, fewer "
        "than one batch, so every epoch over it would yield no batch and train nothing. Use a "
        "smaller batch. Received: 10 elements, B=12"
    )
    assert len(list(tfsift.shard(tf.data.Dataset.range(10)).batch(12))) == 1
