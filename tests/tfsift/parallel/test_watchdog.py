"""Bounded waits: they sleep instead of spinning, give up after the timeout, and the job
ends naming the peer and the message waited for (pipeline) or the missing rank (Horovod)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import mpi
from tfsift.parallel import watchdog
from tfsift.parallel.comm import BACKWARD, FORWARD, PipeComm
from tfsift.state import STATE


class Aborted(Exception):
    """Raised in place of MPI_Abort, which would end the test process."""


@pytest.fixture
def no_abort(monkeypatch: pytest.MonkeyPatch) -> None:
    def abort(message: str, code: int = 1) -> None:
        raise Aborted(message)

    monkeypatch.setattr(watchdog, "abort", abort)


def test_wait_returns_as_soon_as_the_requests_complete() -> None:
    comm = MPI.COMM_SELF.Dup()
    got = np.zeros(3)
    request = comm.Irecv(got, source=0, tag=1)
    comm.Send(np.arange(3.0), dest=0, tag=1)
    start = time.monotonic()
    assert watchdog.wait([request], 10.0)
    assert time.monotonic() - start < 0.5
    assert got.tolist() == [0.0, 1.0, 2.0]


def test_wait_gives_up_after_the_timeout_without_spinning_a_core() -> None:
    comm = MPI.COMM_SELF.Dup()  # the pending receive stays on this communicator
    request = comm.Irecv(np.zeros(1), source=0, tag=2)
    start, cpu = time.monotonic(), time.process_time()
    assert not watchdog.wait([request], 1.0)
    elapsed, used = time.monotonic() - start, time.process_time() - cpu
    assert 1.0 <= elapsed < 1.5, elapsed
    # A blocking MPI_Recv would use ~1 s of CPU here. The first second's ~4000 wake-ups
    # a second (250 us pauses, kept short for the pipeline's latency) measured 0.08 to
    # 0.12 s on a 2-core CI machine, so a bound of 0.1 s failed now and then: 0.3 s still
    # tells a sleeping wait from a spinning one.
    assert used < 0.3, used


@pytest.mark.alone  # the spin's CPU seconds: a busy neighbour takes the core from it
def test_a_spinning_wait_spins_only_its_spin_and_never_past_the_timeout() -> None:
    comm = MPI.COMM_SELF.Dup()
    request = comm.Irecv(np.zeros(1), source=0, tag=3)
    start, cpu = time.monotonic(), time.process_time()
    assert not watchdog.wait([request], 0.05, spin=10.0)  # a spin longer than the timeout
    assert time.monotonic() - start < 0.5
    start, cpu = time.monotonic(), time.process_time()
    assert not watchdog.wait([request], 1.0, spin=0.2)
    elapsed, used = time.monotonic() - start, time.process_time() - cpu
    assert 1.0 <= elapsed < 1.5, elapsed
    # 0.2 s spun, then pauses as without a spin (the test above: 0.08 to 0.12 s)
    assert 0.15 <= used < 0.5, used


def test_a_pipeline_spins_only_where_every_rank_of_its_host_has_a_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TFSIFT_SPIN_US", raising=False)
    assert watchdog.spin_for(2, 2) == 1000e-6
    assert watchdog.spin_for(4, 2) == 0.0  # oversubscribed: a spin takes a computing core
    assert watchdog.spin_for(1, None) == 0.0  # os.cpu_count() does not know
    monkeypatch.setenv("TFSIFT_SPIN_US", "50")
    assert watchdog.spin_for(2, 2) == 50e-6
    monkeypatch.setenv("TFSIFT_SPIN_US", "0")  # jobs that share the cores: no spin
    assert watchdog.spin_for(2, 2) == 0.0
    monkeypatch.setenv("TFSIFT_SPIN_US", "-1")
    with pytest.raises(ValueError) as err:
        watchdog.spin_for(2, 2)
    assert str(err.value) == "TFSIFT_SPIN_US must be a number of microseconds >= 0. Received: '-1'"
    monkeypatch.setattr(STATE, "runtime", None)
    assert PipeComm(MPI.COMM_SELF.Dup(), timeout=1.0).spin == 0.0  # no tfsift.init: none
    assert PipeComm(MPI.COMM_SELF.Dup(), timeout=1.0, spin=1e-4).spin == 1e-4


def test_a_guard_ends_the_job_with_its_message_only_when_the_block_outlasts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ended: list[str] = []
    monkeypatch.setattr(watchdog, "abort", ended.append)
    with watchdog.guard(0.2, lambda: "the replicas"):
        time.sleep(0.05)  # a collective that returns in time
    with watchdog.guard(float("inf"), lambda: "never"):
        time.sleep(0.3)
    time.sleep(0.3)  # past the first guard's timeout: it was cancelled
    assert ended == []
    with watchdog.guard(5.0, lambda: "outer"):  # a guard inside another: the inner one fires
        with watchdog.guard(0.2, lambda: "the replicas"):
            time.sleep(0.5)  # a collective blocked past the timeout (abort ends the job there)
    assert ended == ["rank 0 waited 0.2 s for the replicas"]


def test_peers_are_named_with_their_hosts_only_when_the_job_spans_hosts() -> None:
    from types import SimpleNamespace

    from tfsift.state import STATE

    try:
        STATE.runtime = SimpleNamespace(hosts=())
        assert watchdog.named(1) == "rank 1"
        STATE.runtime = SimpleNamespace(hosts=("node1", "node2"))
        assert watchdog.named(1) == "rank 1, host node2"
    finally:
        STATE.runtime = None


def test_a_late_pipeline_message_names_the_waiter_the_peer_and_the_message(no_abort: None) -> None:
    pipe = PipeComm(MPI.COMM_SELF.Dup(), timeout=0.2)
    with pytest.raises(Aborted) as err:
        pipe.recv([((2, 3), tf.float32)], 0, FORWARD, 3)
    assert str(err.value) == (
        "rank 0 waited 0.2 s to receive the activations of microbatch 3 from stage 0 (rank 0)"
    )
    with pytest.raises(Aborted) as err:
        pipe.recv([((2,), tf.float32)], 0, BACKWARD, 1)
    assert "to receive the gradients of microbatch 1 from stage 0 (rank 0)" in str(err.value)


def test_a_send_never_received_names_the_peer(no_abort: None) -> None:
    pipe = PipeComm(MPI.COMM_SELF.Dup(), timeout=0.2)
    pipe.send([tf.zeros((1 << 20,))], 0, BACKWARD, 5)  # 4 MiB: not buffered, needs a receive
    with pytest.raises(Aborted) as err:
        pipe.wait()
    assert str(err.value) == (
        "rank 0 waited 0.2 s for stage 0 (rank 0) to receive the gradients of microbatch 5"
    )
    pipe.comm.Recv(np.empty(4 << 20, np.uint8), source=0, tag=MPI.ANY_TAG)
    pipe.wait()  # now received: completes


def test_pipeline_messages_arrive_intact_and_in_order() -> None:
    pipe = PipeComm(MPI.COMM_SELF.Dup(), timeout=5.0)
    sent = [tf.reshape(tf.range(6, dtype=tf.float32), (2, 3)), tf.constant([7, 8], tf.int32)]
    pipe.send(sent, 0, FORWARD, 0)
    got = pipe.recv([((2, 3), tf.float32), ((2,), tf.int32)], 0, FORWARD, 0)
    pipe.wait()
    assert [g.numpy().tolist() for g in got] == [s.numpy().tolist() for s in sent]


class Work:
    """Idle work whose ``sends_at``-th unit sends the awaited message; the rest is a log."""

    def __init__(self, pipe: PipeComm, sends_at: int, units: int) -> None:
        self.pipe, self.sends_at, self.units = pipe, sends_at, units
        self.ran: list[int] = []
        self.arrivals: list[tuple[int, bool]] = []

    def run(self, microbatch: int, waited: float) -> bool:
        if len(self.ran) == self.units:
            return False
        self.ran.append(microbatch)
        if len(self.ran) == self.sends_at:
            self.pipe.send([tf.constant([1.0, 2.0])], 0, BACKWARD, microbatch)
        return True

    def arrived(self, microbatch: int, waited: float, exact: bool) -> None:
        self.arrivals.append((microbatch, exact))


def test_a_receive_runs_idle_work_only_while_its_message_has_not_arrived() -> None:
    pipe = PipeComm(MPI.COMM_SELF.Dup(), timeout=5.0)
    work = Work(pipe, sends_at=3, units=10)
    got = pipe.recv([((2,), tf.float32)], 0, BACKWARD, 0, idle=work)
    assert got[0].numpy().tolist() == [1.0, 2.0]
    # it came during the third unit: no fourth, and its arrival time is not exact
    assert work.ran == [0, 0, 0] and work.arrivals == [(0, False)]
    pipe.send([tf.constant([1.0, 2.0])], 0, BACKWARD, 1)  # already there: no unit runs
    pipe.recv([((2,), tf.float32)], 0, BACKWARD, 1, idle=work)
    assert work.ran == [0, 0, 0] and work.arrivals[1] == (1, True)
    pipe.wait()


def test_a_receive_waits_on_when_the_idle_work_runs_out() -> None:
    pipe = PipeComm(MPI.COMM_SELF.Dup(), timeout=5.0)
    work = Work(pipe, sends_at=2, units=2)  # the message is sent by the last unit
    pipe.recv([((2,), tf.float32)], 0, BACKWARD, 4, idle=work)
    assert work.ran == [4, 4] and work.arrivals == [(4, False)]
    work = Work(pipe, sends_at=0, units=0)  # no work at all: an exact arrival is observed
    pipe.send([tf.constant([1.0, 2.0])], 0, BACKWARD, 5)
    pipe.recv([((2,), tf.float32)], 0, BACKWARD, 5, idle=work)
    assert work.ran == [] and work.arrivals == [(5, True)]
    pipe.wait()


def _stalled(sleeper: int, layout: str, timeout: float) -> tuple[Any, dict[str, Any], float]:
    """Runs stall_check.py; returns the job, the sleeper's report, and when the job ended."""
    proc = mpi.run(2, "stall_check.py", str(sleeper), str(timeout), layout, timeout=120)
    ended = time.time()
    report = json.loads((Path(proc.reports_dir) / f"rank{sleeper}.json").read_text())
    return proc, report, ended


