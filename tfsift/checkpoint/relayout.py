"""Rank states saved by another layout: the sifting state that carries over, and whose.

Restored into another number of replicas or stages, a checkpoint's weights and optimizer
state load by layer path; the rank states (``state-r<r>-s<s>.npz``) were each one rank's,
and only the sifting state of a dataset sifted by row has a meaning under another layout
(``tfsift.sift.relayout``): every rank of the new layout reads the saved replicas' states
of stage 0 (every stage of a replica holds the same sifting state) and takes old replica
0's plan and position with the records of the old replicas r with r mod R' = its replica.
"""

from __future__ import annotations

from typing import Any

from tfsift.checkpoint import codec
from tfsift.checkpoint.manifest import state_file
from tfsift.checkpoint.store import Checkpoint
from tfsift.parallel import runtime
from tfsift.sift import relayout


def sift_state(ckpt: Checkpoint, saved_replicas: int, rt: runtime.Runtime) -> dict[str, Any] | None:
    """The sifting state this rank loads from ``ckpt``, saved by ``saved_replicas``
    replicas, or None when it does not carry over (no sifted dataset, or one sifted as
    it streams)."""

    def saved(replica: int) -> Any:
        return codec.unpack(ckpt.arrays(state_file(replica, 0)))["sift"]

    base = saved(0)
    if not relayout.carries(base):
        return None
    R = rt.topology.replicas
    shares = [saved(r) for r in range(saved_replicas) if r % R == rt.replica]
    return relayout.carried(base, shares)
