"""Stage-to-stage messages over MPI: activations forward, gradients backward.

Sends are non-blocking (``Isend`` of the tensor's bytes, completed at the end of
the step). Receives are non-blocking too, waited for by ``watchdog.wait``: a
waiting rank sleeps instead of spinning a core, and after the config's
``timeout`` seconds it ends the job with a message naming the peer and the
message it waited for. Both sides know every message's shapes and dtypes from
the traced graph, so no header travels with the data; ahead of each microbatch's
activations travels a fixed-size fingerprint of the step's inputs (``CHECK``), so
that a stage fed other data fails with a message instead of a truncated receive.
Messages between two stages are matched in order (MPI never reorders messages with
the same source, tag and communicator); the tag says direction and microbatch.
"""

from __future__ import annotations

import math
import os
import pickle
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
import tensorflow as tf
from mpi4py import MPI

from tfsift.parallel import runtime, watchdog
from tfsift.state import STATE

FORWARD, BACKWARD, CHECK = 0, 1, 2
_TAG_LIMIT = 1 << 13  # x 3 directions stays under 32767, the least tag bound MPI promises
# The fingerprint travels just ahead of the activations: a wait for it is a wait for them.
_CARGO = {FORWARD: "activations", BACKWARD: "gradients", CHECK: "activations"}
LATENCY_TRIPS = 20  # round trips timed by message_latency: about 10 ms in all on one host


class _Sent(NamedTuple):
    request: Any
    data: np.ndarray  # the bytes being sent: kept alive until the send completes
    dest: int
    direction: int
    microbatch: int


class IdleWork(Protocol):
    """Work a stage may do while it waits for a message (``PipeComm.recv``'s ``idle``)."""

    def run(self, microbatch: int, waited: float) -> bool:
        """Runs one unit, if one is left and expected to end before the message comes;
        whether it ran one. ``waited``: seconds since the receive was posted."""

    def arrived(self, microbatch: int, waited: float, exact: bool) -> None:
        """The message came ``waited`` seconds after the receive was posted (``exact``:
        no unit was running then; otherwise at some time during the last one)."""


class PipeComm:
    """Point-to-point messages between the stages of one pipeline.

    Args:
        comm: the pipeline's mpi4py communicator (its rank is the stage).
        timeout: seconds a receive (or the step's sends) may wait before the job is
            ended; by default the ``timeout`` of the config given to ``tfsift.init``.
    """

    def __init__(self, comm: Any, timeout: float | None = None, spin: float | None = None) -> None:
        self.comm = comm
        rt = runtime.get() if timeout is None else STATE.runtime
        self.timeout: float = rt.config.timeout if timeout is None else timeout
        if spin is None:  # a pipeline's receives are on its critical path: see watchdog
            spin = 0.0 if rt is None else watchdog.spin_for(rt.local_size, os.cpu_count())
        self.spin = spin
        self._pending: list[_Sent] = []

    def send(
        self,
        tensors: Sequence[tf.Tensor | np.ndarray],
        dest: int,
        direction: int,
        microbatch: int,
    ) -> None:
        """Starts sending ``tensors`` (or arrays) to stage ``dest``; their buffers live
        until ``wait``."""
        tag = _tag(direction, microbatch)
        for tensor in tensors:
            array = tensor if isinstance(tensor, np.ndarray) else tensor.numpy()
            data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            request = self.comm.Isend([data, MPI.BYTE], dest=dest, tag=tag)
            self._pending.append(_Sent(request, data, dest, direction, microbatch))

    def recv(
        self,
        specs: Sequence[tuple[tuple[int, ...], Any]],
        source: int,
        direction: int,
        microbatch: int,
        idle: IdleWork | None = None,
    ) -> list[tf.Tensor]:
        """Receives one tensor per ``(shape, dtype)`` in ``specs`` from stage ``source``.

        ``idle`` is asked to run a unit of its work for as long as the tensors have not
        arrived and it ran one, and is told when they arrived.
        Ends the job (``MPI_Abort``) if they have not all arrived after ``timeout`` s.
        """
        arrays = self.recv_arrays(specs, source, direction, microbatch, idle)
        # tf.constant: the same tensor as convert_to_tensor without its dispatch (see
        # tfsift.parallel.pydataset._tensor), once per tensor of every message
        return [tf.constant(a) for a in arrays]

    def recv_arrays(
        self,
        specs: Sequence[tuple[tuple[int, ...], Any]],
        source: int,
        direction: int,
        microbatch: int,
        idle: IdleWork | None = None,
    ) -> list[np.ndarray]:
        """``recv``, as NumPy arrays (a small message read on the host: no tensor copy)."""
        tag = _tag(direction, microbatch)
        arrays = [np.empty(shape, tf.as_dtype(dtype).as_numpy_dtype) for shape, dtype in specs]
        requests = [
            self.comm.Irecv([a.reshape(-1).view(np.uint8), MPI.BYTE], source=source, tag=tag)
            for a in arrays
        ]
        start, ran, exact = time.perf_counter(), False, True
        if idle is not None:
            while True:
                if MPI.Request.Testall(requests):
                    exact = not ran  # it came during the last unit, at an unknown time
                    break
                if not idle.run(microbatch, time.perf_counter() - start):
                    break
                ran = True
        if not watchdog.wait(requests, self.timeout, 0.0 if ran else self.spin):
            watchdog.abort(
                f"{self._me()} waited {self.timeout:g} s to receive the {_CARGO[direction]} "
                f"of microbatch {microbatch} from {self._peer(source)}"
            )
        if idle is not None:
            idle.arrived(microbatch, time.perf_counter() - start, exact)
        return arrays

    def wait(self) -> None:
        """Completes every send started since the last ``wait`` (bounded by ``timeout``)."""
        for sent in self._pending:  # in order: the first one not received is the one to name
            if not watchdog.wait([sent.request], self.timeout):
                watchdog.abort(
                    f"{self._me()} waited {self.timeout:g} s for {self._peer(sent.dest)} to "
                    f"receive the {_CARGO[sent.direction]} of microbatch {sent.microbatch}"
                )
        self._pending.clear()

    def _me(self) -> str:
        return f"rank {MPI.COMM_WORLD.Get_rank()}"

    def _peer(self, stage: int) -> str:
        return f"stage {stage} ({watchdog.rank_name(self.comm, stage)})"


