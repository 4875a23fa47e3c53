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
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from tfsift.parallel.runtime import Runtime


class ReplicaGroup:
    """The ranks that hold this rank's stage in every replica (R of them)."""

    def __init__(self, rt: Runtime) -> None:
        self.replicas = rt.topology.replicas
        self.replica = rt.replica
        # A collective over the world: every rank builds its group at the same point.
        self._comm: Any = rt.world.Split(color=rt.stage, key=rt.replica)

    def allgather(self, values: np.ndarray) -> list[np.ndarray]:
        """Every replica's ``values``, in replica order."""
        if self.replicas == 1:
            return [values]
        return list(self._comm.allgather(np.ascontiguousarray(values)))

    def agree(self, values: list[int]) -> list[int]:
        """The elementwise minimum of ``values`` over the replicas."""
        if self.replicas == 1:
            return list(values)
        mine = np.asarray(values, dtype=np.int64)
        out = np.empty_like(mine)
        self._comm.Allreduce(mine, out, op=MPI.MIN)
        return [int(v) for v in out]

    def mean(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The elementwise mean of ``arrays`` over the replicas (one fused allreduce)."""
        if self.replicas == 1:
            return arrays
        flat = np.concatenate([a.reshape(-1) for a in arrays]).astype(np.float64)
        total = np.empty_like(flat)
        self._comm.Allreduce(flat, total, op=MPI.SUM)
        total /= self.replicas
        out, at = [], 0
        for a in arrays:
            out.append(total[at : at + a.size].reshape(a.shape).astype(a.dtype))
            at += a.size
        return out

    def bcast(self, value: Any) -> Any:
        """Replica 0's ``value`` on every replica."""
        return value if self.replicas == 1 else self._comm.bcast(value, root=0)

    def close(self) -> None:
        """Frees the communicator (collective over the group)."""
        if self._comm is not None:
            self._comm.Free()
            self._comm = None
