"""Sifting's scoring on stage 0: how much of it the step's waits hold, and what is left.

Sifting with early exit at stage 0's end and overlap (``tfsift.sift``) makes stage 0 run,
per step, S more forwards of its layers on a microbatch (S = M / kept fraction: one
source batch is M microbatches). It runs them in units while it waits for gradients: a
unit of k source batches is one call, costing a fixed c (the exit head, the call and
reading the losses) plus k M f_0 (f_0: stage 0's forward seconds per microbatch). A
unit starts only where the wait has room for it, as the runtime's ``WaitModel`` does, so
a wait w holds floor((w - c) / (M f_0)) source batches; what no wait holds is scored in
one call between steps, where every stage waits for it. On a 2-stage 1F1B pipeline
(F forward, B backward, digits the microbatch, ``.`` a wait of stage 0)::

    stage 0:  F0 F1 .... B0 F2 .... B1 F3 .... B2 .... B3
    stage 1:     F0 B0 F1 B1 F2 B2 F3 B3

Stage 0 waits before each backward, so what fits is decided per wait, not by its idle
time in all: waits of 0.7 ms hold no unit of 1 ms, however many there are. A plan for
sifting is the partition with the least ``sifted_step_time``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from partitioner.costs import CostModel
from partitioner.partition import Partition
from partitioner.simulator import Event, simulate_plan


def sifted_step_time(
    costs: CostModel,
    partition: Partition,
    M: int,
    *,
    pipeline: str,
    scoring: float,
    call: float = 0.0,
) -> float:
    """The simulated step of ``partition`` plus stage 0's scoring that its waits do not hold.

    Example:
        >>> from partitioner.costs import LayerCost
        >>> costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 0) for i in range(4)))
        >>> # 2 source batches a step. Stage 0 = l0, l1 waits 4 s and 2 s: a source batch
        >>> # (1 s + 4 * 2 s) fits in neither; both cost the step 1 s + 2 * 8 s
        >>> sifted_step_time(costs, Partition((0, 2, 4)), 4, pipeline="interleaved",
        ...                  scoring=8, call=1.0)
        47.0
        >>> # stage 0 = l0 waits 8, 6, 6 and 7 s: a source batch (1 s + 4 s) fits in each
        >>> sifted_step_time(costs, Partition((0, 1, 4)), 4, pipeline="interleaved",
        ...                  scoring=8, call=1.0)
        39.0

    Args:
        costs: the cost model.
        partition: the stage boundaries.
        M: microbatches per step.
        pipeline: "interleaved" or "simple".
        scoring: S, forwards of stage 0's layers on a microbatch per step (M per source
            batch scored).
        call: c, the fixed seconds of one scoring call beyond its forwards.

    Returns:
        Seconds per step.
    """
    result = simulate_plan(costs, partition, M, pipeline=pipeline)
    forward = M * float(costs.prefix.forward[partition.bounds[1]])  # one source batch
    left = unheld(stage_waits(result.events), scoring / M, forward, call)
    return result.step_time + left * forward + call * min(left, 1.0)


def stage_waits(events: Sequence[Event]) -> list[float]:
    """Stage 0's waits between its actions (``simulator.Event``s), in order; the time
    after its last action is not one: the step ends for stage 0 there."""
    own = sorted((e for e in events if e.stage == 0), key=lambda e: e.start)
    return [b.start - a.end for a, b in itertools.pairwise(own)]


def unheld(waits: Sequence[float], batches: float, forward: float, call: float) -> float:
    """Source batches (of ``batches``) that no wait holds: each wait w takes as many as
    fit whole, floor((w - call) / forward), in one call of fixed cost ``call``.

    Example:
        >>> unheld([0.7, 0.7, 3.0], 2.0, forward=1.0, call=0.5)  # 0.7 < 1.5; 3.0 holds 2
        0.0
        >>> unheld([0.7, 0.7, 2.0], 2.0, forward=1.0, call=0.5)
        1.0
    """
    left = batches
    for wait in waits:
        if left <= 0:
            break
        room = wait - call
        if room <= 0:
            continue
        ratio = room / forward if forward > 0 else math.inf
        # a forward too short to measure (a denormal) overflows the ratio: all fit
        fits = math.floor(ratio + 1e-12) if math.isfinite(ratio) else math.inf
        left -= min(left, fits)
    return max(left, 0.0)
