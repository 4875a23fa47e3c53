"""Stage bounds for a traced model: from the plan file, the solver, or manual placement.

Rank 0 says what it does at the first step (``tfsift`` logger, INFO): that it profiles,
then the plan in words, e.g.

    profiling 4 nodes on rank 0 (5 timed runs each) to cut them into 2 stages; the ...
    plan: 2 stages, M=2, interleaved, optimize=speed: predicted step 2.16 ms, bubble 38.4%
      stage 0: conv2d .. flatten (2 nodes), 1.25 KiB weights, busy 1.15 ms (idle 46.9%), ...
      stage 1: dense .. dense_1 (2 nodes), 581.54 KiB weights, busy 1.51 ms (idle 30.0%), ...

(each stage line ends with its peak memory). A plan file is reused only when it was
made for this run: the same K, M, pipeline (any, for ``pipeline="auto"``), optimize and
model (its node names, in order); otherwise rank 0 warns what differs, solves again and
overwrites the file.

``pipeline="auto"`` solves and simulates every schedule and keeps the one with the
shortest predicted step within ``memory_cap`` (``partitioner.plan.fastest_plan``); the
plan line names it. Where nothing is profiled (one stage, ``auto_partition=False``) it
means ``UNSOLVED_AUTO``. With ``virtual_stages`` v the bounds cut K v chunks (stage s
runs chunks s, s + K, ...); unset, it is 1, or under ``pipeline="auto"`` the count the
plan found fastest (1, 2 or 4).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from partitioner.costs import format_bytes, format_seconds
from partitioner.plan import deferral_note
from tfsift.config import AUTO, Config
from tfsift.parallel import runtime
from tfsift.parallel.comm import PipeComm, bcast_object, message_latency
from tfsift.planning.graph import Graph
from tfsift.planning.profiler import StageCall, profile, recomputing_is_faster

if TYPE_CHECKING:
    from partitioner.costs import CostModel
    from partitioner.plan import Plan
    from partitioner.simulator import SimResult
    from tfsift.hooks import Reservation

log = logging.getLogger("tfsift")
UNSOLVED_AUTO = "interleaved"  # pipeline="auto" without a plan to compare schedules by


class Layout(NamedTuple):
    """What every rank takes from the plan: the K v + 1 bounds, whether the stages
    recompute (``Plan.recompute``), the schedule, its virtual stages v and, for
    ``zero_bubble``, the W's each stage defers (``Plan.deferred``; None where nothing was
    solved: ZB-H1's)."""

    bounds: tuple[int, ...]
    recompute: bool
    pipeline: str
    virtual_stages: int = 1
    deferred: tuple[int, ...] | None = None


