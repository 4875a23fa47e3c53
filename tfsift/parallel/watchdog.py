"""Bounded waits on MPI requests: tested with a growing sleep; the job ends if one takes too long.

A blocking MPI call spins a core while it waits (Open MPI polls its queues in a loop)
and never gives up on a peer that stalled. ``wait`` tests the requests instead and
sleeps between tests, each pause ``GROWTH`` times the last:

    test ─ 50 µs ─ test ─ 60 µs ─ test ─ ... ─ test ─ 250 µs ─ test ─ ... (1 s) ... 10 ms ─ ...

A message already there costs one test. With ``spin`` the first tests come without a
pause, for up to that many seconds: a pause of 50 µs lasts longer by the kernel's timer
slack (50 µs by default on Linux) and the wake-up, which an MLP's pipeline step of a few
ms paid a dozen times (``scripts/bench_small.py``); a pipeline spins where every
rank of its host has a core of its own (``spin_for``; ``TFSIFT_SPIN_US``), for up to 1 ms:
1F1B waits on its neighbour at every microbatch, for about an action of a small model,
and with a spin of 200 µs those waits ended in a pause (that MLP's 1F1B step 7.0 ms
against 6.4 ms with 1 ms, GPipe's 6.1 and 6.0 ms; docs/failures.md). After that, one
that arrives after a wait of ``t`` is seen at most ``t / 5`` or 250 µs late (plus that
slack): a pipeline's waits are on its critical path, and longer pauses lengthen the step
(pauses of up to 10 ms made the pipeline benchmark's fastest step slower, in a comparison
of polled and blocking receives in one job, since removed; docs/failures.md). Only after
``LONG_WAIT`` (a peer that is not just computing) does the pause grow to ``MAX_PAUSE``:
~100 wake-ups a second instead of a busy core. When ``timeout`` seconds pass first,
the caller ends the job with ``abort``, naming who waited for what.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from mpi4py import MPI

from tfsift import env
from tfsift.state import STATE

FIRST_PAUSE = 50e-6  # seconds
GROWTH = 1.2  # a wait of t that ends during a pause is seen at most (GROWTH - 1) * t late
SHORT_PAUSE = 250e-6  # the longest pause during the first LONG_WAIT seconds
LONG_WAIT = 1.0
MAX_PAUSE = 10e-3


def wait(requests: Sequence[Any], timeout: float, spin: float = 0.0) -> bool:
    """Waits until every request completes, or ``timeout`` seconds pass.

    Args:
        requests: mpi4py requests (``Irecv``, ``Isend``, ``Ibarrier``, ...).
        timeout: seconds; ``math.inf`` waits forever (still without spinning).
        spin: seconds to test without pausing first (``spin_for``).

    Returns:
        True when every request completed; False when the time ran out first (the
        requests are then still pending).
    """
    requests = list(requests)
    start = time.monotonic()
    if spin > 0:
        while not MPI.Request.Testall(requests):
            if time.monotonic() - start >= min(spin, timeout):
                break
        else:
            return True
    pause = FIRST_PAUSE
    while not MPI.Request.Testall(requests):
        waited = time.monotonic() - start
        if waited >= timeout:
            return False
        time.sleep(pause)
        pause = min(pause * GROWTH, SHORT_PAUSE if waited < LONG_WAIT else MAX_PAUSE)
    return True


def spin_for(local_ranks: int, cores: int | None) -> float:
    """Seconds to spin (``TFSIFT_SPIN_US``) where each of the host's ``local_ranks`` can
    have one of its ``cores``, else 0: a rank that spins on a shared core takes it from a
    rank that computes."""
    return env.spin_us() / 1e6 if cores is not None and local_ranks <= cores else 0.0


def bounded(waited_for: Callable[[], str]) -> contextlib.AbstractContextManager[None]:
    """``guard`` with the ``timeout`` of the config ``tfsift.init`` was given; no guard
    without ``tfsift.init`` (a communicator the caller made, in tests)."""
    rt = STATE.runtime
    if rt is None:
        return contextlib.nullcontext()
    return guard(rt.config.timeout, waited_for)


@contextlib.contextmanager
def guard(timeout: float, waited_for: Callable[[], str]) -> Iterator[None]:
    """Ends the job, saying ``rank R waited T s for <waited_for()>``, if the block outlasts
    ``timeout`` seconds.

    For blocking calls that cannot be polled: Horovod's tensor collectives hold the calling
    thread until every rank joins. Horovod's own stall check does not bound them when a
    peer's host drops off the network without a reset: its background thread then waits
    inside MPI forever, and so does the collective. One timer thread per process ends the
    job instead (arming it costs a lock, not a thread per call); ``math.inf`` never does.
    """
    if not math.isfinite(timeout):
        yield
        return

    def message() -> str:
        return f"rank {MPI.COMM_WORLD.Get_rank()} waited {timeout:g} s for {waited_for()}"

    outer = _TIMER.arm(time.monotonic() + timeout, message)
    try:
        yield
    finally:
        _TIMER.restore(outer)


Armed = tuple[float, Callable[[], str]]  # (deadline on time.monotonic, message)


class _Timer:
    """The thread behind ``guard``: sleeps until the armed deadline, then ends the job."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: Armed | None = None
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float, message: Callable[[], str]) -> Armed | None:
        """Arms the timer; returns what was armed before (a guard around this one)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tfsift-guard", daemon=True)
                self._thread.start()
            outer, self._armed = self._armed, (deadline, message)
            self._cond.notify()
            return outer

    def restore(self, armed: Armed | None) -> None:
        with self._cond:
            self._armed = armed
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._armed is None:
                        self._cond.wait()
                        continue
                    deadline, message = self._armed
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._armed = None
                        break
                    self._cond.wait(left)
            abort(message())  # does not return, but in tests that replace it


_TIMER = _Timer()


def abort(message: str, code: int = 1) -> NoReturn:
    """Writes ``tfsift: <message>; aborting the job`` to stderr and ends every rank.

    ``MPI_Abort`` makes the launcher (mpirun, horovodrun, ``tfsift run``) kill every
    process of the job and exit non-zero; it does not return.
    """
    sys.stdout.flush()
    sys.stderr.write(f"tfsift: {message}; aborting the job\n")
    sys.stderr.flush()
    # MPI_Abort makes mpirun kill the job at once; give its IO forwarding a moment to
    # deliver the line above first (without it the message was lost under load)
    time.sleep(0.5)
    MPI.COMM_WORLD.Abort(code)
    raise SystemExit(code)  # not reached: MPI_Abort ends the process


def rank_name(comm: Any, rank: int) -> str:
    """``rank R`` for rank ``rank`` of ``comm`` (R its ``COMM_WORLD`` rank), and its host
    when the job spans hosts: ``rank R, host H``."""
    return named(world_rank(comm, rank))


def named(rank: int) -> str:
    """``rank R`` (a ``COMM_WORLD`` rank), ``rank R, host H`` when the job spans hosts."""
    hosts = getattr(STATE.runtime, "hosts", ())
    return f"rank {rank}, host {hosts[rank]}" if hosts else f"rank {rank}"


def world_rank(comm: Any, rank: int) -> int:
    """The ``COMM_WORLD`` rank of ``rank`` in ``comm`` (for messages that name a peer)."""
    group, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        return int(MPI.Group.Translate_ranks(group, [rank], world)[0])
    finally:
        group.Free()
        world.Free()
