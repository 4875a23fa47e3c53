"""Where each stage of each pipeline replica lives among the ranks.

With N ranks and K partitions there are R = N / K pipeline replicas. A rank
holds one stage ``s`` (its ``mp_rank``) of one replica ``r`` (its ``dp_rank``)::

    cluster (N=8, K=2): replica r = ranks [2r, 2r+1]   -> pipelines [0,1] [2,3] [4,5] [6,7]
    spread  (N=8, K=2): replica r = ranks [r, r+R]     -> pipelines [0,4] [1,5] [2,6] [3,7]

``cluster`` keeps a pipeline's point-to-point traffic on neighbouring ranks (one
host, with ranks filled host by host); ``spread`` puts a pipeline's stages on
different hosts so that each host holds whole data-parallel groups.
"""

from __future__ import annotations

import dataclasses

from tfsift.config import PLACEMENTS


@dataclasses.dataclass(frozen=True)
class Topology:
    """The rank layout of ``size`` ranks split into pipelines of ``partitions`` stages.

    Example:
        >>> Topology(8, 2, "spread").pipeline(1)
        (1, 5)
    """

    size: int
    partitions: int
    placement: str = "cluster"

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(
                f"placement_strategy must be one of {', '.join(map(repr, PLACEMENTS))}. "
                f"Received: placement_strategy={self.placement!r}"
            )
        if self.size % self.partitions:
            K = self.partitions
            n = K if self.size < K else self.size // K * K  # the launch nearest below
            first = f"{K} or a multiple of {K}" if self.size < K else f"a multiple of {K}"
            raise ValueError(
                f"world size {self.size} is not divisible by partitions={K}; launch {first} "
                f"processes, e.g. mpirun -np {n} python train.py, horovodrun -np {n} -H "
                f"localhost:{n} python train.py or tfsift run -np {n} train.py"
            )

    @property
    def replicas(self) -> int:
        """R, the number of pipeline replicas (the data-parallel degree)."""
        return self.size // self.partitions

    def rank(self, stage: int, replica: int) -> int:
        """The global rank holding ``stage`` of ``replica``."""
        if self.placement == "cluster":
            return replica * self.partitions + stage
        return stage * self.replicas + replica

    def stage(self, rank: int) -> int:
        """The stage (mp_rank) held by ``rank``."""
        self._check(rank)
        return rank % self.partitions if self.placement == "cluster" else rank // self.replicas

    def replica(self, rank: int) -> int:
        """The pipeline replica (dp_rank) ``rank`` belongs to."""
        self._check(rank)
        return rank // self.partitions if self.placement == "cluster" else rank % self.replicas

    def pipeline(self, replica: int) -> tuple[int, ...]:
        """The ranks of one pipeline replica, ordered by stage."""
        return tuple(self.rank(s, replica) for s in range(self.partitions))

    def dp_group(self, stage: int) -> tuple[int, ...]:
        """The ranks holding ``stage`` in every replica, ordered by replica."""
        return tuple(self.rank(stage, r) for r in range(self.replicas))

    def _check(self, rank: int) -> None:
        if not 0 <= rank < self.size:
            raise ValueError(f"rank must be in [0, {self.size}). Received: rank={rank}")