def _tag(direction: int, microbatch: int) -> int:
    return (microbatch % _TAG_LIMIT) * 3 + direction


class StageBroadcast:
    """Broadcasts from stage ``root`` of a pipeline communicator, call after call, where
    the root does not wait for the other stages to receive.

    ``bcast_from_stage`` makes the root wait until its send completes, and a send over
    Open MPI's eager limit (4 KB in shared memory; a round's 1024 losses are 8 KB)
    completes only when the receiver has taken it: the root then starts its next step
    only when the slowest stage reached the broadcast. Here the root's send is
    completed by its next call or ``finish``, bounded by ``timeout``; the arrays it sent
    stay alive until then. The other stages wait for theirs as in ``bcast_from_stage``.

    Example:
        >>> losses = StageBroadcast(pipe, 0, 600.0, "early-exit losses")
        >>> losses([buffer])  # on stage 0 returns at once; elsewhere fills ``buffer``
    """

    def __init__(self, pipe: Any, root: int, timeout: float, what: str) -> None:
        self.pipe, self.root, self.timeout, self.what = pipe, root, timeout, what
        self._sending: tuple[list[Any], Sequence[np.ndarray]] | None = None

    def __call__(self, arrays: Sequence[np.ndarray]) -> None:
        """Starts broadcasting ``arrays`` (on the root), or receives them in place."""
        self.finish()
        requests = [self.pipe.Ibcast(a, root=self.root) for a in arrays]
        me = self.pipe.Get_rank()
        if me == self.root:
            self._sending = (requests, arrays)
        elif not watchdog.wait(requests, self.timeout):
            watchdog.abort(
                f"stage {me} ({watchdog.rank_name(self.pipe, me)}) waited "
                f"{self.timeout:g} s for stage {self.root} "
                f"({watchdog.rank_name(self.pipe, self.root)}) to broadcast the {self.what}"
            )

    def finish(self) -> None:
        """Completes the root's last broadcast: ends the job if a stage has not received
        it after ``timeout`` seconds."""
        sending, self._sending = self._sending, None
        if sending is not None and not watchdog.wait(sending[0], self.timeout):
            watchdog.abort(
                f"stage {self.root} ({watchdog.rank_name(self.pipe, self.root)}) waited "
                f"{self.timeout:g} s for the other stages to receive the {self.what}"
            )