def plan_bounds(
    graph: Graph,
    placements: dict[int, int],
    example: Sequence[tf.Tensor],
    rt: runtime.Runtime,
    *,
    reservation: Reservation | None = None,
    stage_call: StageCall | None = None,
) -> Layout:
    """The `Layout` of ``graph``: its K+1 stage bounds (K v + 1 chunk bounds), whether the
    stages recompute their forward in the backward (``Plan.recompute``), the schedule
    (``pipeline="auto"``: the one the plan found fastest; "interleaved" where nothing is
    solved), its virtual stages v and the zero-bubble schedule's deferral, the same on
    every rank (a collective).

    Rank 0 reads the plan file or profiles and solves; the bounds or the error are
    broadcast. ``placements`` maps layer ids to ``tfsift.partition`` indices.
    ``reservation``: work stage 0 runs per step in its waits (``tfsift.hooks``), which
    the solver leaves room for with optimize="speed" (``solve_speed``'s objective);
    its ``call_seconds(graph, rows)`` measures a call's fixed seconds on a source batch
    of ``rows`` (M microbatches of the example's size), on rank 0 when it solves.
    ``stage_call`` times a microbatch through the runtime's stage code, for the cost per
    action the plan charges (``profile``).
    """
    cfg, L = rt.config, len(graph)
    memory = cfg.optimize == "memory"  # without a solved plan: recompute exactly then
    unsolved = UNSOLVED_AUTO if cfg.pipeline == AUTO else cfg.pipeline
    v = cfg.virtual_stages or 1  # unset with "auto": the plan's choice, else 1
    if cfg.partitions * v > L:
        chunks = f", virtual_stages: {v}" if v > 1 else ""
        raise ValueError(
            f"too few layers to split into partitions (layers: {L}, partitions: "
            f"{cfg.partitions}{chunks})"
        )
    if rt.rank == 0 and (unused := ignored_placements(graph, placements, cfg)):
        log.warning("%s", unused)
    if cfg.partitions == 1:
        return Layout((0, L), memory, unsolved)
    if not cfg.auto_partition:  # tfsift.partition indices name the K v chunks
        bounds = manual_bounds(graph, placements, cfg.partitions * v, cfg.default_partition)
        return Layout(bounds, memory, unsolved, v)
    # Rank 0's pipeline times a message between its stages 0 and 1 for the plan (about
    # 10 ms), before rank 0 profiles: stage 1 cannot know whether rank 0 reuses a plan
    # file, and after profiling it would wait in a receive bounded by the timeout.
    latency = 0.0
    if rt.replica == rt.topology.replica(0):
        latency = message_latency(PipeComm(rt.pipe_comm), rt.stage)
    # Only rank 0 touches the plan file, and every rank takes the bounds (or the error)
    # from its broadcast: a rank that saw the file rank 0 had just written would skip the
    # broadcast and leave the others waiting in it.
    outcome: tuple[str, Any] | None = None
    if rt.rank == 0:
        try:
            outcome = (
                "ok",
                rank0_bounds(graph, example, cfg, reservation, stage_call, latency),
            )
        except (OSError, ValueError) as err:
            outcome = ("error", str(err))
    status, payload = bcast_object(rt.world, outcome)  # the others sleep while rank 0 profiles
    if status == "error":
        raise ValueError(payload)
    return Layout(*payload)


