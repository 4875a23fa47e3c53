"""CheckpointManager in one process: exact resume, sifting, pruning, damaged and failed saves."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import mpi
import tfsift
from tfsift.checkpoint import CheckpointError

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
PER_SAMPLE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
B = 8


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(8, activation="relu", name="a")
        self.drop = keras.layers.Dropout(0.4)
        self.norm = keras.layers.BatchNormalization()
        self.b = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.b(self.norm(self.drop(self.a(x))))


class Run:
    """A fresh model, optimizer and training step, seeded the same every time."""

    def __init__(self, directory: Path, sifted: str = "", max_to_keep: int | None = 3) -> None:
        tfsift.init({"microbatches": 2})
        keras.utils.set_random_seed(3)
        self.model = Net()
        self.optimizer = keras.optimizers.Adam(0.05)
        exit_after = "a" if sifted == "early_exit" else None
        config = dataclasses.replace(SIFT, scorer=sifted, exit_after=exit_after) if sifted else SIFT
        self.train = source().apply(tfsift.sift(self.model, PER_SAMPLE, config)) if sifted else None
        self.ckpt = tfsift.CheckpointManager(
            self.model, self.optimizer, directory, max_to_keep=max_to_keep, sift=self.train
        )
        model = self.model

        @tfsift.step
        def forward_backward(x: tf.Tensor, y: tf.Tensor) -> Any:
            return tfsift.gradients(LOSS(y, model(x, training=True)), model.trainable_variables)

        self.step = forward_backward

    def fit(self, steps: range, save_every: int = 0) -> None:
        for step in steps:
            self.fit_one(*batch(step))
            if save_every and (step + 1) % save_every == 0:
                self.ckpt.save(step)

    def fit_one(self, x: Any, y: Any) -> None:
        grads = [g.accumulate() for g in self.step(x, y)]
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))

    def state(self) -> list[np.ndarray]:
        return [v.numpy() for v in [*self.model.variables, *self.optimizer.variables]]


SIFT = tfsift.SiftConfig(policy="relative", beta=1.0, history=24, delay=1, seed=5)


def samples(n: int = 96) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 5)).astype(np.float32)
    x[:, 0] = np.arange(n) / 1000  # the sample id, to follow sifting
    return x, rng.integers(0, 3, n)


def source() -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(samples()).batch(B, drop_remainder=True)


def batch(step: int) -> tuple[tf.Tensor, tf.Tensor]:
    x, y = samples()
    at = step * B % (len(x) - B)
    return tf.constant(x[at : at + B]), tf.constant(y[at : at + B])


def assert_equal(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_resumed_run_ends_bitwise_equal_to_an_uninterrupted_one(tmp_path: Path) -> None:
    whole = Run(tmp_path / "whole")
    whole.fit(range(6))
    first = Run(tmp_path / "ckpt")
    first.fit(range(3), save_every=3)
    resumed = Run(tmp_path / "ckpt")  # a fresh model: restore partitions it from the manifest
    assert resumed.model.partitioned is None
    assert resumed.ckpt.restore() == 3
    assert_equal(resumed.state(), first.state())
    resumed.fit(range(3, 6))
    assert_equal(resumed.state(), whole.state())  # dropout masks, BatchNorm statistics, Adam


@pytest.mark.parametrize("scorer", ["full", "early_exit"])
def test_a_sifted_run_resumes_from_the_last_batch_it_yielded(tmp_path: Path, scorer: str) -> None:
    def ids(x: Any) -> list[int]:
        return [round(float(v) * 1000) for v in np.asarray(x)[:, 0]]

    def fit(run: Run, steps: int, stream: Any) -> list[list[int]]:
        seen = []
        for _, (x, y) in zip(range(steps), stream, strict=False):
            run.fit_one(x, y)
            seen.append(ids(x))
        return seen

    whole = Run(tmp_path / "whole", sifted=scorer)
    want = fit(whole, 7, iter(whole.train))
    first = Run(tmp_path / "ckpt", sifted=scorer)
    got = fit(first, 3, iter(first.train))
    first.ckpt.save(2)
    resumed = Run(tmp_path / "ckpt", sifted=scorer)
    assert resumed.ckpt.restore() == 3
    got += fit(resumed, 4, iter(resumed.train))
    assert got == want
    assert_equal(resumed.state(), whole.state())


def test_an_infobatch_run_on_from_arrays_resumes_mid_epoch_with_its_plan(tmp_path: Path) -> None:
    config = tfsift.SiftConfig(
        policy="infobatch", scores="training", stale=3, epochs=3, anneal=0.0, seed=5,
        rescale="unbiased",
    )  # fmt: skip

    def run(directory: Path) -> Run:
        r = Run(directory)
        r.train = tfsift.from_arrays(samples(), B, seed=2).apply(tfsift.sift(config=config))
        r.ckpt = tfsift.CheckpointManager(r.model, r.optimizer, directory, sift=r.train)
        return r

    def fit(r: Run, steps: int) -> list[list[int]]:
        def epochs() -> Any:
            while True:
                yield from r.train

        seen = []
        for _, (x, y, _) in zip(range(steps), epochs(), strict=False):
            r.fit_one(x, y)
            seen.append([round(float(v) * 1000) for v in np.asarray(x)[:, 0]])
            r.train.record(np.array([(i * 37) % 101 / 10 for i in seen[-1]]))
        return seen

    whole = run(tmp_path / "whole")
    want = fit(whole, 20)  # the 12 batches of epoch 1, then 8 of the pruned epoch 2
    first = run(tmp_path / "ckpt")
    got = fit(first, 15)
    first.ckpt.save(14)
    resumed = run(tmp_path / "ckpt")
    assert resumed.ckpt.restore() == 15
    got += fit(resumed, 5)
    assert got == want
    assert resumed.train.sifter.policy.metrics()["pruned"] > 0  # restored inside epoch 2's plan
    assert_equal(resumed.state(), whole.state())


def test_no_checkpoint_restores_nothing(tmp_path: Path) -> None:
    run = Run(tmp_path / "none")
    assert run.ckpt.restore() is None and run.ckpt.latest() is None
    assert run.model.partitioned is None


def test_only_the_newest_are_kept_and_leftovers_of_killed_saves_go(tmp_path: Path) -> None:
    run = Run(tmp_path, max_to_keep=2)
    (tmp_path / ".ckpt-9.partial").mkdir()  # a job killed while saving step 9
    run.fit(range(4), save_every=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tfsift-lock", "ckpt-2", "ckpt-3"]
    assert run.ckpt.latest() == tmp_path / "ckpt-3"
    manifest = json.loads((tmp_path / "ckpt-3" / "manifest.json").read_text())
    assert manifest["step"] == 3 and manifest["partitions"] == 1
    assert [f["name"] for f in manifest["files"]] == [
        "optimizer-s0.npz",
        "state-r0-s0.npz",
        "weights-s0.npz",
    ]


def test_max_to_keep_none_keeps_every_checkpoint(tmp_path: Path) -> None:
    run = Run(tmp_path, max_to_keep=None)
    run.fit(range(4), save_every=1)
    want = [".tfsift-lock", "ckpt-0", "ckpt-1", "ckpt-2", "ckpt-3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == want
    assert Run(tmp_path).ckpt.restore() == 4


@pytest.mark.parametrize("step", [-1, 2.5, True, 2**63])
def test_a_step_no_restore_could_find_is_refused_before_saving(tmp_path: Path, step: Any) -> None:
    run = Run(tmp_path)
    run.fit(range(1))
    refusal = f"an int from 0 to {2**63 - 1}. Received: step="
    with pytest.raises(ValueError, match=re.escape(refusal)):
        run.ckpt.save(step)
    assert not any(p.name.startswith("ckpt") for p in tmp_path.iterdir())


def test_saving_a_step_again_replaces_its_checkpoint(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.fit(range(1))
    run.ckpt.save(0)
    run.fit(range(1, 2))
    run.ckpt.save(0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tfsift-lock", "ckpt-0"]
    again = Run(tmp_path)
    again.ckpt.restore()
    assert_equal(again.state(), run.state())


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "edit":  # the manifest's input shape, as a hand edit would change it
        text = path.read_text()
        path.write_text(re.sub(r'"inputs": \[\s*\[\s*\[\s*4', '"inputs": [[[1000000000000', text))
        assert path.read_text() != text
        return
    if how == "flip":
        data[len(data) // 2] ^= 0x10
    else:
        del data[len(data) // 3 :]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("name", "how"),
    [
        ("weights-s0.npz", "flip"),
        ("weights-s0.npz", "truncate"),
        ("manifest.json", "flip"),
        ("manifest.json", "edit"),
    ],
)
def test_a_damaged_checkpoint_is_skipped_with_a_warning_naming_the_file(
    tmp_path: Path, name: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    run = Run(tmp_path)
    run.fit(range(2), save_every=1)
    damage(tmp_path / "ckpt-1" / name, how)
    again = Run(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        assert again.ckpt.restore() == 1  # ckpt-0 was used
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "skipping damaged checkpoint" in warning and "ckpt-1" in warning
    assert name in warning
    earlier = Run(tmp_path / "x")
    earlier.fit(range(1))
    assert_equal(again.state(), earlier.state())


def test_every_checkpoint_damaged_is_refused_not_replaced_by_a_fresh_start(
    tmp_path: Path,
) -> None:
    # it said "no checkpoint; starting afresh" and the new saves replaced the damaged ones
    run = Run(tmp_path)
    run.fit(range(2), save_every=1)
    for step in (0, 1):
        damage(tmp_path / f"ckpt-{step}" / "weights-s0.npz", "truncate")
    again = Run(tmp_path)
    with pytest.raises(CheckpointError) as err:
        again.ckpt.restore()
    assert str(err.value) == (
        f"every checkpoint in {tmp_path} is damaged (the warnings above name their files), so "
        "none was restored; starting afresh would replace them. Move them away (or delete "
        "them) to start afresh, or restore their files. Received: ckpt-1, ckpt-0"
    )
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt")) == [
        "ckpt-0",
        "ckpt-1",
    ]


def test_another_optimizer_is_refused_and_optimizer_none_restores_the_weights_alone(
    tmp_path: Path,
) -> None:
    # SGD's momentum took Adam's first moments, and its learning rate Adam's, without a word
    Run(tmp_path).fit(range(2), save_every=2)
    again = Run(tmp_path)
    sgd = keras.optimizers.SGD(0.05, momentum=0.9)
    with pytest.raises(ValueError) as err:
        tfsift.CheckpointManager(again.model, sgd, tmp_path).restore()
    assert str(err.value) == (
        "rank 0: the checkpoint holds the optimizer state of Adam, and this run's optimizer "
        "is SGD: its slots would take Adam's values without a word. Restore with the Adam "
        "the run saved, or give CheckpointManager optimizer=None to restore the weights "
        "alone and start SGD afresh. Received: Adam in the checkpoint, SGD given"
    )
    weights_only = Run(tmp_path)
    assert tfsift.CheckpointManager(weights_only.model, None, tmp_path).restore() == 2
    saved = Run(tmp_path)
    assert saved.ckpt.restore() == 2
    for a, b in zip(weights_only.model.variables, saved.model.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


class Renamed(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.first = keras.layers.Dense(8, activation="relu")
        self.drop = keras.layers.Dropout(0.4)
        self.norm = keras.layers.BatchNormalization()
        self.b = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.b(self.norm(self.drop(self.first(x))))


def test_a_checkpoint_without_a_layer_names_the_paths_it_holds(tmp_path: Path) -> None:
    # it said "it holds 0 others, e.g. []": only the values asked for were looked at
    Run(tmp_path).fit(range(1), save_every=1)
    model = Renamed()
    model.predict(batch(0)[0], verbose=0)  # partitioned
    with pytest.raises(ValueError) as err:
        tfsift.CheckpointManager(model, None, tmp_path).restore()
    message = str(err.value)
    assert "has no value for the layer paths ['first/kernel', 'first/bias'] of this model" in (
        message
    )
    assert "(it holds 2 others, e.g. ['a/bias', 'a/kernel'])" in message


def test_a_first_restore_finding_nothing_checks_the_saves_can_write(tmp_path: Path) -> None:
    # /proc passes os.access for root: the first save failed, after the first steps
    tfsift.init({})
    manager = tfsift.CheckpointManager(Net(), None, Path("/proc/tfsift-ckpt"))
    with pytest.raises(CheckpointError) as err:
        manager.restore()
    assert str(err.value).startswith(
        "the checkpoint directory must be one this job can write to (its first restore "
        "checks it rather than fail at the first save): /proc/tfsift-ckpt cannot be made or "
        "written ("
    )
    assert str(err.value).endswith("). Received: /proc/tfsift-ckpt")


def test_a_full_disk_fails_the_save_loudly_and_keeps_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    proc = subprocess.run(
        [sys.executable, str(mpi.SCRIPTS / "checkpoint_disk_full.py"), str(tmp_path)],
        env=mpi.environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["error"].startswith(f"checkpoint {tmp_path}/ckpt-1 was not saved")
    assert "File too large" in got["error"] and "weights-s0.npz" in got["error"]
    # no partial directory, the previous one intact (and the lock of the job, still running)
    assert got["left"] == [".tfsift-lock", "ckpt-0"]
    assert got["restored"] == 1 and got["equal"]


def test_an_unwritable_directory_fails_the_save_on_every_rank(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    run = Run(tmp_path / "file" / "ckpt")
    run.fit(range(1))
    with pytest.raises(CheckpointError, match=r"cannot create .*file/ckpt/\.ckpt-0\.partial"):
        run.ckpt.save(0)


def test_a_directory_that_is_a_file_is_refused_when_the_manager_is_made(tmp_path: Path) -> None:
    # it failed at the first save, after training, with mkdir's "rank 0: [Errno 17] File
    # exists"
    (tmp_path / "ckpt").write_text("not a directory")
    tfsift.init({})
    with pytest.raises(CheckpointError) as err:
        tfsift.CheckpointManager(Net(), None, tmp_path / "ckpt")
    assert str(err.value) == (
        "tfsift.CheckpointManager's directory must be a directory (made if missing) that "
        f"every rank sees. Received: {str(tmp_path / 'ckpt')!r}, which is a file"
    )


def test_saving_before_any_step_asks_for_one(tmp_path: Path) -> None:
    # it asked for example=, which save does not take
    with pytest.raises(ValueError) as err:
        Run(tmp_path).ckpt.save(0)
    assert str(err.value) == (
        "CheckpointManager.save needs the model partitioned, which happens at its first step "
        "(the first call of a @tfsift.step, fit, evaluate or predict): call it after one. "
        "Received: a model no step has run"
    )


def test_arguments_of_the_wrong_kind_are_named() -> None:
    tfsift.init({})
    model = Net()
    with pytest.raises(
        TypeError, match=re.escape("needs a tfsift.DistributedModel. Received: Dense")
    ):
        tfsift.CheckpointManager(keras.layers.Dense(2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=re.escape("sift must be the dataset tfsift.sift returned")):
        tfsift.CheckpointManager(model, None, "x", sift=tf.data.Dataset.range(3))
    with pytest.raises(
        ValueError, match=re.escape("max_to_keep must be an int >= 1 or None. Received: 0")
    ):
        tfsift.CheckpointManager(model, None, "x", max_to_keep=0)
    with pytest.raises(  # a wrong kind is a TypeError, as the docs say (a ValueError before)
        TypeError, match=re.escape("max_to_keep must be an int >= 1 or None. Received: '2'")
    ):
        tfsift.CheckpointManager(model, None, "x", max_to_keep="2")  # type: ignore[arg-type]