def bcast_from_stage(
    pipe: Any, arrays: Sequence[np.ndarray], root: int, timeout: float, what: str
) -> None:
    """Broadcasts ``arrays`` in place from stage ``root`` of a pipeline communicator
    (ranked by stage), without blocking: a stage that waits longer than ``timeout`` ends
    the job, naming both stages and ``what`` it waited for. The root returns once every
    stage has received them (``StageBroadcast`` returns at once).

    Example:
        >>> bcast_from_stage(pipe, [values], 1, 600.0, "step's metric values")
    """
    broadcast = StageBroadcast(pipe, root, timeout, what)
    broadcast(arrays)
    broadcast.finish()


def bcast_object(comm: Any, value: Any, root: int = 0) -> Any:
    """``comm.bcast(value, root)`` (any picklable value) whose waiting ranks sleep.

    MPI's blocking ``bcast`` polls: while rank 0 profiled the model, every other rank
    kept a core busy waiting, and with more ranks than cores (4 ranks on 2 here) rank 0
    ran at half speed. Here the non-blocking broadcasts
    are waited for by ``watchdog.wait``, which sleeps; like ``bcast`` it waits as long
    as the root takes (profiling a large model may take minutes).

    Example:
        >>> bounds = bcast_object(world, solve() if world.Get_rank() == 0 else None)
    """
    if comm.Get_size() == 1:
        return value
    mine = comm.Get_rank() == root
    data = pickle.dumps(value, pickle.HIGHEST_PROTOCOL) if mine else b""
    header = np.array([len(data)], np.int64)
    watchdog.wait([comm.Ibcast(header, root=root)], math.inf)
    buffer = np.frombuffer(data, np.uint8).copy() if mine else np.empty(int(header[0]), np.uint8)
    watchdog.wait([comm.Ibcast(buffer, root=root)], math.inf)
    return value if mine else pickle.loads(buffer.tobytes())


def allgather_object(comm: Any, value: Any) -> list[Any]:
    """``comm.allgather(value)`` (any picklable value) whose waiting ranks sleep.

    MPI's blocking ``allgather`` polls: ranks that reached it first kept a core busy
    while the others still traced their step, and with more ranks than cores that
    slowed the ones they waited for. Like ``bcast_object`` it waits as long as the
    slowest rank takes.

    Example:
        >>> everyone = allgather_object(pipe_comm, describe(found))  # one per rank, in order
    """
    if comm.Get_size() == 1:
        return [value]
    data = np.frombuffer(pickle.dumps(value, pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.zeros(comm.Get_size(), np.int64)
    watchdog.wait([comm.Iallgather(np.array([data.size], np.int64), sizes)], math.inf)
    gathered = np.empty(int(sizes.sum()), np.uint8)
    layout = (sizes, None)  # displacements: the sizes' running sums
    watchdog.wait([comm.Iallgatherv([data, MPI.BYTE], [gathered, layout, MPI.BYTE])], math.inf)
    return [pickle.loads(part.tobytes()) for part in np.split(gathered, np.cumsum(sizes)[:-1])]


def message_latency(pipe: PipeComm, stage: int, trips: int = LATENCY_TRIPS) -> float:
    """Seconds a message between neighbouring stages takes to arrive, as a step's receive
    waits for it (``PipeComm.recv``: spinning, then sleeping): half the median round trip
    of a microbatch's messages with one-element tensors, after one trip to warm up.

    Stage 0 sends stage 1 a fingerprint and an activation (``CHECK``, ``FORWARD``) and
    receives a gradient back (``BACKWARD``), as the executor does; stage 1 answers. Both
    must call it; stage 0 gets the latency, every other stage 0 at once. The simulator
    charges it once per crossing of a stage boundary (``CostModel.latency``), where 1F1B,
    which waits on its neighbour more often than GPipe, pays it more often.

    Example:
        >>> latency = message_latency(PipeComm(rt.pipe_comm), rt.stage)  # stages 0 and 1
    """
    if stage > 1:
        return 0.0
    one = [np.zeros(1, np.float32)]
    spec = [((1,), tf.float32)]
    times = []
    for _ in range(trips + 1):
        start = time.perf_counter()
        if stage == 0:
            pipe.send([np.zeros(3)], 1, CHECK, 0)
            pipe.send(one, 1, FORWARD, 0)
            pipe.recv_arrays(spec, 1, BACKWARD, 0)
        else:
            pipe.recv_arrays([((3,), tf.float64)], 0, CHECK, 0)
            pipe.recv_arrays(spec, 0, FORWARD, 0)
            pipe.send(one, 0, BACKWARD, 0)
        pipe.wait()
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:])) / 2 if stage == 0 else 0.0