def rank0_bounds(
    graph: Graph,
    example: Sequence[tf.Tensor],
    cfg: Config,
    reservation: Reservation | None = None,
    stage_call: StageCall | None = None,
    latency: float = 0.0,
) -> Layout:
    """Rank 0's part of ``plan_bounds``: reuse the plan file if it was made for this run,
    else profile, solve, log the plan and write the file (when ``plan_file`` is set).
    Returns the plan's `Layout`.

    ``latency``: the seconds a message between stages takes (``message_latency``), which
    the simulator charges at every crossing of a stage boundary.

    Raises:
        ValueError: the plan file is not a plan, or no partition fits ``memory_cap``.
        OSError: the plan file cannot be read or written.
    """
    from partitioner.plan import solve_plan
    from partitioner.simulator import simulate_plan

    # room on stage 0 is a speed objective (solve_speed) of one chunk per stage; a memory
    # plan, or one on virtual stages, ignores it
    virtual = (cfg.virtual_stages or 1) > 1
    if reservation is not None and virtual:
        log.info("work reserved on stage 0 (tfsift.hooks) is not planned for: virtual_stages > 1")
    reserved = reservation if cfg.optimize == "speed" and not virtual else None
    # a source batch is one training batch: M microbatches of the profile's size
    scoring = reserved.forwards * cfg.microbatches if reserved is not None else 0.0
    plan = _reusable_plan(graph, cfg, scoring)
    if plan is not None:
        log.info("reusing the plan in %s\n%s", cfg.plan_file, describe(plan, weights(graph, plan)))
        _keep_for_run_log(plan, cfg)
        return _layout(plan)
    log.info(
        "profiling %d nodes on rank 0 (%d timed runs each) to cut them into %d stages; %s"
        "the other ranks wait",
        len(graph),
        cfg.profile_repeats,
        cfg.partitions,
        f"a message between stages takes {format_seconds(latency)}; " if latency > 0 else "",
    )
    recompute = cfg.optimize == "memory"
    # optimize="speed" recomputes where a small model's stage was timed faster that way,
    # and is charged as that path: not with room for scoring, planned in the waits of
    # stages that keep tapes, nor with a zero-bubble schedule, whose gain is the split
    # backward a recomputing stage does not make (partitioner.schedule.splits_stage).
    # Decided first, so that only that path's prefixes are timed.
    timed = not scoring and cfg.pipeline != "zero_bubble"
    if cfg.optimize == "speed" and stage_call is not None and timed:
        profile(graph, example, cfg.profile_repeats)  # the layers' times, which it needs
        recompute = recomputing_is_faster(graph, example, cfg.profile_repeats, stage_call)
    costs = dataclasses.replace(
        profile(graph, example, cfg.profile_repeats, stage_call, recompute=recompute),
        latency=latency,
    )
    rows = int(example[0].shape[0]) * cfg.microbatches  # a source batch, one training batch
    call = _call_seconds(reserved.call_seconds, graph, rows) if reserved is not None else 0.0
    options: dict[str, Any] = {
        "optimize": cfg.optimize,
        "memory_cap": cfg.memory_cap,
        "scoring": scoring,
        "scoring_call": call,
        "step_time": reserved.step_time if reserved is not None else None,
        # the default exit ends stage 0: keep a learnt layer before it, or the exit head
        # would score the raw input (the solver once left only a reshape there)
        "first_stage_min": min(_first_weighted(graph) + 1, len(graph) - cfg.partitions + 1)
        if scoring
        else 1,
        "recompute": recompute,
    }
    # virtual stages unset: 1, or with "auto" whichever count is fastest
    plan, choice = solve_plan(
        costs, cfg.partitions, cfg.microbatches, cfg.pipeline, cfg.virtual_stages, **options
    )
    if choice is not None:
        log.info("%s", choice.note())
    result = simulate_plan(
        costs,
        plan.partition,
        plan.microbatches,
        pipeline=plan.pipeline,
        recompute=plan.recompute,
        virtual_stages=plan.virtual_stages,
        deferred=plan.deferred,
    )
    log.info("%s", describe(plan, weights(graph, plan), result))
    advice = no_gain(costs, cfg.microbatches, result.step_time)
    if advice:
        log.warning("%s", advice)
    if cfg.plan_file:
        plan.save(cfg.plan_file)
        log.info("wrote the plan to %s", cfg.plan_file)
    _keep_for_run_log(plan, cfg)
    return _layout(plan)


def _layout(plan: Plan) -> Layout:
    return Layout(plan.bounds, plan.recompute, plan.pipeline, plan.virtual_stages, plan.deferred)


def _first_weighted(graph: Graph) -> int:
    """The index of the first node with variables (0 if none has any)."""
    return next((i for i in range(len(graph)) if graph.stage(i, i + 1).variables()), 0)


def _call_seconds(
    scoring_call: Callable[[Graph, int], float] | None, graph: Graph, rows: int
) -> float:
    """A scoring call's measured fixed cost, or 0 if it cannot be measured: it refines the
    plan and must not end the run (nor, raised on rank 0 alone, hang the other ranks)."""
    if scoring_call is None:
        return 0.0
    try:
        return float(scoring_call(graph, rows))
    except Exception as err:  # any failure of an estimate is survivable
        log.warning(
            "could not time a sifting scoring call for the plan (%s: %s); planning stage 0's "
            "room for scoring without its fixed cost",
            type(err).__name__,
            err,
        )
        return 0.0


def _keep_for_run_log(plan: Plan, cfg: Config) -> None:
    """With ``log_dir``, a copy of the plan there: ``tfsift timeline`` prints its bubble."""
    if cfg.log_dir:
        os.makedirs(cfg.log_dir, exist_ok=True)
        plan.save(os.path.join(cfg.log_dir, "plan.json"))  # rundir.PLAN_FILE


