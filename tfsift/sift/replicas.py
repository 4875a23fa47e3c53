"""What the data-parallel replicas of a sifted dataset agree on, over a communicator of their own.

Every rank of one pipeline reads the same source batches and receives the same
losses (the scorer broadcasts them along the pipeline), so the replicas only need
to agree among themselves. Each stage's ranks of all R replicas form one group
(rank order = replica order); every group computes the same agreements, so no
message ever crosses a pipeline. The communicator is a fresh split of the world,
never the pipeline's, so a sifting collective cannot be matched with a step's
activation message.

Per source round the replicas exchange two things:

- ``allgather``: every replica's scored losses, in replica order, so the loss
  history (and so every percentile) is identical on every rank (with
  ``scores="training"`` also the losses recorded from the training steps, so every
  replica holds the same score table);
- ``agree``: an elementwise MIN of small integer vectors, e.g. [batches ready, more
  data upstream], so every replica yields the same number of batches and all stop
  together when the shortest shard runs out.

Every collective of a round is non-blocking and waited on with the watchdog: a replica
that stalls makes the others end the job after the config's ``timeout`` (naming what
they waited for) instead of waiting forever in an MPI call.

Every replica must call these collectives in the same order. Each exchange sends a
code of its own along (two more values), so that replicas out of step end the job
saying which exchanges met, even where the collectives match in MPI (two agreements on
one value each, say) and would otherwise combine unrelated numbers without an error.
"""

from __future__ import annotations

import pickle
from typing import Any, NoReturn

import numpy as np
from mpi4py import MPI

from tfsift.parallel import watchdog
from tfsift.parallel.runtime import Runtime

# What the replicas exchange, named in messages; an exchange's code is its place here + 1
LOSSES = "the sifting round's losses"
COUNTS = "the sifting round's batch counts"
FULL_BATCHES = "the epoch end's count of full batches"
REMAINDER = "the epoch end's remainder"
HEAD_GRADIENTS = "the sifting round's exit head gradients"
HEAD_WEIGHTS = "the exit head's first weights"
DEFAULT_EXIT = "the default exit replica 0 chose"
RECORDS = "the losses recorded from the training steps"
EXCHANGES = (
    LOSSES,
    COUNTS,
    FULL_BATCHES,
    REMAINDER,
    HEAD_GRADIENTS,
    HEAD_WEIGHTS,
    DEFAULT_EXIT,
    RECORDS,
)


