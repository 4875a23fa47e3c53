"""Stage bounds for a traced model: from the plan file, the solver, or manual placement."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tfsift.config import Config
from tfsift.parallel import runtime
from tfsift.planning.graph import Graph
from tfsift.planning.profiler import profile


def plan_bounds(
    graph: Graph,
    placements: dict[int, int],
    example: Sequence[tf.Tensor],
    rt: runtime.Runtime,
) -> tuple[int, ...]:
    """The K+1 stage bounds of ``graph``, the same on every rank (a collective).

    Rank 0 reads the plan file or profiles and solves; the bounds or the error are
    broadcast. ``placements`` maps layer ids to ``tfsift.partition`` indices.
    """
    cfg, L = rt.config, len(graph)
    if cfg.partitions > L:
        raise ValueError(
            f"too few layers to split into partitions (layers: {L}, partitions: {cfg.partitions})"
        )
    if cfg.partitions == 1:
        return (0, L)
    if not cfg.auto_partition:
        return manual_bounds(graph, placements, cfg.partitions, cfg.default_partition)
    # Only rank 0 touches the plan file, and every rank takes the bounds (or the error)
    # from its broadcast: a rank that saw the file rank 0 had just written would skip the
    # broadcast and leave the others waiting in it.
    outcome: tuple[str, Any] | None = None
    if rt.rank == 0:
        try:
            outcome = ("ok", _rank0_bounds(graph, example, cfg))
        except (OSError, ValueError) as err:
            outcome = ("error", str(err))
    status, payload = rt.world.bcast(outcome, root=0)
    if status == "error":
        raise ValueError(payload)
    return tuple(payload)


def _rank0_bounds(graph: Graph, example: Sequence[tf.Tensor], cfg: Config) -> tuple[int, ...]:
    """Loads the plan file if there is one, else profiles, solves and saves the plan."""
    from partitioner.plan import Plan, make_plan

    if cfg.plan_file and os.path.exists(cfg.plan_file):
        return _bounds_from_plan(Plan.load(cfg.plan_file), graph, cfg.partitions)
    costs = profile(graph, example, cfg.profile_repeats)
    plan = make_plan(
        costs,
        cfg.partitions,
        cfg.microbatches,
        optimize=cfg.optimize,
        pipeline=cfg.pipeline,
        memory_cap=cfg.memory_cap,
    )
    if cfg.plan_file:
        plan.save(cfg.plan_file)
    return tuple(plan.bounds)


def manual_bounds(
    graph: Graph, placements: dict[int, int], K: int, default: int
) -> tuple[int, ...]:
    """Stage bounds from ``tfsift.partition`` blocks; ``keras.ops`` nodes follow the node before."""
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


def _bounds_from_plan(plan: Any, graph: Graph, K: int) -> tuple[int, ...]:
    names = [gn.name for gn in graph.nodes]
    planned = [name for stage in plan.stage_layers for name in stage]
    if planned != names or len(plan.bounds) != K + 1:
        raise ValueError(
            "the plan file does not match this model and config "
            f"(plan: {len(plan.bounds) - 1} stages, "
            f"{len(planned)} layers; model: {K} partitions, {len(names)} layers)"
        )
    return tuple(plan.bounds)
