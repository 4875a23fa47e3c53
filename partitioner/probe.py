"""The boundary DP the solvers probe with: the cheapest cuts under per-stage limits.

A stage is a layer range [i, j) between boundaries i < j (boundary i sits before layer
i). Every limit the solvers need has the form

    (prefix[j] - prefix[i]) + start[i] + end[j] <= bound

with `prefix` nondecreasing and `start`, `end` >= 0: stage time (compute plus the input
and output transfers) and stage memory (state and activations plus in-flight inputs).
For a fixed end j, the starts i that pass split into a contiguous "sure" range, where
even the largest `start` passes, and a narrow "band" below it that is checked exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]
IntArray = npt.NDArray[np.int64]
_RELATIVE_SLACK = 1e-12  # margin against float rounding in the vectorised windows


@dataclass(frozen=True)
class Limit:
    """Stage [i, j) passes iff `(prefix[j] - prefix[i]) + start[i] + end[j] <= bound`.

    Build with `Limit.make`; `strict=True` turns `<=` into `<`.
    """

    prefix: Array
    bound: float
    start: Array | None
    end: Array | None
    strict: bool
    start_range: tuple[float, float]  # min and max of start over boundaries 0..L-1
    scale: float  # magnitude of the terms, for the rounding margin

    @classmethod
    def make(
        cls, prefix: Array, bound: float, start: Array | None = None, end: Array | None = None
    ) -> Limit:
        """A limit with the range of its start terms precomputed."""
        starts = np.zeros(1) if start is None else start[:-1]  # boundary L starts nothing
        low, high = float(starts.min()), float(starts.max())
        scale = max(abs(float(prefix[-1])), high, 0.0 if end is None else float(end.max()))
        return cls(prefix, bound, start, end, False, (low, high), scale)

    def with_bound(self, bound: float, strict: bool = False) -> Limit:
        """The same limit with another bound."""
        return dataclasses.replace(self, bound=bound, strict=strict)

    def allows(self, i: Array, j: Array | int) -> Array:
        """Exact test of stages [i, j), elementwise."""
        value = self.prefix[j] - self.prefix[i]
        if self.start is not None:
            value = value + self.start[i]
        if self.end is not None:
            value = value + self.end[j]
        return np.asarray(value < self.bound if self.strict else value <= self.bound)

    def window(self, j: Array) -> tuple[IntArray, IntArray]:
        """(possible, sure) per end: starts below `possible` fail, starts from `sure` pass."""
        shift = self.prefix[j] - self.bound
        if self.end is not None:
            shift = shift + self.end[j]
        slack = 0.0
        if self.prefix.dtype.kind == "f":
            finite = abs(self.bound) if np.isfinite(self.bound) else 0.0
            slack = _RELATIVE_SLACK * (self.scale + finite)
        side: Any = "right" if self.strict else "left"
        low, high = self.start_range
        possible = np.searchsorted(self.prefix, shift + low - slack, side=side)
        sure = np.searchsorted(self.prefix, shift + high + slack, side=side)
        return possible.astype(np.int64), sure.astype(np.int64)


def cheapest(
    L: int,
    K: int,
    cut: Array,
    limits: Sequence[Sequence[Limit]],
    spans: Sequence[tuple[int, int]] | None = None,
) -> tuple[float, tuple[int, ...]] | None:
    """Cheapest partition of L layers into K stages that meets every stage's limits.

    Dynamic programming over (stage, end boundary); a stage's transition is a
    sparse-table range minimum over the sure range plus exact checks over the band, so a
    probe costs O(K (L log L + band)) time and O(K L) memory, where the band holds about
    (spread of the start terms) / (per-layer prefix step) starts per end.

    Args:
        L: number of layers.
        K: number of stages.
        cut: cost of cutting at each boundary (length L + 1); the total is minimised.
        limits: limits[s] applies to stage s.
        spans: optional (lowest, highest) end boundary of each stage, to prune.

    Returns:
        (total cut cost, bounds) of a cheapest partition, or None if none meets the limits.
    """
    cost = np.full(L + 1, np.inf)
    cost[0] = 0.0
    history = [cost]
    for s in range(K):
        lo, hi = s + 1, L - (K - 1 - s)
        if spans is not None:
            lo, hi = max(lo, spans[s][0]), min(hi, spans[s][1])
        if s == K - 1:
            lo = max(lo, L)
        cost = _stage(history[-1] + cut, np.arange(lo, hi + 1), limits[s], L)
        if not np.isfinite(cost).any():
            return None
        history.append(cost)
    if not np.isfinite(cost[L]):
        return None
    return float(cost[L]), _backtrack(history, cut, limits, L)


def _stage(reach: Array, ends: IntArray, limits: Sequence[Limit], L: int) -> Array:
    """Cheapest way to end the next stage at each boundary in `ends`."""
    result = np.full(L + 1, np.inf)
    finite = np.flatnonzero(np.isfinite(reach))
    ends = ends[ends > finite[0]] if finite.size else ends[:0]
    if ends.size == 0:
        return result
    first, last = int(finite[0]), int(finite[-1])
    possible = np.full(ends.size, first, dtype=np.int64)
    sure = possible.copy()
    for limit in limits:
        p, q = limit.window(ends)
        possible, sure = np.maximum(possible, p), np.maximum(sure, q)
    top = np.minimum(ends, last + 1)
    sure = np.minimum(sure, top)
    possible = np.minimum(possible, sure)
    best = _range_min(reach[first : last + 1], sure - first, top - first)
    result[ends] = np.minimum(best, _band_min(reach, ends, possible, sure, limits))
    return result


def _range_min(values: Array, lo: IntArray, hi: IntArray) -> Array:
    """min(values[lo:hi]) per query (inf when empty), with a sparse table."""
    out = np.full(lo.size, np.inf)
    width = hi - lo
    ok = width > 0
    if not ok.any():
        return out
    levels = int(width.max()).bit_length()
    table = np.full((levels, values.size), np.inf)
    table[0] = values
    for k in range(1, levels):
        step = 1 << (k - 1)
        table[k, : values.size - step] = np.minimum(table[k - 1, :-step], table[k - 1, step:])
    level = np.frexp(width[ok].astype(np.float64))[1] - 1
    lo_ok, hi_ok = lo[ok], hi[ok]
    out[ok] = np.minimum(table[level, lo_ok], table[level, hi_ok - (1 << level)])
    return out


def _band_min(
    reach: Array, ends: IntArray, possible: IntArray, sure: IntArray, limits: Sequence[Limit]
) -> Array:
    """Exact minimum over the band [possible, sure) of each end."""
    out = np.full(ends.size, np.inf)
    width = sure - possible
    total = int(width.sum())
    if total == 0:
        return out
    offsets = np.cumsum(width) - width
    row = np.repeat(np.arange(ends.size), width)
    starts = possible[row] + (np.arange(total) - offsets[row])
    stops = ends[row]
    ok = np.ones(total, dtype=bool)
    for limit in limits:
        ok &= limit.allows(starts, stops)
    values = np.where(ok, reach[starts], np.inf)
    nonempty = width > 0
    out[nonempty] = np.minimum.reduceat(values, offsets[nonempty])
    return out


def _backtrack(
    history: list[Array], cut: Array, limits: Sequence[Sequence[Limit]], L: int
) -> tuple[int, ...]:
    """Recovers the bounds of the optimum from the per-stage cost arrays."""
    bounds = [L]
    for s in range(len(history) - 2, 0, -1):
        end = bounds[-1]
        starts = np.arange(s, end)
        ok = (history[s][starts] + cut[starts]) == history[s + 1][end]
        for limit in limits[s]:
            ok &= limit.allows(starts, end)
        bounds.append(int(starts[ok][-1]))
    bounds.append(0)
    return tuple(reversed(bounds))