class ReplicaGroup:
    """The ranks that hold this rank's stage in every replica (R of them)."""

    def __init__(self, rt: Runtime) -> None:
        self.replicas = rt.topology.replicas
        self.replica = rt.replica
        self.timeout = rt.config.timeout
        self._rank, self._stage = rt.rank, rt.stage
        # A collective over the world: every rank builds its group at the same point.
        self._comm: Any = rt.world.Split(color=rt.stage, key=rt.replica)

    def allgather(self, values: np.ndarray, what: str = LOSSES) -> list[np.ndarray]:
        """Every replica's ``values`` (float64), in replica order; ``what`` they are, one
        of ``EXCHANGES`` (the round's losses unless told)."""
        if self.replicas == 1:
            return [values]
        mine = np.ascontiguousarray(values, dtype=np.float64)
        code = _code(what)
        sizes = np.empty(2 * self.replicas, np.int64)  # each replica's [size, code]
        self._wait(self._comm.Iallgather(np.array([mine.size, code], np.int64), sizes), what)
        counts, codes = sizes[0::2], sizes[1::2]
        if (codes != code).any():
            self._out_of_step(what, set(codes.tolist()) - {code})
        out = np.empty(int(counts.sum()), np.float64)
        request = self._comm.Iallgatherv(mine, [out, (counts, None), MPI.DOUBLE])
        self._wait(request, what)
        return np.split(out, np.cumsum(counts)[:-1])

    def agree(self, values: list[int], what: str) -> list[int]:
        """The elementwise minimum of ``values`` over the replicas; ``what`` they are, one
        of ``EXCHANGES``."""
        if self.replicas == 1:
            return list(values)
        code = _code(what)
        # the minimum of code and of -code: the least and the greatest code of the replicas
        mine = np.asarray([code, -code, *values], dtype=np.int64)
        out = np.empty_like(mine)
        self._wait(self._comm.Iallreduce(mine, out, op=MPI.MIN), what)
        if out[0] != code or -out[1] != code:
            self._out_of_step(what, {int(out[0]), int(-out[1])} - {code})
        return [int(v) for v in out[2:]]

    def mean(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The elementwise mean of the exit head's ``arrays`` over the replicas (one fused
        allreduce)."""
        if self.replicas == 1:
            return arrays
        code = _code(HEAD_GRADIENTS)
        # sums of code and code**2 are R code and R code**2 only if every replica's is code
        tag = np.array([code, code * code], np.float64)
        flat = np.concatenate([*(a.reshape(-1) for a in arrays), tag]).astype(np.float64)
        total = np.empty_like(flat)
        self._wait(self._comm.Iallreduce(flat, total, op=MPI.SUM), HEAD_GRADIENTS)
        if (total[-2:] != self.replicas * tag).any():
            self._out_of_step(HEAD_GRADIENTS, None)
        total = total[:-2] / self.replicas
        out, at = [], 0
        for a in arrays:
            out.append(total[at : at + a.size].reshape(a.shape).astype(a.dtype))
            at += a.size
        return out

    def _out_of_step(self, what: str, others: set[int] | None) -> NoReturn:
        """Ends the job: this replica's exchange ``what`` met others' (their codes, None
        where a sum hides them) in a collective that matched in MPI."""
        if others is None:
            theirs = "exchange of something else"
        else:
            names = [EXCHANGES[c - 1] if 0 < c <= len(EXCHANGES) else f"code {c}" for c in others]
            theirs = "exchange of " + " and ".join(sorted(names))
        watchdog.abort(
            f"rank {self._rank}'s exchange of {what} with the other replicas of stage "
            f"{self._stage} met another replica's {theirs}: the replicas called sifting's "
            "collectives out of step (a bug in tfsift: please report it with this message)"
        )

    def _wait(self, request: Any, what: str) -> None:
        try:
            done = watchdog.wait([request], self.timeout)
        except MPI.Exception as error:
            # Every replica must call these collectives in the same order. One that took a
            # branch on its own state (eaef77e and dbbe3a2 fixed two) makes this one meet
            # a collective of another size, and MPI reports only "MPI_ERR_IN_STATUS".
            watchdog.abort(
                f"rank {self._rank}'s exchange of {what} with the other "
                f"replicas of stage {self._stage} failed in MPI ({error.Get_error_string()}): "
                "the replicas called sifting's collectives out of step, and this one met a "
                "different collective (a bug in tfsift: please report it with this message)"
            )
        if not done:
            watchdog.abort(
                f"rank {self._rank} waited {self.timeout:g} s for the other replicas of stage "
                f"{self._stage} to exchange {what} (a replica stalled)"
            )

    def bcast(self, value: Any, what: str) -> Any:
        """Replica 0's ``value`` (anything picklable) on every replica; ``what`` it is, one
        of ``EXCHANGES``. Non-blocking and watched, as the rounds' exchanges: with MPI's
        blocking ``bcast`` the other replicas waited forever for a replica 0 that stalled
        before it (test_sift_mpi)."""
        if self.replicas == 1:
            return value
        code = _code(what)
        data = pickle.dumps(value, pickle.HIGHEST_PROTOCOL) if self.replica == 0 else b""
        header = np.array([code, len(data)], np.int64)  # replica 0's, on every replica
        self._wait(self._comm.Ibcast(header, root=0), what)
        if header[0] != code:
            self._out_of_step(what, {int(header[0])})
        if self.replica == 0:
            self._wait(self._comm.Ibcast(np.frombuffer(data, np.uint8).copy(), root=0), what)
            return value
        buffer = np.empty(int(header[1]), np.uint8)
        self._wait(self._comm.Ibcast(buffer, root=0), what)
        return pickle.loads(buffer.tobytes())

    def close(self) -> None:
        """Frees the communicator (collective over the group)."""
        if self._comm is not None:
            self._comm.Free()
            self._comm = None


def _code(what: str) -> int:
    return EXCHANGES.index(what) + 1
