"""The examples run, shortened, so that none rots."""

from __future__ import annotations

import math
import re

import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


def test_sift_mnist1d_trains_on_two_stages_by_two_replicas_with_infobatch() -> None:
    proc = mpi.run(
        4, str(mpi.ROOT / "examples" / "sift_mnist1d.py"), "--samples", "2500", "--epochs", "2",
        "--batch", "32", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = re.findall(r"epoch (\d): kept ([\d.]+), loss ([\d.]+), held-out accuracy ([\d.]+)",
                       proc.stdout)  # fmt: skip
    assert [int(e) for e, *_ in lines] == [1, 2]  # printed by rank 0 only, once per epoch
    kept = [float(k) for _, k, _, _ in lines]
    # InfoBatch, the default: the first epoch trains every whole batch of a replica's 1000
    # samples (31 of 32), the second prunes half of those below the mean loss
    assert kept[0] == pytest.approx(31 * 32 / 1000)
    assert 0.5 < kept[1] < 0.9
    assert float(lines[-1][3]) > 0.2  # better than chance (0.1) after two short epochs


@pytest.mark.alone  # what the waits hold depends on their length
def test_sift_mnist1d_scores_in_stage_0s_waits_and_keeps_what_they_had_no_room_for() -> None:
    proc = mpi.run(
        2, str(mpi.ROOT / "examples" / "sift_mnist1d.py"), "--samples", "2500", "--epochs", "2",
        "--batch", "32", "--delay", "2", "--policy", "relative", "--scorer", "early_exit",
        "--overlap", "--leftover", "keep", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = re.findall(r"epoch (\d): kept ([\d.]+), loss [\d.]+, held-out accuracy ([\d.]+), "
                       r"[\d.]+ s, kept unscored (\d+)", proc.stdout)  # fmt: skip
    assert [int(e) for e, *_ in lines] == [1, 2]
    # the first prepared round comes before stage 0 has measured a wait: kept unscored
    assert int(lines[0][3]) >= 32
    # relative (beta=1) keeps about half of what it scores and everything kept unscored: how
    # much that is depends on the waits (with the optimizer's update compiled, 16% to 75%
    # of the samples here, against 3% to 6% with the eager update), the kept fraction
    # follows from it (each epoch's own: the example prints sift_metrics(epoch=True))
    for _, kept, _, unscored in lines:
        seen = 2000  # 80% of the 2500 samples, each epoch
        assert int(unscored) < seen  # the waits scored some
        assert float(kept) == pytest.approx((int(unscored) + (seen - int(unscored)) / 2) / seen,
                                            abs=0.06)  # fmt: skip
    assert float(lines[-1][2]) > 0.2  # better than chance (0.1) after two short epochs


def test_resnet_skip_sends_the_shortcut_across_the_cut_and_learns() -> None:
    proc = mpi.run(2, str(mpi.ROOT / "examples" / "resnet_skip.py"), "--epochs", "1",
                   timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    cut = proc.stdout[proc.stdout.index("cut before") :].splitlines()[:3]
    assert cut[0] == "cut before node 15 (block2_conv2) carries:"  # the pinned cut
    assert re.fullmatch(r"  shortcut_bn \(4, 4, 32\) -> add_\d+  <- skip connection", cut[1])
    assert re.fullmatch(r"  relu_\d+ \(4, 4, 32\) -> block2_conv2", cut[2])
    assert re.findall(r"^epoch (\d)/1  loss", proc.stdout, re.M) == ["1"]  # rank 0 only
    # 0.93 here; chance is 0.1, and stale BatchNorm statistics (momentum 0.99) gave 0.18
    assert float(re.findall(r"test accuracy: ([\d.]+)", proc.stdout)[-1]) > 0.8


SMALL_LM = ("--chars", "40000", "--seq-len", "32", "--dim", "32", "--blocks", "2", "--epochs", "1")


def losses(stdout: str) -> list[str]:
    return re.findall(r"^step \d+ loss ([\d.]+)$", stdout, re.M)


def test_decoder_lm_on_four_stages_learns_and_follows_one_process_step_by_step() -> None:
    """Tied head, AdamW with warm-up and cosine decay, global_clipnorm, mixed_bfloat16."""
    lm = str(mpi.ROOT / "examples" / "decoder_lm.py")
    proc = mpi.run(4, lm, *SMALL_LM, "--batch-size", "16", "--log-steps", "4",
                   "--generate", "8", timeout=400)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "plan: 4 stages" in proc.stdout and "mixed_bfloat16" in proc.stdout
    unigram = float(re.findall(r"unigram baseline ([\d.]+) bits", proc.stdout)[0])
    start = proc.stdout.index("sampled continuation of 'def ':\n") + len(
        "sampled continuation of 'def ':\n"
    )
    sample = proc.stdout[start : proc.stdout.index("\nvalidation loss:", start)]
    assert sample.startswith("def ") and len(sample) == 12  # the prompt and 8 characters
    nats, perplexity = re.findall(r"validation loss: ([\d.]+), perplexity ([\d.]+)",
                                  proc.stdout)[-1]  # fmt: skip
    assert float(perplexity) == pytest.approx(math.exp(float(nats)), rel=1e-3)
    assert float(nats) / math.log(2) < unigram - 0.3  # uses what came before the character
    # one process, the same batches and microbatches: the same losses, to the printed digit
    one = mpi.run(1, lm, *SMALL_LM, "--partitions", "1", "--batch-size", "16", "--log-steps",
                  "4", "--max-steps", "4", "--generate", "0", timeout=300)  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    assert len(losses(proc.stdout)) == 4 and losses(proc.stdout) == losses(one.stdout)
    # 2 stages x 2 replicas of 8 samples: each step's batch is one process's 16 samples,
    # in other microbatches, so bfloat16 rounds them otherwise (1e-5 of the loss here)
    two = mpi.run(4, lm, *SMALL_LM, "--partitions", "2", "--batch-size", "8", "--log-steps",
                  "3", "--max-steps", "3", "--generate", "0", timeout=300)  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    assert [float(v) for v in losses(two.stdout)] == pytest.approx(
        [float(v) for v in losses(one.stdout)[:3]], rel=1e-4
    )


def test_regression_sifted_adaptively_keeps_half_after_the_delay_and_beats_the_mean() -> None:
    proc = mpi.run(2, str(mpi.ROOT / "examples" / "regression.py"), "--epochs", "10",
                   "--sift", "adaptive", timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    baseline = float(re.findall(r"test mse of the training mean ([\d.]+)", proc.stdout)[0])
    kept = [float(k) for k in re.findall(r"^epoch \d+: kept ([\d.]+),", proc.stdout, re.M)]
    # 10 source batches of 32 per epoch; the first 20 kept whole, then 16 of each 32
    seen = [10 * e for e in range(1, 11)]
    assert kept == [round((min(s, 20) + max(s - 20, 0) / 2) / s, 3) for s in seen]
    mse = float(re.findall(r"test mse: ([\d.]+)", proc.stdout)[-1])
    assert mse < 0.75 * baseline  # 0.61 here, the mean's 0.97