@pytest.mark.mpi
@pytest.mark.fault
@pytest.mark.parametrize(
    ("sleeper", "message"),
    [
        (0, "rank 1 waited 3 s to receive the activations of microbatch 0 from stage 0 (rank 0)"),
        (1, "rank 0 waited 3 s to receive the gradients of microbatch 0 from stage 1 (rank 1)"),
    ],
)
def test_a_stalled_stage_ends_the_job_after_the_timeout(sleeper: int, message: str) -> None:
    proc, report, ended = _stalled(sleeper, "pipeline", 3.0)
    took = ended - report["start"]
    print(f"stalled stage {sleeper}: job ended {took:.1f} s after the stall (timeout 3 s)")
    print(f"waiting rank used {report['waiter_cpu']:.1%} of a core")
    assert proc.returncode != 0
    assert f"tfsift: {message}; aborting the job" in proc.stderr
    assert 2.0 <= took < 3.0 + 15, took  # the peer may start waiting a little earlier
    assert report["waiter_cpu"] < 0.1, report  # a blocking receive spins at ~100%


@pytest.mark.mpi
@pytest.mark.fault
@pytest.mark.slow
def test_a_stalled_replica_ends_the_job_after_the_timeout_of_the_allreduce() -> None:
    proc, report, ended = _stalled(1, "dp", 3.0)
    took = ended - report["start"]
    print(f"stalled replica: job ended {took:.1f} s after the stall (timeout 3 s)")
    print(f"waiting rank used {report['waiter_cpu']:.1%} of a core")
    assert proc.returncode != 0
    # tfsift's guard around Horovod's allreduce, before Horovod's own stall check (2x later)
    assert (
        "tfsift: rank 0 waited 3 s for the other replicas of stage 0 (ranks 0, 1) to average "
        "the gradients (a replica stalled, or its host cannot be reached); aborting the job"
    ) in proc.stderr
    assert "Missing ranks" not in proc.stderr
    assert 2.0 <= took < 3.0 + 15, took


