"""A split of a layer chain into K contiguous stages."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Partition:
    """Stage boundaries: stage `s` holds layers `[bounds[s], bounds[s + 1])`.

    Example:
        >>> p = Partition((0, 2, 5))
        >>> p.num_stages, p.sizes(), p.stage_of(3)
        (2, (2, 3), 1)

    Args:
        bounds: K + 1 strictly increasing integers from 0 to L.

    Raises:
        ValueError: if the bounds do not start at 0 or are not strictly increasing.
    """

    bounds: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "bounds", tuple(self.bounds))
        b = self.bounds
        if len(b) < 2 or any(not isinstance(x, int) or isinstance(x, bool) for x in b):
            raise ValueError(f"bounds must hold at least two integers. Received: bounds={b}")
        if b[0] != 0:
            raise ValueError(f"bounds must start at 0. Received: bounds={b}")
        if any(lo >= hi for lo, hi in itertools.pairwise(b)):
            raise ValueError(
                f"bounds must be strictly increasing (no empty stage). Received: bounds={b}"
            )

    @classmethod
    def from_sizes(cls, sizes: Sequence[int]) -> Partition:
        """The partition whose stages hold `sizes[s]` layers each."""
        bounds = [0]
        for size in sizes:
            bounds.append(bounds[-1] + size)
        return cls(tuple(bounds))

    @property
    def num_stages(self) -> int:
        """K, the number of stages."""
        return len(self.bounds) - 1

    @property
    def num_layers(self) -> int:
        """L, the number of layers covered."""
        return self.bounds[-1]

    def stage_layers(self, s: int) -> range:
        """Indices of the layers on stage `s`."""
        if not 0 <= s < self.num_stages:
            raise ValueError(f"stage index must be in [0, {self.num_stages}). Received: s={s}")
        return range(self.bounds[s], self.bounds[s + 1])

    def stage_of(self, layer: int) -> int:
        """Index of the stage that holds `layer`."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(
                f"layer index must be in [0, {self.num_layers}). Received: layer={layer}"
            )
        return bisect.bisect_right(self.bounds, layer) - 1

    def sizes(self) -> tuple[int, ...]:
        """Number of layers on each stage."""
        return tuple(hi - lo for lo, hi in zip(self.bounds, self.bounds[1:], strict=False))

    def validated(self, num_layers: int) -> Partition:
        """Returns self if it covers exactly `num_layers` layers, else raises ValueError."""
        if self.num_layers != num_layers:
            raise ValueError(
                f"partition must cover all {num_layers} layers of the cost model. "
                f"Received: bounds={self.bounds}"
            )
        return self

    def __str__(self) -> str:
        return "|".join(
            f"{lo}..{hi - 1}" for lo, hi in zip(self.bounds, self.bounds[1:], strict=False)
        )
