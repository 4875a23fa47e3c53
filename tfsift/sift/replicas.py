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
  history (and so every percentile) is identical on every rank;
- ``agree``: an elementwise MIN of small integer vectors, e.g. [batches ready, more
  data upstream], so every replica yields the same number of batches and all stop
  together when the shortest shard runs out.

Every collective of a round is non-blocking and waited on with the watchdog: a replica
that stalls makes the others end the job after the config's ``timeout`` (naming what
they waited for) instead of waiting forever in an MPI call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from tfsift.parallel import watchdog
from tfsift.parallel.runtime import Runtime


class ReplicaGroup:
    """The ranks that hold this rank's stage in every replica (R of them)."""

    def __init__(self, rt: Runtime) -> None:
        self.replicas = rt.topology.replicas
        self.replica = rt.replica
        self.timeout = rt.config.timeout
        self._rank, self._stage = rt.rank, rt.stage
        # A collective over the world: every rank builds its group at the same point.
        self._comm: Any = rt.world.Split(color=rt.stage, key=rt.replica)

    def allgather(self, values: np.ndarray) -> list[np.ndarray]:
        """Every replica's ``values``, in replica order."""
        if self.replicas == 1:
            return [values]
        mine = np.ascontiguousarray(values, dtype=np.float64)
        counts = np.empty(self.replicas, np.int64)
        self._wait(self._comm.Iallgather(np.array([mine.size], np.int64), counts), "losses")
        out = np.empty(int(counts.sum()), np.float64)
        request = self._comm.Iallgatherv(mine, [out, (counts, None), MPI.DOUBLE])
        self._wait(request, "losses")
        return np.split(out, np.cumsum(counts)[:-1])

    def agree(self, values: list[int]) -> list[int]:
        """The elementwise minimum of ``values`` over the replicas."""
        if self.replicas == 1:
            return list(values)
        mine = np.asarray(values, dtype=np.int64)
        out = np.empty_like(mine)
        self._wait(self._comm.Iallreduce(mine, out, op=MPI.MIN), "batch counts")
        return [int(v) for v in out]

    def mean(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The elementwise mean of ``arrays`` over the replicas (one fused allreduce)."""
        if self.replicas == 1:
            return arrays
        flat = np.concatenate([a.reshape(-1) for a in arrays]).astype(np.float64)
        total = np.empty_like(flat)
        self._wait(self._comm.Iallreduce(flat, total, op=MPI.SUM), "exit head gradients")
        total /= self.replicas
        out, at = [], 0
        for a in arrays:
            out.append(total[at : at + a.size].reshape(a.shape).astype(a.dtype))
            at += a.size
        return out

    def _wait(self, request: Any, what: str) -> None:
        try:
            done = watchdog.wait([request], self.timeout)
        except MPI.Exception as error:
            # Every replica must call these collectives in the same order. One that took a
            # branch on its own state (eaef77e and dbbe3a2 fixed two) makes this one meet
            # a collective of another size, and MPI reports only "MPI_ERR_IN_STATUS".
            watchdog.abort(
                f"rank {self._rank}'s exchange of the sifting round's {what} with the other "
                f"replicas of stage {self._stage} failed in MPI ({error.Get_error_string()}): "
                "the replicas called sifting's collectives out of step, and this one met a "
                "different collective (a bug in tfsift: please report it with this message)"
            )
        if not done:
            watchdog.abort(
                f"rank {self._rank} waited {self.timeout:g} s for the other replicas of stage "
                f"{self._stage} to exchange the sifting round's {what} (a replica stalled)"
            )

    def bcast(self, value: Any) -> Any:
        """Replica 0's ``value`` on every replica."""
        return value if self.replicas == 1 else self._comm.bcast(value, root=0)

    def close(self) -> None:
        """Frees the communicator (collective over the group)."""
        if self._comm is not None:
            self._comm.Free()
            self._comm = None