def plan_differences(plan: Plan, graph: Graph, cfg: Config, scoring: float = 0.0) -> list[str]:
    """What differs between the run ``plan`` was made for and this one (empty: none);
    ``scoring`` is this run's room for sifting (0 unless optimize="speed", as
    ``rank0_bounds`` passes it).

    Example:
        ``["microbatches: plan 4, this run 2", "pipeline: plan 'interleaved', this run 'simple'"]``
    """
    planned = {
        "partitions": plan.partitions,
        "microbatches": plan.microbatches,
        "pipeline": plan.pipeline,
        "virtual_stages": plan.virtual_stages,
        "optimize": plan.optimize,
    }
    wanted = {key: getattr(cfg, key) for key in planned}
    wanted["virtual_stages"] = cfg.virtual_stages or 1
    if cfg.pipeline == AUTO:  # a plan's pipeline is what "auto" chose when it was made
        del planned["pipeline"]
        if cfg.virtual_stages is None:  # and so are its virtual stages
            del planned["virtual_stages"]
    found = [
        f"{key}: plan {value!r}, this run {wanted[key]!r}"
        for key, value in planned.items()
        if value != wanted[key]
    ]
    if plan.scoring != scoring:
        found.append(
            f"stage 0's sifting forwards per step: plan {plan.scoring:g}, this run {scoring:g}"
        )
    model = _model_difference([n for stage in plan.stage_layers for n in stage], graph)
    return found + ([model] if model else [])


def no_gain(costs: CostModel, M: int, predicted: float) -> str:
    """A warning when the pipeline is predicted slower than one process, else "".

    One process is estimated as the layers' forward and backward for the M microbatches
    and one action's runtime cost each way; on a larger batch it is faster still, so a
    pipeline predicted slower than this will not pay.
    """
    alone = M * float(costs.prefix.compute[-1]) + 2 * costs.action_overhead
    if predicted <= alone:
        return ""
    return (
        f"pipelining does not pay for this model: predicted step {format_seconds(predicted)} "
        f"against about {format_seconds(alone)} in one process (the layers' compute is "
        f"{format_seconds(alone - 2 * costs.action_overhead)} a step, and each of a stage's "
        f"forwards and backwards costs the runtime about {format_seconds(costs.action_overhead)}); "
        "use fewer microbatches, a larger batch or partitions=1"
    )


def describe(plan: Plan, weight_bytes: Sequence[int], result: SimResult | None = None) -> str:
    """The plan in words: one line for the step, one per stage (first and last node names,
    weight bytes, busy and idle time when ``result`` simulates the plan, peak memory); with
    virtual stages, one per stage (busy, idle, peak) and under it one per chunk (nodes,
    weight bytes)."""
    v = plan.virtual_stages
    lines = [
        f"plan: {plan.partitions} stages"
        + (f" x {v} virtual stages" if v > 1 else "")
        + f", M={plan.microbatches}, {plan.pipeline}, optimize={plan.optimize}"
        + (" with recompute (timed faster)" if plan.recompute and plan.optimize == "speed" else "")
        + f": predicted step {format_seconds(plan.predicted_step_time)}, "
        f"bubble {plan.predicted_bubble:.1%}"
        + (
            f"; stage 0 left room for {plan.scoring:g} sifting forwards per step in its waits, "
            f"{format_seconds(plan.scoring_call)} a call beyond them (not in the prediction)"
            if plan.scoring
            else ""
        )
        + deferral_note(plan)
    ]
    for s in range(plan.partitions):
        busy = ""
        if result is not None and result.step_time > 0:
            idle = result.idle[s] / result.step_time
            busy = f"busy {format_seconds(result.busy[s])} (idle {idle:.1%}), "
        peak = f"peak {format_bytes(plan.peak_memory[s])}"
        if v == 1:
            lines.append(f"  stage {s}: {_nodes(plan, weight_bytes, s)}, {busy}{peak}")
            continue
        lines.append(f"  stage {s}: {busy}{peak}")
        for c in range(s, len(plan.stage_layers), plan.partitions):
            lines.append(f"    chunk {c}: {_nodes(plan, weight_bytes, c)}")
    return "\n".join(lines)


