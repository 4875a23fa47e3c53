"""One job per checkpoint directory: a second job is refused at once, a dead one's lock taken."""

from __future__ import annotations

import json
import logging
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import keras
import pytest
import tensorflow as tf

import mpi
import tfsift
from tfsift.checkpoint import CheckpointError, lock

HOLDER = """\
import sys
from checkpoint_models import batch, start, train_step
import tfsift

model, optimizer, forward_backward = start(1)
ckpt = tfsift.CheckpointManager(model, optimizer, sys.argv[1])
train_step(model, optimizer, forward_backward, *batch(0))
ckpt.save(0)
print("holding", flush=True)
sys.stdin.readline()
"""


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(2)

    def call(self, x: Any) -> Any:
        return self.a(x)


def manager(directory: Path) -> tfsift.CheckpointManager:
    tfsift.init({})
    return tfsift.CheckpointManager(Net(), None, directory)


def trained(directory: Path) -> tfsift.CheckpointManager:
    """A manager whose model has run a step, so that it can save."""
    ckpt = manager(directory)
    model = ckpt.model

    @tfsift.step
    def forward(x: tf.Tensor) -> Any:
        return model(x)

    forward(tf.zeros((2, 3)))
    return ckpt


def write_lock(directory: Path, host: str, pid: int) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    owner = {"host": host, "pid": pid, "started": "2025-01-02T03:04:05+00:00", "command": "a.py"}
    (directory / lock.LOCK).write_text(json.dumps(owner))
    return f"pid {pid} on host {host}, started 2025-01-02T03:04:05+00:00, running: a.py"


def refusal(directory: Path, held: str) -> str:
    return (
        f"rank 0: a checkpoint directory takes one job at a time, and {directory} is in use "
        f"by another job. Received: {held} (delete the lock if that job has ended)"
    )


def owner_of(directory: Path) -> dict[str, Any]:
    return json.loads((directory / lock.LOCK).read_text())  # type: ignore[no-any-return]


def dead_pid() -> int:
    with subprocess.Popen(["true"]) as done:
        done.wait()
    return done.pid


def test_a_second_job_is_refused_at_once_naming_the_first(tmp_path: Path) -> None:
    script, directory = tmp_path / "holder.py", tmp_path / "ckpt"
    script.write_text(HOLDER)
    with subprocess.Popen(
        [sys.executable, str(script), str(directory)],
        env=mpi.environment(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as first:
        assert first.stdout is not None and first.stdin is not None
        assert first.stdout.readline() == "holding\n"
        owner = owner_of(directory)
        assert owner["pid"] == first.pid and owner["host"] == socket.gethostname()
        assert owner["command"] == shlex.join([str(script), str(directory)])
        held = (
            f"the lock {directory / lock.LOCK} of pid {first.pid} on host {owner['host']}, "
            f"started {owner['started']}, running: {owner['command']}"
        )
        with pytest.raises(CheckpointError) as err:
            manager(directory)
        assert str(err.value) == refusal(directory, held)
        first.stdin.close()
        assert first.wait(timeout=60) == 0
    assert not (directory / lock.LOCK).exists()  # removed when the first job ended
    ckpt = trained(directory)
    assert not (directory / lock.LOCK).exists()  # a manager that only restores never locks
    ckpt.save(1)
    assert owner_of(directory)["pid"] == os.getpid()


def test_a_save_is_refused_when_another_job_took_the_directory_since(tmp_path: Path) -> None:
    ckpt = trained(tmp_path)
    described = write_lock(tmp_path, socket.gethostname(), os.getppid())  # a live process
    (tmp_path / ".ckpt-0.partial").mkdir()  # the other job's save in progress
    with pytest.raises(CheckpointError) as err:
        ckpt.save(0)
    assert str(err.value) == refusal(tmp_path, f"the lock {tmp_path / lock.LOCK} of {described}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ckpt-0.partial", lock.LOCK]


def test_a_lock_whose_process_is_gone_is_taken_over_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    described = write_lock(tmp_path, socket.gethostname(), dead_pid())
    ckpt = trained(tmp_path)  # a dead owner does not refuse the creation either
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        ckpt.save(0)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"taking over checkpoint directory {tmp_path} from a job that is no longer "
        f"running (killed?): its lock {tmp_path / lock.LOCK} names {described}"
    ]
    assert owner_of(tmp_path)["pid"] == os.getpid()


def test_an_exited_process_not_yet_reaped_is_gone_and_a_running_one_is_not() -> None:
    # a killed job's rank 0 can stay a zombie until its launcher reaps it, while the job
    # is run again: it holds nothing (os.kill(pid, 0) alone finds it alive)
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(200):  # until it has exited, unreaped (no wait here)
            if Path(f"/proc/{exited.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z":
                break
            time.sleep(0.05)
        host = socket.gethostname()
        assert not lock.Owner(host, exited.pid, "", "").alive()
        assert lock.Owner(host, running.pid, "", "").alive()
    finally:
        running.kill()
        running.wait()
        exited.wait()


def test_a_lock_from_another_host_or_unreadable_is_never_taken(tmp_path: Path) -> None:
    described = write_lock(tmp_path, "elsewhere", dead_pid())
    with pytest.raises(CheckpointError) as err:
        manager(tmp_path)
    assert str(err.value) == refusal(tmp_path, f"the lock {tmp_path / lock.LOCK} of {described}")
    for garbage in (b"", b"\x80\xfe binary"):  # binary: not a decoding error naming no file
        (tmp_path / lock.LOCK).write_bytes(garbage)
        with pytest.raises(CheckpointError) as err:
            manager(tmp_path)
        assert str(err.value) == refusal(tmp_path, f"an unreadable lock {tmp_path / lock.LOCK}")


def test_the_saves_of_one_process_share_the_lock_and_close_gives_it_up(tmp_path: Path) -> None:
    first = trained(tmp_path)
    first.save(0)
    assert lock.acquire(tmp_path) is None  # held by this process already
    second = trained(tmp_path)
    second.save(1)
    first.close()
    assert not (tmp_path / lock.LOCK).exists()
    owner = lock.acquire(tmp_path)
    assert owner is not None and owner.pid == os.getpid()


def test_release_leaves_another_process_lock_alone(tmp_path: Path) -> None:
    write_lock(tmp_path, socket.gethostname(), os.getppid())
    lock.release(tmp_path / lock.LOCK)
    assert (tmp_path / lock.LOCK).exists()


def test_a_directory_that_cannot_be_written_is_not_locked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        assert lock.acquire(tmp_path / "file" / "ckpt") is None
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"cannot lock checkpoint directory {tmp_path}/file/ckpt: ")