@pytest.mark.mpi
@pytest.mark.alone
def test_a_stage_broadcast_root_goes_on_before_the_other_stages_receive_and_gathers_sleep() -> None:
    reports = mpi.reports(mpi.run(2, "stage_bcast_check.py", timeout=120))
    root, other = reports[0], reports[1]
    seconds = root["seconds"]
    print(f"root's calls (stage 1 receives 1 s later): {seconds}")
    # bcast_from_stage: the root waits for stage 1 (so the next lines can fail)
    assert seconds["0"] >= 0.8, seconds
    # StageBroadcast: the root returns at once; its next call waits for the first send
    assert seconds["1"] < 0.5, seconds
    assert seconds["2"] >= 0.5, seconds
    assert seconds["finish"] >= 0.5, seconds
    assert other["intact"] and root["intact"]
    assert 0.5 <= seconds["gave up"] < 2.0, seconds
    assert root["aborts"] == [
        "stage 0 (rank 0) waited 0.5 s for the other stages to receive the test values"
    ]
    assert other["aborts"] == []
    # allgather_object: both values, in rank order, and the early rank slept (blocking
    # MPI would have kept its core busy for the second it waited)
    assert root["gathered"] and other["gathered"] and root["one"]
    assert root["seconds"]["allgather cpu"] < 0.3, root["seconds"]