def _nodes(plan: Plan, weight_bytes: Sequence[int], c: int) -> str:
    names = plan.stage_layers[c]
    return (
        f"{names[0]} .. {names[-1]} ({len(names)} node{'s' * (len(names) > 1)}), "
        f"{format_bytes(weight_bytes[c])} weights"
    )


def weights(graph: Graph, plan: Plan) -> list[int]:
    """Bytes of the variables of each stage (chunk) of ``plan`` (a layer called on two
    counts on both)."""
    return [
        sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in stage.variables())
        for stage in (graph.stage(lo, hi) for lo, hi in itertools.pairwise(plan.bounds))
    ]


def _reusable_plan(graph: Graph, cfg: Config, scoring: float = 0.0) -> Plan | None:
    """The plan in ``plan_file`` if there is one and it was made for this run."""
    from partitioner.plan import Plan

    if not cfg.plan_file or not os.path.exists(cfg.plan_file):
        return None
    plan = Plan.load(cfg.plan_file)
    differences = plan_differences(plan, graph, cfg, scoring)
    if differences:
        log.warning(
            "the plan file %s was made for another run (%s); solving again and overwriting it",
            cfg.plan_file,
            "; ".join(differences),
        )
        return None
    return plan


def _model_difference(planned: list[str], graph: Graph) -> str:
    names = [gn.name for gn in graph.nodes]
    if planned == names:
        return ""
    at = next((i for i, (a, b) in enumerate(zip(planned, names, strict=False)) if a != b), None)
    if at is None:
        return f"model: plan {len(planned)} nodes, this model {len(names)} nodes"
    return (
        f"model: plan {len(planned)} nodes, this model {len(names)} nodes, first "
        f"different at node {at} (plan {planned[at]!r}, this model {names[at]!r})"
    )


def ignored_placements(graph: Graph, placements: dict[int, int], cfg: Config) -> str:
    """What rank 0 warns where ``tfsift.partition`` blocks placed layers of ``graph`` that
    the config's ``auto_partition=True`` leaves to the solver, else "".

    A script written for manual placement that forgot ``auto_partition=False`` trains as
    well (every cut gives the same gradients), on stages it did not choose.
    """
    if not cfg.auto_partition:
        return ""
    placed = [
        f"{gn.name!r} in partition {placements[id(gn.operation)]}"
        for gn in graph.nodes
        if id(gn.operation) in placements
    ]
    if not placed:
        return ""
    shown = ", ".join(placed[:3]) + (f" and {len(placed) - 3} more" if len(placed) > 3 else "")
    return (
        f"tfsift.partition blocks placed {len(placed)} layers ({shown}), but auto_partition is "
        "True: the solver cuts the model and the blocks are ignored; set "
        '"auto_partition": False to place the layers by hand'
    )


def manual_bounds(
    graph: Graph, placements: dict[int, int], K: int, default: int
) -> tuple[int, ...]:
    """Stage bounds from ``tfsift.partition`` blocks; ``keras.ops`` nodes follow the node before.
    (With virtual stages, K counts the chunks: a block's index is its chunk.)"""
    stages: list[int] = []
    for gn in graph.nodes:
        if isinstance(gn.operation, keras.layers.Layer):
            stages.append(placements.get(id(gn.operation), default))
        else:
            stages.append(stages[-1] if stages else default)
        if stages[-1] >= K:
            raise ValueError(
                f"partition index must be < partitions={K}. Received: {stages[-1]} "
                f"for layer {gn.name!r}"
            )
        if len(stages) > 1 and stages[-1] < stages[-2]:
            raise ValueError(
                "manual placement must follow the model's call order: layer "
                f"{gn.name!r} (partition {stages[-1]}) is called after a layer of "
                f"partition {stages[-2]}"
            )
    empty = sorted(set(range(K)) - set(stages))
    if empty:
        raise ValueError(
            f"every partition needs at least one layer. Received: no layers in partitions {empty}"
        )
    return (*[stages.index(s) for s in range(K)], len(stages))
