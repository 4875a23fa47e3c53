"""A GPT-style decoder trained as big-model users train one (tests/mpi_scripts/bigmodel_check.py)
equals one process: a token embedding tied to the output head across stages, AdamW with a
warm-up and cosine schedule and ``global_clipnorm``, mixed_float16 with a loss scale that
overflows on one stage only, mixed_bfloat16; K = 2, K = 4 (on zero_bubble) and 2 stages
x 2 replicas, in ``fit`` and in the custom loop. The whole model's ``get_weights``,
``set_weights`` and ``export``; a checkpoint that saves the tied embedding once restores
in one process.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import keras
import numpy as np
import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

CKPT = Path(tempfile.mkdtemp(prefix="tfsift-bigmodel-"))  # the 2-stage run's checkpoint
atexit.register(shutil.rmtree, CKPT, True)
ON_TWO_STAGES = mpi.TWO_STAGES.scenario("bigmodel_check.py", "2", str(CKPT), timeout=400)
# K = 4 on ZB-H1 (room for every deferral: W's deferred 0, 1, 2, 3): the clipping norm and
# the tied gradient wait for the deferred weight gradients
ON_FOUR_STAGES = mpi.FOUR_STAGES.scenario(
    "bigmodel_check.py", "4", "-", "loop", "zero_bubble@1GB", timeout=300
)
ON_2X2 = mpi.CLUSTER_2X2.scenario("bigmodel_check.py", "2", "-", "loop", timeout=300)
EXACT = 1e-5  # relative, largest over a stage's weights: float rounding, nothing more
# mixed_float16 where TensorFlow runs oneDNN's kernels (CPUs with AVX-512 VNNI or BF16):
# they fuse a stage's ops otherwise than the whole model's, and float16 rounds each fusion
# otherwise (5e-4 measured on 2 stages, 1e-7 with TF_ENABLE_ONEDNN_OPTS=0 on that machine):
# two float16 epsilons (the loss scales and the steps applied are compared exactly)
FP16_ONEDNN = 2e-3


def check_loop(reports: mpi.Reports, K: int) -> None:
    """Every stage's weights equal one process's after 12 clipped AdamW steps, and every
    stage holding the tied embedding holds bitwise the same copy."""
    assert sorted(r["stage"] for r in reports.values()) == sorted(
        s for s in range(K) for _ in range(len(reports) // K)
    )
    for rep in reports.values():
        assert rep["loop_error"] < EXACT, rep
        assert rep["refused"] == (
            "on a pipeline, global_clipnorm must clip by the norm over every stage's gradients, "
            "which tfsift computes for Keras' own clipping only; OwnClipping overrides "
            "_clip_gradients. Clip in the loop with tfsift.clip_by_global_norm(grads, "
            "clip_norm, model) and pass an optimizer without global_clipnorm. Received: "
            "OwnClipping(global_clipnorm=1.0)"
        )
        assert rep["refused_whole"] == [
            "on a pipeline each stage's optimizer is given that stage's gradients only, so an "
            "override of apply_gradients, apply or _clip_gradients, which may compute over all "
            "of them (a norm, a finite check), would compute over one stage's. Move what "
            "treats each variable alone into update_step, and clip over every stage's "
            "gradients in the loop with tfsift.clip_by_global_norm(grads, clip_norm, model). "
            f"Received: {name}"
            for name in (
                "Centred, which overrides Centred.apply_gradients",
                "LossScaleOptimizer, which overrides NormClip._clip_gradients",
            )
        ]
        assert rep["get_weights_error"] < EXACT, rep  # the whole model on every rank
        assert rep["get_weights_count"][0] == rep["get_weights_count"][1]
    holders = [r["embedding"] for r in reports.values() if r["stage"] in (0, K - 1)]
    assert len(holders) == len(reports) * 2 // K and len(set(holders)) == 1
    assert all(r["embedding"] is None for r in reports.values() if 0 < r["stage"] < K - 1)


@mpi.TWO_STAGES.mark
def test_two_stages_clip_tie_and_scale_as_one_process_does() -> None:
    reports = ON_TWO_STAGES()
    check_loop(reports, 2)
    for rep in reports.values():
        assert rep["fit_error"] < EXACT  # fit's update spans the stages too
        fp16 = FP16_ONEDNN if rep["onednn"] else EXACT
        assert rep["fp16_error"] < fp16
        assert rep["fp16_fit_error"] < fp16
        assert rep["fp16_fit_scale"] == [32768.0, 32768.0]
        assert rep["bf16_error"] < EXACT
        assert rep["set_weights_error"] == 0.0
        # steps 0 and 5 overflow on the last stage only; both stages skip them and halve
        # the scale, which grows back after 4 good steps, as in one process
        assert rep["fp16_scale"] == [32768.0, 32768.0]
        assert rep["fp16_applied"] == [8, 8]
    by_stage = {r["stage"]: r for r in reports.values()}
    # the spiking layer's stage alone overflows (the last layers: the cut may fall either
    # side of it), the other stage's gradients stay finite
    assert sorted(r["fp16_overflowed_here"] for r in reports.values()) == [0, 2]
    # activations cross the cut in the compute dtype: bfloat16, half of float32's bytes
    received = by_stage[1]["bf16_received"]
    assert received and set(received) == {"bfloat16"}, received
    exported = reports[0]
    assert exported["loaded_error"] == 0.0  # tfsift.save_model: a plain .keras file
    assert exported["tied_layers"] == ["embed"] and exported["tied_calls"] == 2


@mpi.FOUR_STAGES.mark
def test_four_stages_on_zero_bubble_clip_and_tie_the_first_and_last_stage() -> None:
    reports = ON_FOUR_STAGES()
    check_loop(reports, 4)
    assert all(r["schedule"] == ["zero_bubble", [0, 1, 2, 3]] for r in reports.values())


@mpi.CLUSTER_2X2.mark
def test_two_stages_by_two_replicas_clip_by_the_norm_of_the_averaged_gradients() -> None:
    check_loop(ON_2X2(), 2)


@mpi.TWO_STAGES.mark
def test_the_tied_embedding_is_saved_once_and_restores_into_one_process() -> None:
    from mpi_scripts.bigmodel_check import Decoder, M

    import tfsift

    reports = ON_TWO_STAGES()
    (ckpt,) = CKPT.glob("ckpt-*")
    with np.load(ckpt / "weights-s0.npz") as first, np.load(ckpt / "weights-s1.npz") as last:
        assert "embed/embeddings" in first.files and "embed/embeddings" not in last.files
    tfsift.init({"partitions": 1, "microbatches": M})
    model = Decoder()
    optimizer = keras.optimizers.AdamW(global_clipnorm=1.0)
    manager = tfsift.CheckpointManager(model, optimizer, CKPT)
    assert manager.restore() == 13  # saved after step 12
    saved = {**reports[0]["saved"], **reports[1]["saved"]}
    assert sorted(v.path for v in model.trainable_variables) == sorted(saved)
    for v in model.trainable_variables:
        np.testing.assert_array_equal(v.numpy(), np.array(saved[v.path], np.float32))
