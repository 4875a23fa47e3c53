"""fit under real mpirun: 2 stages, and 2 replicas; the same History on every rank and the
README loop's weights; Keras' callbacks and tfsift's BackupAndRestore across ranks, a
resume after kill -9 included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


JOBS = {K: job.scenario("fit_check.py", str(K), timeout=120) for K, job in
        ((2, mpi.TWO_STAGES), (1, mpi.TWO_REPLICAS))}  # fmt: skip


@pytest.mark.parametrize(
    "K",
    [
        pytest.param(2, id="2_stages", marks=mpi.TWO_STAGES.mark),
        pytest.param(1, id="2_replicas", marks=mpi.TWO_REPLICAS.mark),
    ],
)
def test_fit_equals_the_step_loop_with_one_history_on_every_rank(K: int) -> None:
    reports = JOBS[K]()
    assert sorted(reports) == [0, 1]
    first = reports[0]
    assert sorted(first["history"]) == [
        "accuracy",
        "learning_rate",
        "loss",
        "val_accuracy",
        "val_loss",
    ]
    assert first["history"]["learning_rate"] == pytest.approx([0.05, 0.025, 0.05 / 3])
    for rep in reports.values():
        assert rep["history"] == first["history"]  # bitwise: the same floats
        assert rep["evaluated"] == first["evaluated"]
        assert rep["max_weight_diff"] == 0.0
        assert rep["variables"] > 0
        assert rep["early_stopped_epochs"] == 2
        assert rep["sifted"] == first["sifted"]  # fit(sift=...): one History too
        assert rep["kept_fraction"] == 0.5
    assert first["history"]["loss"][-1] < first["history"]["loss"][0]
    assert len(first["sifted"]["loss"]) == 2
    assert first["sifted"]["sift_kept"] == [0.5, 0.5]  # each epoch's, over the replicas
    if K == 2:  # one pipeline: both stages return the last stage's predictions
        np.testing.assert_array_equal(reports[0]["predicted"], reports[1]["predicted"])
        assert {r["stage"] for r in reports.values()} == {0, 1}
    else:  # two replicas: each predicts its own half of the data
        assert len(reports[0]["predicted"]) == len(reports[1]["predicted"])
    # Keras' progress and EarlyStopping's message, on rank 0 only (two fits stop early)
    printed = reports[0]["printed"]
    assert "loss:" in printed and printed.count("Epoch 1/3") == 1
    assert printed.count("Epoch 2: early stopping") == 2
    assert "Epoch" not in reports[1]["printed"]
    check_callbacks(reports)
    check_stopped_alone(reports, per_epoch=128 // 16 // (2 // K))
    for rep in reports.values():  # histograms of 2 replicas' weights: rank 0 holds them all
        assert rep["stopped_alone"]["histograms"] == (
            1
            if K == 1
            else "keras.callbacks.TensorBoard(histogram_freq=...) logs every "
            "layer's weights from rank 0, which holds only stage 0's on a pipeline of 2 stages. "
            "Pass histogram_freq=0 (the metrics still log), or log weights in a callback of "
            "your own from model.get_weights(), which every rank calls. Received: "
            "histogram_freq=1, partitions=2"
        )
        assert rep["stopped_alone"]["other_lengths"] == (
            "fit was given data of another length on some ranks: every replica must train as "
            "many batches an epoch (each step averages every replica's gradients), and the "
            "ranks of a pipeline the same batches. Shard with tfsift.shard(dataset), which "
            "gives every replica as many, or pass steps_per_epoch no larger than the shortest. "
            "Received: batches an epoch: 2 on rank 0; 3 on rank 1"
        )
        assert rep["stopped_alone"]["embeddings"].startswith(
            "keras.callbacks.TensorBoard(embeddings_freq=...) saves the model's weights from "
        ) and rep["stopped_alone"]["embeddings"].endswith("Received: embeddings_freq=1 on 2 ranks")
    for rank, rep in reports.items():  # a's weights on stage 0, c's on stage K - 1
        a, c = rep["unheld"]["paths"]
        assert rep["unheld"]["said"] == [
            f"{path} is a weight of stage {holder}, which rank {rank} (stage {stage}) does not "
            "hold: read the whole model's weights with model.get_weights() (on every rank), "
            f"and read or assign this one on the ranks of stage {holder} (where "
            f"tfsift.mp_rank() == {holder})"
            for path, holder, stage in ((a, 0, 1), (c, 1, 0))
            if K == 2 and stage == rep["stage"]
        ]


def check_stopped_alone(reports: dict[int, dict[str, Any]], per_epoch: int) -> None:
    """A callback that stops one rank stops every rank there; callbacks that differ
    between ranks are refused (each waited for the other until the timeout before)."""
    # stopped by rank 1's callback after batch 3 of epoch 2; by rank 0's at the end of
    # epoch 2: both ranks train 2 epochs
    for rep in reports.values():
        assert rep["stopped_alone"]["at_batch"] == [2, per_epoch + 3]
        assert rep["stopped_alone"]["at_epoch"] == [2, 2 * per_epoch]
    for rep in reports.values():
        assert rep["stopped_alone"]["rank_0_checkpoint"] == (
            "fit was given other callbacks on some ranks. Every rank runs fit's steps, saves "
            "and stops in lock-step, so give every rank the same callbacks (tfsift shows the "
            "progress and writes TensorBoard and CSVLogger files on rank 0 alone, so those "
            "may be given to rank 0 only). Received: [ModelCheckpoint] on rank 0; [] on rank 1"
        )
        # a learning rate of each rank's own (each stage trained at its own, without a word)
        assert rep["stopped_alone"]["own_learning_rate"] == (
            "the model was compiled with another optimizer on some ranks. Every stage and "
            "replica trains one model, so compile it alike on every rank (the same optimizer "
            "settings and learning rate, the same loss). Received: "
            "learning_rate=0.05000000074505806 on rank 0; learning_rate=0.10000000149011612 "
            "on rank 1"
        )
        # a schedule without get_config: fit failed in Keras' serialization (Keras trains)
        assert rep["stopped_alone"]["schedule"] == 1
        assert rep["stopped_alone"]["own_schedule"] == (
            "the model was compiled with another optimizer on some ranks. Every stage and "
            "replica trains one model, so compile it alike on every rank (the same optimizer "
            "settings and learning rate, the same loss). Received: learning_rate={'class': "
            "'Halving', 'start': 0.05} on rank 0; learning_rate={'class': 'Halving', "
            "'start': 0.1} on rank 1"
        )
        assert rep["stopped_alone"]["own_exclusions"] == (
            "the model's optimizer excludes other weights from weight decay on some ranks "
            "(exclude_from_weight_decay). Every stage and replica trains one model, so exclude "
            "the same weights on every rank. Received: var_names=['bias'] on rank 0; "
            "var_names=[] on rank 1"
        )


def check_callbacks(reports: dict[int, dict[str, Any]]) -> None:
    """Collective saves from Keras' ModelCheckpoint, one CSV log, an exact resume."""
    for rep in reports.values():
        got = rep["callbacks"]
        # CSVLogger writes on rank 0 only; the checkpoints once, whole
        assert got["files"] == ["best.keras", "log-rank0.csv", "w-1.weights.h5", "w-2.weights.h5"]
        assert got["weights_file_error"] == 0.0  # save_weights then load_weights: every stage
        assert got["backed_up"] == ["ckpt-1"]
        assert got["resumed_epochs"] == 1
        assert got["resumed_weight_diff"] == 0.0  # optimizer, dropout seeds: all restored
        assert got["backup_left"] is False
        # a sifted fit resumed: the history, draws and optimizer go on unchanged
        resumed, uninterrupted = got["sifted_resumed_losses"]
        assert len(resumed) == 1 and resumed == uninterrupted  # epoch 3 of 3
        assert got["sifted_resumed_weight_diff"] == 0.0
    assert reports[0]["callbacks"]["keras_file_error"] < 1e-5  # plain Keras loads best.keras


@pytest.mark.timeout(400)
def test_fit_on_shuffled_arrays_killed_and_run_again_resumes_bitwise(tmp_path: Path) -> None:
    killed = mpi.run(2, "fit_resume_check.py", str(tmp_path), "killed", timeout=180)
    assert killed.returncode != 0  # rank 1 killed itself with SIGKILL in epoch 3
    assert "rank 1 was to be killed" not in killed.stderr + killed.stdout
    assert sorted(p.name for p in (tmp_path / "backup").glob("ckpt-*")) == ["ckpt-1"]
    resumed = mpi.reports(mpi.run(2, "fit_resume_check.py", str(tmp_path), "resumed"))
    for rank in (0, 1):
        assert resumed[rank]["epochs"] == 2  # epochs 3 and 4, each in its own order
        # bitwise: the same rows in the same order on each replica, dropout masks, Adam
        assert resumed[rank]["weights"] == resumed[rank]["whole"]
