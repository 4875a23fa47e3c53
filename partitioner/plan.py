"""A partition plan: the solved stage boundaries with their predicted cost, as a file."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from partitioner.costs import CostModel
from partitioner.partition import Partition
from partitioner.schedule import PIPELINES, build, check_virtual
from partitioner.simulator import simulate_plan
from partitioner.solver import (
    OPTIMIZE,
    InfeasibleError,
    fit_deferred,
    peak_memory_estimate,
    solve,
    solved_deferral,
)
from partitioner.ties import NEAR_TIE, first_near_fastest, settle

AUTO = "auto"  # the pipeline whose simulated step is the shortest (`fastest_plan`)
# the virtual stages `fastest_plan` tries when they are not given: 1F1B's one chunk a
# rank, and Megatron-LM's interleaved 1F1B with 2 or 4
AUTO_VIRTUAL_STAGES = (1, 2, 4)
# Without a memory cap, "auto" keeps to plans within this factor of 1F1B's peak: the
# zero-bubble schedule's split backward holds its layers' output gradients from B to W,
# a little over 1F1B's peak even where it defers no W (0.1% on the CLI tests' costs).
MEMORY_SLACK = 1.05


@dataclass(frozen=True)
class Plan:
    """Stage boundaries, the layer names on each stage and what the simulator predicts.

    Example:
        >>> from partitioner.costs import LayerCost
        >>> costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 0) for i in range(4)))
        >>> plan = make_plan(costs, 2, 4)
        >>> plan.stage_layers, plan.predicted_step_time
        ((('l0', 'l1'), ('l2', 'l3')), 30.0)

    Args:
        bounds: K + 1 stage boundaries (see `Partition`); with virtual stages, K v + 1
            chunk boundaries (rank s runs chunks s, s + K, ...).
        stage_layers: the layer names on each stage (each chunk).
        optimize: "speed" or "memory" (which also means recompute).
        pipeline: one of `partitioner.schedule.PIPELINES` (never "auto": the pipeline
            `fastest_plan` chose).
        microbatches: M.
        predicted_step_time: simulated seconds per step.
        predicted_bubble: simulated fraction of idle stage time.
        peak_memory: simulated peak bytes per stage (per rank: K entries).
        cost_fingerprint: `CostModel.fingerprint()` of the costs it was solved for.
        scoring: the forwards of its own per step stage 0 was planned to run in its waits
            (sifting's early exit with overlap; `make_plan`; 0: none). Plan files without
            it mean 0.
        scoring_call: the fixed seconds of such a call it was planned with (measured
            when it was planned, like the costs; `partitioner.experimental.scoring`).
            Plan files without it mean 0.
        recompute: whether each stage recomputes its forward inside its backward instead of
            keeping a tape: always with optimize="memory"; with "speed" where the caller
            found that faster (`make_plan`'s ``recompute``). Plan files without it mean
            optimize == "memory".
        virtual_stages: v, the chunks each rank runs (`partitioner.schedule.virtual`);
            plan files without it mean 1.
        deferred: with `zero_bubble`, the W's each stage defers (`make_plan` fits them in
            the memory; `partitioner.schedule.zero_bubble`); None with the others, and in
            plan files made before it, which ran ZB-H1's s on stage s.
    """

    bounds: tuple[int, ...]
    stage_layers: tuple[tuple[str, ...], ...]
    optimize: str
    pipeline: str
    microbatches: int
    predicted_step_time: float
    predicted_bubble: float
    peak_memory: tuple[int, ...]
    cost_fingerprint: str
    scoring: float = 0.0
    scoring_call: float = 0.0
    recompute: bool = False
    virtual_stages: int = 1
    deferred: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "bounds", tuple(self.bounds))
        object.__setattr__(self, "stage_layers", tuple(tuple(s) for s in self.stage_layers))
        object.__setattr__(self, "peak_memory", tuple(self.peak_memory))
        sizes = self.partition.sizes()
        if tuple(len(names) for names in self.stage_layers) != sizes:
            raise ValueError(
                f"stage_layers must list {sizes} layer names per stage. "
                f"Received: stage_layers={self.stage_layers}"
            )
        if self.optimize not in OPTIMIZE or self.pipeline not in PIPELINES:  # not "auto"
            raise ValueError(
                f"optimize must be in {list(OPTIMIZE)} and pipeline in {list(PIPELINES)}. "
                f"Received: optimize={self.optimize!r}, pipeline={self.pipeline!r}"
            )
        if self.optimize == "memory" and not self.recompute:
            raise ValueError(
                'optimize="memory" always recomputes. Received: optimize="memory", recompute=False'
            )
        check_virtual(self.pipeline, self.virtual_stages)
        if self.deferred is not None:
            object.__setattr__(self, "deferred", tuple(self.deferred))
            build(self.pipeline, self.partitions, self.microbatches, deferred=self.deferred)
        if len(sizes) % self.virtual_stages:
            raise ValueError(
                "a plan with virtual stages holds virtual_stages chunks per stage. "
                f"Received: {len(sizes)} chunks, virtual_stages={self.virtual_stages}"
            )
        if len(self.peak_memory) != self.partitions or self.microbatches < 1:
            raise ValueError(
                f"peak_memory needs one entry per stage ({self.partitions}) and microbatches "
                f">= 1. Received: peak_memory={self.peak_memory}, microbatches={self.microbatches}"
            )

    @property
    def partition(self) -> Partition:
        """The stage boundaries as a `Partition` (of K v chunks with virtual stages)."""
        return Partition(self.bounds)

    @property
    def partitions(self) -> int:
        """K, the stages of the pipeline (ranks): the partition's chunks over v."""
        return (len(self.bounds) - 1) // self.virtual_stages

    def check(self, costs: CostModel) -> None:
        """Raises ValueError unless the plan was solved for exactly these costs."""
        if costs.fingerprint() != self.cost_fingerprint:
            raise ValueError(
                "the plan was solved for other costs; re-run `plan`. Received: "
                f"plan cost_fingerprint={self.cost_fingerprint}, "
                f"costs fingerprint={costs.fingerprint()}"
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `from_dict` inverts it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """Builds a plan from `to_dict` output, rejecting unknown or missing keys."""
        names = {f.name for f in fields(cls)}
        # files written before `scoring`, `scoring_call`, `recompute`, `virtual_stages` or
        # `deferred` existed were planned without scoring, recomputed exactly with
        # optimize="memory", ran one chunk per rank and ZB-H1's deferral
        if isinstance(data, Mapping):
            memory = data.get("optimize") == "memory"
            old = {
                "scoring": 0.0,
                "scoring_call": 0.0,
                "recompute": memory,
                "virtual_stages": 1,
                "deferred": None,
            }
            data = {**old, **data}
        if not isinstance(data, Mapping) or set(data) != names:
            keys = sorted(data) if isinstance(data, Mapping) else data
            raise ValueError(f"a plan has exactly the keys {sorted(names)}. Received: keys={keys}")
        return cls(**data)

    def to_json(self) -> str:
        """Indented JSON text."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """Inverse of `to_json`."""
        return cls.from_dict(json.loads(text))

    def save(self, path: str | Path) -> None:
        """Writes `to_json()` to `path`."""
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """Reads a file written by `save`.

        Raises:
            ValueError: the file is not a plan (its name and the parser's reason).
        """
        data = Path(path).read_bytes()
        text = data.decode("utf-8", errors="replace")  # for the message
        try:  # binary bytes too: a UnicodeDecodeError is a ValueError
            return cls.from_json(data.decode("utf-8"))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"the plan file {str(path)!r} is not a valid tfsift plan ({type(err).__name__}: "
                f"{err}); delete it to make a new plan, or fix plan_file. Received: "
                f"{len(text)} characters starting {text[:40]!r}"
            ) from err


def make_plan(
    costs: CostModel,
    K: int,
    M: int,
    *,
    optimize: str = "speed",
    pipeline: str = "interleaved",
    memory_cap: int | None = None,
    scoring: float = 0.0,
    scoring_call: float = 0.0,
    step_time: Callable[..., float] | None = None,
    first_stage_min: int = 1,
    recompute: bool | None = None,
    virtual_stages: int | None = 1,
) -> Plan:
    """Solves for the partition, then fills the predictions from the simulator.

    With optimize="speed" (no ``scoring``), a partition within `partitioner.ties.NEAR_TIE`
    of the fastest that moves fewer bytes across its cuts is taken instead (`settle`): a
    near-tie would otherwise be decided by the profile's noise, another cut each run.

    Args:
        costs: the cost model.
        K: number of stages.
        M: number of microbatches.
        optimize: "speed" (`solve_speed` under `memory_cap`) or "memory" (`solve_memory`,
            simulated with recompute).
        pipeline: one of `partitioner.schedule.PIPELINES`, or "auto": `fastest_plan`.
        memory_cap: bytes per stage for optimize="speed", or None.
        scoring: forward microbatches stage 0 also runs per step in its waits (sifting's
            early exit with overlap), which the partition leaves room for: it is ranked
            by ``step_time(costs, partition, M, pipeline=..., scoring=..., call=...)``
            (`solve_speed`'s objective; `partitioner.experimental.scoring.
            sifted_step_time`). The predictions are the pipeline's without that work.
        scoring_call: fixed seconds of one such call beyond its forwards.
        step_time: what ranks the partitions with ``scoring``; required with it.
        first_stage_min: stage 0 holds at least this many layers (`solve_speed`).
        recompute: whether the stages recompute their forward inside their backward; by
            default exactly with optimize="memory". With "speed", True keeps the fastest
            partition for keeping tapes and predicts the step recomputing (tfsift does so
            where it timed a small model's recomputing stage faster); "memory" always
            recomputes.
        virtual_stages: v, the model chunks each rank runs (v > 1: `interleaved` only,
            Megatron-LM's interleaved 1F1B over K v chunks). None: 1, and with "auto"
            whichever of `AUTO_VIRTUAL_STAGES` is fastest.

    Raises:
        ValueError: on invalid arguments; `InfeasibleError` if nothing fits the cap.
    """
    if pipeline == AUTO:
        return fastest_plan(
            costs,
            K,
            M,
            optimize=optimize,
            memory_cap=memory_cap,
            scoring=scoring,
            scoring_call=scoring_call,
            step_time=step_time,
            first_stage_min=first_stage_min,
            recompute=recompute,
            virtual_stages=virtual_stages,
        )
    objective = _objective(costs, M, pipeline, scoring, scoring_call, step_time)
    v = 1 if virtual_stages is None else virtual_stages
    partition = solve(
        costs,
        K,
        M,
        optimize=optimize,
        pipeline=pipeline,
        memory_cap=memory_cap,
        objective=objective,
        first_stage_min=first_stage_min,
        virtual_stages=v,
    )
    least = solved_deferral(pipeline, K)  # what `solve` fitted in the cap
    if optimize == "speed" and objective is None and v == 1:

        def fits(p: Partition) -> bool:
            peak = peak_memory_estimate(
                costs, p, M, pipeline=pipeline, recompute=False, deferred=least
            )
            return memory_cap is None or max(peak) <= memory_cap

        partition = settle(costs, partition, M, fits, first_stage_min)
    if recompute is None:
        recompute = optimize == "memory"
    elif optimize == "memory" and not recompute:
        raise ValueError('optimize="memory" always recomputes. Received: recompute=False')
    deferred = None
    if pipeline == "zero_bubble":
        deferred = _deferred(costs, partition, M, memory_cap, recompute)
    result = simulate_plan(
        costs,
        partition,
        M,
        pipeline=pipeline,
        recompute=recompute,
        virtual_stages=v,
        deferred=deferred,
    )
    return Plan(
        bounds=partition.bounds,
        stage_layers=tuple(
            tuple(costs.layers[i].name for i in partition.stage_layers(s))
            for s in range(partition.num_stages)
        ),
        optimize=optimize,
        pipeline=pipeline,
        microbatches=M,
        predicted_step_time=result.step_time,
        predicted_bubble=result.bubble_fraction,
        peak_memory=result.peak_memory,
        cost_fingerprint=costs.fingerprint(),
        scoring=float(scoring),
        scoring_call=float(scoring_call),
        recompute=recompute,
        virtual_stages=v,
        deferred=deferred,
    )


def deferral_note(plan: Plan) -> str:
    """``; W's deferred per stage: 0, 1`` for a zero-bubble plan, else "": what the plan
    line and `tfsift plan` add after the step's figures (so that what comes before reads
    as for any plan).

    Example:
        >>> from partitioner.costs import LayerCost
        >>> costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 0) for i in range(2)))
        >>> deferral_note(make_plan(costs, 2, 4, pipeline="zero_bubble", memory_cap=10**6))
        "; W's deferred per stage: 0, 1"
    """
    if plan.deferred is None:
        return ""
    return f"; W's deferred per stage: {', '.join(map(str, plan.deferred))}"


def _deferred(
    costs: CostModel, partition: Partition, M: int, cap: int | None, recompute: bool
) -> tuple[int, ...]:
    """The W's each stage of `zero_bubble` defers: as many as fit ``cap``, or without one
    1F1B's peak on the same partition (ZB-H1's promise: its memory, not more); none
    where the stages recompute (they run whole backwards: nothing to defer)."""
    if recompute:
        return (0,) * partition.num_stages
    if cap is None:
        cap = max(
            peak_memory_estimate(costs, partition, M, pipeline="interleaved", recompute=False)
        )
    return fit_deferred(costs, partition, M, cap)


def label(pipeline: str, virtual_stages: int, deferred: Sequence[int] | None = None) -> str:
    """A pipeline's name, with its virtual stages where there are more than one, and the
    zero-bubble schedule's W's deferred on each stage where it was planned (`Plan.deferred`).

    Example:
        >>> label("interleaved", 1), label("interleaved", 2), label("zero_bubble", 1, (0, 1))
        ('interleaved', 'interleaved(v=2)', 'zero_bubble(d=0,1)')
    """
    if deferred is not None:
        return f"{pipeline}(d={','.join(map(str, deferred))})"
    return pipeline if virtual_stages == 1 else f"{pipeline}(v={virtual_stages})"


@dataclass(frozen=True)
class AutoChoice:
    """What `compare_plans` found: the plan it chose, the plans it compared (in `candidates`'
    order), and those it left out for holding more than `MEMORY_SLACK` times 1F1B's peak
    where no cap was given."""

    chosen: Plan
    compared: tuple[Plan, ...]
    over: tuple[Plan, ...]

    def note(self) -> str:
        """The choice in words, with each other plan's predicted step against the chosen one's.

        Example:
            >>> from partitioner.costs import LayerCost
            >>> costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 4, 9, 0) for i in range(4)))
            >>> print(compare_plans(costs, 2, 4, 1).note())  # doctest: +NORMALIZE_WHITESPACE
            pipeline "auto": zero_bubble(d=0,1), the first of interleaved, zero_bubble whose
            predicted step is within 3% of the shortest (the others' against it: interleaved
            1.15x); left out, over 1F1B's memory (set memory_cap to allow them): simple 1.15x
        """
        step = self.chosen.predicted_step_time

        def ratios(plans: tuple[Plan, ...]) -> str:
            return ", ".join(
                f"{_label_of(p)} {p.predicted_step_time / step:.2f}x"
                for p in plans
                if p is not self.chosen
            )

        order = ", ".join(_label_of(p, deferral=False) for p in self.compared)
        text = (
            f'pipeline "auto": {_label_of(self.chosen)}, the first of {order} whose predicted '
            f"step is within {NEAR_TIE:.0%} of the shortest"
        )
        if others := ratios(self.compared):
            text += f" (the others' against it: {others})"
        if self.over:
            text += (
                "; left out, over 1F1B's memory (set memory_cap to allow them): "
                f"{ratios(self.over)}"
            )
        return text


def _label_of(plan: Plan, deferral: bool = True) -> str:
    return label(plan.pipeline, plan.virtual_stages, plan.deferred if deferral else None)


def compare_plans(
    costs: CostModel, K: int, M: int, virtual_stages: int | None = None, **options: Any
) -> AutoChoice:
    """`fastest_plan`'s comparison, with the plans it compared and those it left out."""
    plans: list[Plan] = []
    errors: list[InfeasibleError] = []
    scored = bool(options.get("scoring"))
    for pipeline, v in candidates(K, M, costs.num_layers, virtual_stages, scored):
        try:
            plans.append(make_plan(costs, K, M, pipeline=pipeline, virtual_stages=v, **options))
        except InfeasibleError as error:
            errors.append(error)
    if not plans:
        raise errors[0]
    kept = plans
    if options.get("memory_cap") is None:
        kept = within_1f1b(plans, lambda p: max(p.peak_memory), _is_1f1b)
    chosen = kept[first_near_fastest([plan.predicted_step_time for plan in kept])]
    over = tuple(plan for plan in plans if plan not in kept)
    return AutoChoice(chosen, tuple(kept), over)


def solve_plan(
    costs: CostModel,
    K: int,
    M: int,
    pipeline: str,
    virtual_stages: int | None = None,
    **options: Any,
) -> tuple[Plan, AutoChoice | None]:
    """`make_plan`'s plan, and with ``pipeline="auto"`` what `compare_plans` compared to
    choose it (for its `AutoChoice.note`); None otherwise. ``virtual_stages`` None: 1, or
    with "auto" whichever count is fastest."""
    if pipeline == AUTO:
        choice = compare_plans(costs, K, M, virtual_stages, **options)
        return choice.chosen, choice
    plan = make_plan(costs, K, M, pipeline=pipeline, virtual_stages=virtual_stages, **options)
    return plan, None


def fastest_plan(
    costs: CostModel, K: int, M: int, *, virtual_stages: int | None = None, **options: Any
) -> Plan:
    """The plan of the pipeline whose simulated step is the shortest within the memory cap,
    near-ties going to the simplest schedule.

    The candidates (`candidates`: every pipeline with one chunk a rank, and `interleaved`
    with each of `AUTO_VIRTUAL_STAGES` that the model and M allow, or only with
    ``virtual_stages`` if given) are solved and simulated (`make_plan` with ``options``);
    of those that fit ``memory_cap``, or without a cap that hold at most `MEMORY_SLACK`
    times the peak of 1F1B's plan (`interleaved` on one chunk a rank, when it is among
    them), the first in `candidates`' order whose predicted step is within
    `partitioner.ties.NEAR_TIE` of the shortest wins: 1F1B, then the zero-bubble schedule,
    then virtual stages, then GPipe. So a gain within the profile's noise does not change
    the schedule from run to run, and what is faster only for more memory (GPipe, most
    virtual stages, ZB-H1's whole deferral) is bought by setting a cap, as for the
    zero-bubble schedule's deferral.

    Example:
        >>> from partitioner.costs import LayerCost
        >>> costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 4, 0, 0) for i in range(4)))
        >>> plan = fastest_plan(costs, 2, 4, virtual_stages=1)
        >>> plan.pipeline, plan.predicted_step_time
        ('zero_bubble', 26.0)

    Raises:
        InfeasibleError: no pipeline's plan fits the cap (the first candidate's error).
    """
    return compare_plans(costs, K, M, virtual_stages, **options).chosen


T = TypeVar("T")


def within_1f1b(
    rows: Sequence[T], peak: Callable[[T], int], is_1f1b: Callable[[T], bool]
) -> list[T]:
    """The ``rows`` whose ``peak`` memory is at most `MEMORY_SLACK` times the 1F1B row's
    (``is_1f1b``): what `fastest_plan` compares without a memory cap; all of them where
    none is 1F1B's.

    Example:
        >>> within_1f1b([("simple", 9), ("interleaved", 5), ("zero_bubble", 5)],
        ...             lambda row: row[1], lambda row: row[0] == "interleaved")
        [('interleaved', 5), ('zero_bubble', 5)]
    """
    bound = next((MEMORY_SLACK * peak(row) for row in rows if is_1f1b(row)), None)
    return [row for row in rows if bound is None or peak(row) <= bound]


def _is_1f1b(plan: Plan) -> bool:
    return plan.pipeline == "interleaved" and plan.virtual_stages == 1


def candidates(
    K: int, M: int, L: int, virtual_stages: int | None = None, scoring: bool = False
) -> list[tuple[str, int]]:
    """(pipeline, virtual stages) pairs `fastest_plan` compares on a chain of L layers, in
    its order of preference: 1F1B (`interleaved`), the zero-bubble schedule, `interleaved`
    with each of `AUTO_VIRTUAL_STAGES` above 1 that has K >= 2, K v <= L layers and M a
    multiple of its rounds (`partitioner.schedule.rounds_of`; none while planning room for
    sifting's ``scoring``), then GPipe (`simple`); given ``virtual_stages`` v > 1,
    `interleaved` with v alone.

    Example:
        >>> candidates(2, 8, 6)
        [('interleaved', 1), ('zero_bubble', 1), ('interleaved', 2), ('simple', 1)]
    """
    if virtual_stages is not None and virtual_stages > 1:
        return [("interleaved", virtual_stages)]  # the only one; `solve` says what it lacks
    found = [("interleaved", 1), ("zero_bubble", 1)]
    for v in AUTO_VIRTUAL_STAGES[1:] if virtual_stages is None else ():
        if _allows(K, M, L, v) and not scoring:
            found.append(("interleaved", v))
    return [*found, ("simple", 1)]


def _allows(K: int, M: int, L: int, v: int) -> bool:
    return K >= 2 and K * v <= L and M % max(1, M // K) == 0


def _objective(
    costs: CostModel,
    M: int,
    pipeline: str,
    scoring: float,
    call: float,
    step_time: Callable[..., float] | None,
) -> Callable[[Partition], float] | None:
    """``step_time`` of a partition with ``scoring`` forwards on stage 0, or None without."""
    for name, value, what in (
        ("scoring", scoring, "stage 0's scoring forwards per step"),
        ("scoring_call", call, "seconds of a scoring call's fixed cost"),
    ):
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or not math.isfinite(value)
            or value < 0
        ):
            raise ValueError(
                f"{name} must be a finite number >= 0 ({what}). Received: {name}={value!r}"
            )
    if not scoring:
        return None
    if step_time is None:
        raise ValueError(
            "scoring (stage 0's forwards of its own per step) needs step_time, what ranks "
            "the partitions with it (partitioner.experimental.scoring.sifted_step_time). "
            f"Received: scoring={scoring}, step_time=None"
        )

    def objective(partition: Partition) -> float:
        return step_time(costs, partition, M, pipeline=pipeline, scoring=scoring, call=call)

    return objective
