"""An event simulation of one training step of a schedule on a partitioned chain.

Each stage runs its compute actions in schedule order. F(s, m) starts when stage s is
free and F(s - 1, m) has ended plus the transfer time of the cut between them; B(s, m)
likewise waits for B(s + 1, m); W(s, m) waits for nothing but stage s. Transfers are
link delays: they never occupy a stage. With v virtual stages the partition holds K v
chunks and s above is a chunk; a rank (a row of the schedule) runs its chunks' actions
one at a time, each paying the runtime's cost per action, and every chunk boundary is a
transfer, K v - 1 of them against K - 1.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from partitioner.costs import CostModel
from partitioner.partition import Partition
from partitioner.schedule import (
    COMPUTE,
    Action,
    Kind,
    Schedule,
    ScheduleError,
    build,
    splits_backward,
    splits_stage,
    validate,
)


@dataclass(frozen=True)
class Event:
    """One compute action as it ran: stage, action and its [start, end) in seconds."""

    stage: int
    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class SimResult:
    """What one simulated step costs.

    Args:
        step_time: seconds from the first start to the last end.
        busy: seconds each stage computes.
        idle: `step_time - busy[s]`.
        bubble_fraction: `1 - sum(busy) / (K * step_time)`.
        peak_memory: peak bytes held by each stage.
        events: every compute action with its start and end.
    """

    step_time: float
    busy: tuple[float, ...]
    idle: tuple[float, ...]
    bubble_fraction: float
    peak_memory: tuple[int, ...]
    events: tuple[Event, ...]


def stage_times(costs: CostModel, partition: Partition) -> tuple[tuple[float, ...], ...]:
    """(forward, backward) seconds of each stage for one microbatch, the runtime's
    ``action_overhead`` included."""
    p, extra = costs.prefix, costs.action_overhead
    b = partition.validated(costs.num_layers).bounds
    return tuple(
        (
            float(p.forward[hi] - p.forward[lo]) + extra,
            float(p.backward[hi] - p.backward[lo]) + extra,
        )
        for lo, hi in itertools.pairwise(b)
    )


def action_seconds(
    costs: CostModel, partition: Partition, *, split: bool = False, recompute: bool = False
) -> tuple[dict[Kind, float], ...]:
    """Seconds of each stage's F, B and W for one microbatch, ``action_overhead`` included.

    A recomputing backward reruns the forward's layers inside its own call (their compute,
    not a second overhead). With ``split`` (a schedule with W actions) a stage that
    `splits_stage` gives W the weight gradients' share of its backward
    (`partitioner.costs.WEIGHT_SHARE`) and an overhead of its own; elsewhere W is empty.
    """
    p, extra = costs.prefix, costs.action_overhead
    b = partition.validated(costs.num_layers).bounds
    seconds = []
    for s, (forward, backward) in enumerate(stage_times(costs, partition)):
        again = (forward - extra) * recompute
        times = {Kind.FORWARD: forward, Kind.BACKWARD: backward + again, Kind.WEIGHT: 0.0}
        if split and splits_stage(s, recompute):
            weights = float(p.weight_backward[b[s + 1]] - p.weight_backward[b[s]])
            times[Kind.BACKWARD], times[Kind.WEIGHT] = backward - weights, weights + extra
        seconds.append(times)
    return tuple(seconds)


def stage_memory(costs: CostModel, partition: Partition, s: int) -> tuple[int, int, int]:
    """(state, activation, input) bytes of stage s, per microbatch where it applies.

    State is the weights times the optimizer multiplier (copies of shared weights
    included); activation is what the forward keeps for the backward; input is what
    crosses the stage's input cut (0 on stage 0).
    """
    p = costs.prefix
    lo, hi = partition.validated(costs.num_layers).bounds[s : s + 2]
    state = int(p.state_bytes[hi] - p.state_bytes[lo]) + costs.copy_bytes(lo, hi)
    return state, int(p.activation_bytes[hi] - p.activation_bytes[lo]), int(p.input_bytes[lo])


def rank_state(costs: CostModel, partition: Partition, s: int, K: int) -> int:
    """State bytes of rank s of K running chunks s, s + K, ... of `partition` (virtual
    stages): theirs, and one copy of each shared weight they call that another rank owns."""
    p, b = costs.prefix, partition.validated(costs.num_layers).bounds
    spans = [(b[c], b[c + 1]) for c in range(s, partition.num_stages, K)]
    return sum(int(p.state_bytes[hi] - p.state_bytes[lo]) for lo, hi in spans) + (
        costs.copy_bytes(*spans[0], *spans[1:])
    )


def peak_memory(
    costs: CostModel,
    partition: Partition,
    schedule: Schedule,
    *,
    recompute: bool = False,
    virtual_stages: int = 1,
) -> tuple[int, ...]:
    """Peak bytes of each stage, walking its actions in order (timing does not matter).

    Without recompute each F keeps the stage activations until its B. With recompute
    each F keeps only the stage input, and the activations live transiently during every
    F and B. A stage without backwards (evaluation) keeps nothing between actions. A
    stage that splits its backward (`splits_stage`) keeps the activations until W, and
    from B to W also the output gradients of its layers with weights. With
    ``virtual_stages``, per rank: its chunks' state (`rank_state`) and what each F of
    each chunk keeps.
    """
    split = splits_backward(schedule)
    p, b = costs.prefix, partition.validated(costs.num_layers).bounds
    K = partition.num_stages // virtual_stages
    chunks = [stage_memory(costs, partition, c)[1:] for c in range(partition.num_stages)]
    grads = [
        int(p.weight_grad_bytes[b[c + 1]] - p.weight_grad_bytes[b[c]])
        if split and splits_stage(c, recompute)
        else None
        for c in range(partition.num_stages)
    ]
    return tuple(
        (
            stage_memory(costs, partition, s)[0]
            if virtual_stages == 1
            else rank_state(costs, partition, s, K)
        )
        + _held_peak(chunks, schedule[s], recompute, grads)
        for s in range(K)
    )


def _held_peak(
    chunks: Sequence[tuple[int, int]],
    row: list[Action],
    recompute: bool,
    grads: Sequence[int | None],
) -> int:
    """The most a row's actions hold at once beyond the state: ``chunks`` (activation,
    input) bytes of each stage per microbatch; ``grads`` the output gradients a split stage
    keeps from B to W (None: not split)."""
    training = any(a.kind is Kind.BACKWARD for a in row)
    held = peak = 0
    for a in row:
        (activation, inputs), grad = chunks[a.stage], grads[a.stage]
        kept = inputs if recompute else activation
        frees = Kind.BACKWARD if grad is None else Kind.WEIGHT
        if a.kind is Kind.FORWARD and training:
            held += kept
        if a.kind is Kind.BACKWARD and grad is not None:
            held += grad
        if a.kind in COMPUTE and (a.kind is not Kind.WEIGHT or grad is not None):
            peak = max(peak, held + (activation if recompute or not training else 0))
        if a.kind is frees:
            held -= kept + (grad or 0)
    return peak


def simulate(
    costs: CostModel,
    partition: Partition,
    schedule: Schedule,
    *,
    recompute: bool = False,
    virtual_stages: int = 1,
) -> SimResult:
    """Simulates one step of `schedule` (with or without transfer actions).

    Example:
        >>> from partitioner.costs import LayerCost
        >>> from partitioner.schedule import build
        >>> costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 0) for i in range(2)))
        >>> simulate(costs, Partition((0, 1, 2)), build("interleaved", 2, 4)).step_time
        15.0

    Args:
        costs: the cost model.
        partition: stage boundaries; must cover every layer of `costs`.
        schedule: one row of actions per stage; validated first.
        recompute: each B reruns the stage forward's layers first (in the same call: no
            second ``action_overhead``) and F keeps only its input; no stage splits its
            backward (`splits_stage`).
        virtual_stages: v; `partition` holds K v chunks and `schedule` K rows (ranks).

    Returns:
        Step time, per-stage busy and idle time, bubble fraction, peak memory and events
        (per rank with virtual stages: an event's ``stage`` is its rank, its action's the
        chunk).

    Raises:
        ValueError: if the partition does not fit the costs or the schedule.
        ScheduleError: if the schedule is invalid.
    """
    C, v = partition.validated(costs.num_layers).num_stages, virtual_stages
    if len(schedule) * v != C:
        raise ValueError(
            f"the schedule must have one row per stage ({C})"
            + (f" over {v} virtual stages" if v != 1 else "")
            + f". Received: rows={len(schedule)}"
        )
    K = C // v
    M = 1 + max(a.microbatch for row in schedule.values() for a in row)
    validate(schedule, M, virtual_stages=v)
    events = _run(costs, partition, schedule, recompute)
    # the holders of shared weights exchange their gradients once every backward is done
    training = any(a.kind is Kind.BACKWARD for row in schedule.values() for a in row)
    exchange = costs.exchange_time(partition.bounds, K if v > 1 else None) if training else 0.0
    step = max((e.end for e in events), default=0.0) + exchange
    busy = busy_seconds(events, K)
    return SimResult(
        step_time=step,
        busy=busy,
        idle=tuple(step - b for b in busy),
        bubble_fraction=bubble_fraction(busy, step),
        peak_memory=peak_memory(costs, partition, schedule, recompute=recompute, virtual_stages=v),
        events=tuple(sorted(events, key=lambda e: (e.start, e.stage))),
    )


def busy_seconds(events: Iterable[Event], stages: int) -> tuple[float, ...]:
    """Seconds each of ``stages`` stages spends in forward and backward events.

    Example:
        >>> busy_seconds([Event(0, Action.parse("0F0"), 0.0, 2.0)], 2)
        (2.0, 0.0)
    """
    busy = [0.0] * stages
    for e in events:
        if e.action.kind in COMPUTE:
            busy[e.stage] += e.end - e.start
    return tuple(busy)


def bubble_fraction(busy: Sequence[float], step_time: float) -> float:
    """``1 - sum(busy) / (K * step_time)`` for K = ``len(busy)`` stages (0 for an empty step)."""
    return 1.0 - sum(busy) / (len(busy) * step_time) if step_time > 0 else 0.0


def _run(
    costs: CostModel, partition: Partition, schedule: Schedule, recompute: bool
) -> list[Event]:
    times = action_seconds(costs, partition, split=splits_backward(schedule), recompute=recompute)
    cut = costs.prefix.cut
    b = partition.bounds
    rows = {s: [a for a in row if a.kind in COMPUTE] for s, row in schedule.items()}
    C = partition.num_stages  # chunks: K v
    end: dict[Action, float] = {}
    free, position, events = [0.0] * len(rows), [0] * len(rows), []
    progress = True
    while progress:
        progress = False
        for s, row in rows.items():
            while position[s] < len(row):
                a = row[position[s]]
                c = a.stage
                ready = _ready(a, end, C, float(cut[b[c]]), float(cut[b[c + 1]]))
                if ready is None:
                    break
                duration = times[c][a.kind]
                start = max(free[s], ready)
                free[s] = end[a] = start + duration
                events.append(Event(s, a, start, free[s]))
                position[s] += 1
                progress = True
    if any(position[s] < len(row) for s, row in rows.items()):
        raise ScheduleError("the simulation stalled; validate() should have caught this")
    return events


def _ready(
    a: Action, end: dict[Action, float], K: int, cut_in: float, cut_out: float
) -> float | None:
    """When the input of `a` has arrived, or None if its producer has not run yet."""
    s, m = a.stage, a.microbatch
    if a.kind is Kind.FORWARD and s > 0:
        producer = end.get(Action(s - 1, Kind.FORWARD, m))
        return None if producer is None else producer + cut_in
    if a.kind is Kind.BACKWARD and s < K - 1:
        producer = end.get(Action(s + 1, Kind.BACKWARD, m))
        return None if producer is None else producer + cut_out
    return 0.0


def simulate_plan(
    costs: CostModel,
    partition: Partition,
    M: int,
    *,
    pipeline: str,
    recompute: bool = False,
    virtual_stages: int = 1,
    deferred: Sequence[int] | None = None,
) -> SimResult:
    """Simulates `build(pipeline, K, M, deferred=deferred)` on `partition` (of K v chunks
    with ``virtual_stages`` v)."""
    v = virtual_stages
    K = partition.num_stages // v
    schedule = build(pipeline, K, M, virtual_stages=v, deferred=deferred)
    return simulate(costs, partition, schedule, recompute=recompute, virtual_stages=v)
