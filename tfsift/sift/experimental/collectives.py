"""The exit head's exchanges between the replicas: its gradients' mean, replica 0's values.

``HeadGroup`` wraps the sifted dataset's ``ReplicaGroup`` (``tfsift.sift.replicas``): its
communicator, its watched waits and its codes, so that these are non-blocking, bounded
by the config's ``timeout`` and checked for replicas out of step as the rounds' own
exchanges are.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
from mpi4py import MPI

from tfsift.sift.replicas import HEAD_GRADIENTS, ReplicaGroup, exchange_code


class HeadGroup:
    """The replicas of this rank's stage, as the early-exit scorer and its head see them."""

    def __init__(self, group: ReplicaGroup) -> None:
        self.group, self.replicas, self.replica = group, group.replicas, group.replica

    def mean(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The elementwise mean of the exit head's ``arrays`` over the replicas (one fused
        allreduce)."""
        if self.replicas == 1:
            return arrays
        group, code = self.group, exchange_code(HEAD_GRADIENTS)
        # sums of code and code**2 are R code and R code**2 only if every replica's is code
        tag = np.array([code, code * code], np.float64)
        flat = np.concatenate([*(a.reshape(-1) for a in arrays), tag]).astype(np.float64)
        total = np.empty_like(flat)
        group.wait(group.comm.Iallreduce(flat, total, op=MPI.SUM), HEAD_GRADIENTS)
        if (total[-2:] != self.replicas * tag).any():
            group.out_of_step(HEAD_GRADIENTS, None)
        total = total[:-2] / self.replicas
        out, at = [], 0
        for a in arrays:
            out.append(total[at : at + a.size].reshape(a.shape).astype(a.dtype))
            at += a.size
        return out

    def bcast(self, value: Any, what: str) -> Any:
        """Replica 0's ``value`` (anything picklable) on every replica; ``what`` it is, one
        of ``EXCHANGES``. Non-blocking and watched, as the rounds' exchanges: with MPI's
        blocking ``bcast`` the other replicas waited forever for a replica 0 that stalled
        before it (test_sift_mpi)."""
        if self.replicas == 1:
            return value
        group, code = self.group, exchange_code(what)
        data = pickle.dumps(value, pickle.HIGHEST_PROTOCOL) if self.replica == 0 else b""
        header = np.array([code, len(data)], np.int64)  # replica 0's, on every replica
        group.wait(group.comm.Ibcast(header, root=0), what)
        if header[0] != code:
            group.out_of_step(what, {int(header[0])})
        if self.replica == 0:
            group.wait(group.comm.Ibcast(np.frombuffer(data, np.uint8).copy(), root=0), what)
            return value
        buffer = np.empty(int(header[1]), np.uint8)
        group.wait(group.comm.Ibcast(buffer, root=0), what)
        return pickle.loads(buffer.tobytes())
