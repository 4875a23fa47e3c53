"""Measures each node of a traced model and emits the partitioner's cost model."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from keras import tree

from partitioner.costs import CostModel, LayerCost
from tfsift.planning import keras_internals
from tfsift.planning.autodiff import gradients, is_float
from tfsift.planning.graph import Graph, GraphNode
from tfsift.state import STATE

log = logging.getLogger("tfsift")
# A microbatch whose layers compute for less than this many times a bare action's cost is
# timed once more through the runtime's own stage code (``stage_call``): its fixed cost
# is then at least 1% of an action, and timing the whole model costs about what
# profiling it did. Above, the fixed cost is noise and the whole model is not run again.
CALIBRATE_BELOW = 100
# optimize="speed" recomputes where a small model's microbatch took this much less that
# way (``recomputing_is_faster``): a tie keeps the tape, the path of every larger model.
RECOMPUTE_GAIN = 0.02
# At most this many prefixes of a small model are timed through the runtime's stage to
# fit its cost per action and its layers' times (``_calibrated``): the first node alone
# and the whole model. Each more costs a stage's tracing at every small model's start-up,
# and the test suite's models are small. ``scripts/bench_small.py``'s one run with two
# (751594f) put two of its four rows past 25%, where three runs with three did so only in
# a run whose steps stalled: too few runs to tell the points from the hour.
CALIBRATE_POINTS = 2
# The seconds a microbatch takes through the runtime's stage (forward, its message out
# and back, backward and the gradient sum, as a stage before the last runs them), given
# the graph, a microbatch, the repeats, whether the stage recomputes and the ends of the
# prefixes to time (the whole graph if none), one per end;
# ``tfsift.pipeline.stage.microbatch_seconds``.
StageCall = Callable[[Graph, Sequence[tf.Tensor], int, bool, Sequence[int]], list[float]]


def profile(
    graph: Graph,
    example: Sequence[tf.Tensor],
    repeats: int = 5,
    stage_call: StageCall | None = None,
    recompute: bool = False,
) -> CostModel:
    """Times every node on ``example`` (one microbatch) and sizes its tensors.

    Forward time is the median over ``repeats`` runs after a warm-up, less the fixed cost
    of calling a compiled function; backward time is the median of forward+backward runs
    less the forward median. A node with no trainable weights upstream of it is timed
    without its input gradient: the first stage stops gradients at the model input, so
    TensorFlow never computes it (such nodes open the chain, so they sit in stage 0).

    The runtime's fixed cost per action (``CostModel.action_overhead``) is measured on a
    stage that does nothing; with ``stage_call``, a model whose microbatch computes for
    little (``CALIBRATE_BELOW``) is also run through the runtime's stage code, its
    prefixes timed in turn, and the cost per action and the layers' times are fitted to
    those times (``_calibrated``): on such a model they decide the step.

    Args:
        graph: the traced model.
        example: concrete model inputs, one microbatch.
        repeats: timed runs per node after one warm-up; the median is kept.
        stage_call: times a microbatch through the runtime's stage (``StageCall``).
        recompute: the stages recompute their forward in the backward (optimize="memory"):
            ``stage_call`` times that path, whose microbatch computes the forward twice.

    Returns:
        A ``CostModel`` with ``batch_size`` set to the example's batch size.

    A graph of the same layers as one profiled before in this process, on inputs of
    the same shapes, gets that profile again (under its own node names): most of the
    time is tracing every node twice, and a model built again with the same layers then
    gets the same cut instead of one that follows the machine's noise.
    """
    key = signature(graph, example, repeats)
    calibration = ("+stage" + ("+recompute" if recompute else "")) if stage_call else ""
    cached = STATE.profiles.get(key + calibration)
    if cached is None:
        with _restored(graph):
            cached = STATE.profiles.get(key)  # the layers' times: the same for either path
            if cached is None:
                cached = STATE.profiles[key] = _profile(graph, example, repeats)
            if stage_call is not None:
                cached = _calibrated(cached, graph, example, repeats, stage_call, recompute, key)
                STATE.profiles[key + calibration] = cached
    # names, weights and which calls share them are this graph's (the profile's times
    # may come from another graph of the same layers, which may share other weights)
    seen: set[int] = set()
    layers = tuple(
        dataclasses.replace(c, name=gn.name, param_bytes=_new_param_bytes(gn.operation, seen))
        for c, gn in zip(cached.layers, graph.nodes, strict=True)
    )
    return dataclasses.replace(cached, layers=layers, shared=shared_calls(graph))


def shared_calls(graph: Graph) -> tuple[tuple[int, ...], ...]:
    """Groups of node indices that call the same layer with weights (two or more calls),
    in the order of their first call: ``CostModel.shared``."""
    calls: dict[int, list[int]] = {}
    for i, gn in enumerate(graph.nodes):
        if getattr(gn.operation, "weights", None):
            calls.setdefault(id(gn.operation), []).append(i)
    return tuple(tuple(g) for g in calls.values() if len(g) > 1)


def signature(graph: Graph, example: Sequence[tf.Tensor], repeats: int) -> str:
    """What a profile depends on: every node's operation (class and configuration, less
    its name), weights, inputs (by producer) and outputs, the example's shapes, repeats."""
    where: dict[int, tuple[Any, int]] = {t: ("input", i) for i, t in enumerate(graph.inputs)}
    nodes = []
    for i, gn in enumerate(graph.nodes):
        op = gn.operation
        nodes.append(
            [
                type(op).__module__ + "." + type(op).__qualname__,
                _config(op),
                [(tuple(w.shape), str(w.dtype), bool(w.trainable)) for w in op.weights]
                if hasattr(op, "weights")
                else [],
                [where[t] for t in gn.inputs],
                [(tuple(x.shape), str(x.dtype)) for x in gn.node.outputs],
            ]
        )
        where.update({t: (i, j) for j, t in enumerate(gn.outputs)})
    shapes = [(tuple(x.shape), str(x.dtype)) for x in example]
    return json.dumps([nodes, shapes, repeats], default=repr)


def _config(op: Any) -> Any:
    """The operation's configuration without its name; None for one that has none."""
    try:
        config = dict(op.get_config())
    except Exception:  # custom layers without get_config raise NotImplementedError
        return None
    config.pop("name", None)
    return config


def _variables(graph: Graph) -> list[Any]:
    found: dict[int, Any] = {}
    for gn in graph.nodes:
        for var in getattr(gn.operation, "variables", []):
            found.setdefault(id(var), var)
    return list(found.values())


def _profile(graph: Graph, example: Sequence[tf.Tensor], repeats: int) -> CostModel:
    values = evaluate(graph, example)
    overhead = dispatch_overhead(repeats)
    seen: set[int] = set()
    layers = []
    wrt_inputs = needs_input_gradients(graph)
    for i, gn in enumerate(graph.nodes):
        forward, both = _node_functions(gn, values, wrt_inputs[i])
        f_raw = median_time(forward, repeats)
        f_time = max(f_raw - overhead, 0.0)
        b_time = max(median_time(both, repeats) - f_raw, 0.0) if both is not None else 0.0
        layers.append(
            LayerCost(
                name=gn.name,
                forward_time=f_time,
                backward_time=b_time,
                param_bytes=_new_param_bytes(gn.operation, seen),
                activation_bytes=graph.sample_bytes(gn.outputs),
                output_bytes=graph.sample_bytes(graph.live(i + 1)),
            )
        )
    return CostModel(
        tuple(layers), batch_size=int(example[0].shape[0]), action_overhead=action_overhead(repeats)
    )


def _calibrated(
    costs: CostModel,
    graph: Graph,
    example: Sequence[tf.Tensor],
    repeats: int,
    stage_call: StageCall,
    recompute: bool,
    key: str,
) -> CostModel:
    """``costs`` fitted to what ``stage_call`` measured, when the model is small enough to
    time: up to ``CALIBRATE_POINTS`` prefixes of the model, run through the runtime's
    stage (a forward and a backward action, each with its message), took
    ``2 * overhead + scale * layers`` each, ``layers`` being the prefix's profiled times
    (with ``recompute``, its forward twice). The least-squares line through them gives
    the cost per action and the factor on every layer's time.

    Each of the two alone is a difference of noisy timings: an MLP's plan line once
    charged 0.36 ms per action from a bare stage's calls and scaled its layers to fit the
    whole model's microbatch, and the next run 0.59 ms, predicting the same job at 5.1
    and 13.0 ms (``scripts/bench_small.py`` at 6d42394). Fitted to its prefixes, the
    plan line predicted the ``@tfsift.step`` call within 25% on 12 of that benchmark's 16
    rows in four runs (b6fa43f to 751594f).
    Where no line fits (fewer than two distinct prefixes, or a slope or intercept that is
    not positive), the costs stay as profiled. A prefix already timed for this profile is
    not timed again: under optimize="speed" the whole model's time is the one
    ``recomputing_is_faster`` took, a moment before the shorter prefixes'.
    """
    if not small(costs):
        return costs
    ends, x = _points(costs, recompute)
    try:
        timed = _microbatch(stage_call, graph, example, repeats, recompute, key, ends)
    except Exception as err:  # an estimate that fails must not end the run
        log.warning(
            "could not time a microbatch through the runtime's stage (%s: %s); the plan "
            "charges the bare stage's cost per action",
            type(err).__name__,
            err,
        )
        return costs
    if len(set(x.tolist())) < 2:
        return costs
    scale, intercept = (float(v) for v in np.polyfit(x, np.asarray(timed, np.float64), 1))
    if scale <= 0 or intercept <= 0:
        return costs
    return dataclasses.replace(_scaled(costs, scale), action_overhead=intercept / 2)


def _points(costs: CostModel, recompute: bool) -> tuple[tuple[int, ...], np.ndarray]:
    """The prefixes ``_calibrated`` times, as node counts, and their layers' profiled
    seconds (with ``recompute``, the forward twice): up to ``CALIBRATE_POINTS``, spread
    evenly from the least to the whole model's, which is always the last."""
    profiled = np.asarray(costs.prefix.compute + recompute * costs.prefix.forward, np.float64)
    L = len(profiled) - 1
    targets = np.linspace(profiled[1], profiled[-1], min(CALIBRATE_POINTS, L))
    ends = tuple(sorted({*map(int, np.searchsorted(profiled, targets).clip(1, L)), L}))
    return ends, profiled[list(ends)]


def _scaled(costs: CostModel, factor: float) -> CostModel:
    """``costs`` with every layer's forward and backward time times ``factor``."""
    layers = tuple(
        dataclasses.replace(
            layer,
            forward_time=layer.forward_time * factor,
            backward_time=layer.backward_time * factor,
        )
        for layer in costs.layers
    )
    return dataclasses.replace(costs, layers=layers)


def small(costs: CostModel) -> bool:
    """Whether the layers compute for little next to the bare stage's cost per action
    (``CALIBRATE_BELOW``): the model the runtime's stage is timed for."""
    return float(costs.prefix.compute[-1]) < CALIBRATE_BELOW * costs.action_overhead


def recomputing_is_faster(
    graph: Graph, example: Sequence[tf.Tensor], repeats: int, stage_call: StageCall
) -> bool:
    """Whether a microbatch through the runtime's stage took at least ``RECOMPUTE_GAIN``
    less recomputing its forward inside one compiled backward than with the eager tape.

    Only for a small model (``small``; a larger one pays the forward again in full), once
    ``profile`` has timed its layers; each path's whole model is timed once per profile.
    Timed, not predicted: the layers' times sum to more than one compiled call of them
    takes, so on such a model the profile before ``_calibrated`` fits it to a path would
    predict the recomputing path slower by the forward it repeats (an MLP's step,
    ``scripts/bench_small.py``, ran faster recomputing); fitted, each path's prediction
    follows its timed microbatches, and this compares the whole model's.
    """
    key = signature(graph, example, repeats)
    costs = STATE.profiles.get(key)
    if costs is None or not small(costs):
        return False
    whole = [len(graph)]
    try:
        with _restored(graph):
            kept, again = (
                _microbatch(stage_call, graph, example, repeats, path, key, whole)[0]
                for path in (False, True)
            )
    except Exception:  # profile warned already: keep the tape
        return False
    return again < (1 - RECOMPUTE_GAIN) * kept


@contextlib.contextmanager
def _restored(graph: Graph) -> Iterator[None]:
    """Puts every variable of ``graph`` back as it was when the block ends.

    Timing runs the layers in training mode, which moves BatchNorm statistics and seed
    generators on this rank only: left so, its stages would train from other states than
    the other ranks' (a 4-stage ResNet's statistics and a dropout model's gradients
    differed from one process's when the recomputing path was first timed outside it).
    """
    saved = [(v, v.numpy()) for v in _variables(graph)]
    try:
        yield
    finally:
        for var, value in saved:
            var.assign(value)


def _microbatch(
    stage_call: StageCall,
    graph: Graph,
    example: Sequence[tf.Tensor],
    repeats: int,
    recompute: bool,
    key: str,
    ends: Sequence[int],
) -> list[float]:
    """``stage_call``'s seconds for one path's prefixes ``ends``, each timed once per
    profile ``key``: the whole model's, timed for ``recomputing_is_faster``, is not timed
    again for the calibration of the path it chose."""
    cached = STATE.profiles.setdefault(f"{key}+microbatch{'+recompute' if recompute else ''}", {})
    missing = [e for e in ends if e not in cached]
    if missing:
        seconds = stage_call(graph, example, repeats, recompute, missing)
        cached.update(zip(missing, map(float, seconds), strict=True))
    return [cached[e] for e in ends]


def evaluate(graph: Graph, example: Sequence[tf.Tensor]) -> dict[int, Any]:
    """Every tensor of the graph computed on ``example``, keyed by KerasTensor id."""
    values: dict[int, Any] = dict(zip(graph.inputs, example, strict=True))
    for gn in graph.nodes:
        values.update(zip(gn.outputs, keras_internals.call_node(gn.node, values), strict=True))
    return values


def needs_input_gradients(graph: Graph) -> list[bool]:
    """Per node: whether a training step computes its input gradient, i.e. whether some
    trainable weight lies upstream of it (the model input itself needs no gradient)."""
    downstream: set[int] = set()  # tensors that depend on a trainable weight
    needs = []
    for gn in graph.nodes:
        reads = any(t in downstream for t in gn.inputs)
        needs.append(reads)
        if reads or getattr(gn.operation, "trainable_variables", []):
            downstream.update(gn.outputs)
    return needs


def _node_functions(
    gn: GraphNode, values: dict[int, Any], wrt_inputs: bool
) -> tuple[Callable[[], Any], Callable[[], Any] | None]:
    args, kwargs = keras_internals.node_arguments(gn.node, values, training=True)
    floats = [values[t] for t in gn.inputs if is_float(values[t])]
    inputs = floats if wrt_inputs else []
    sources = inputs + list(getattr(gn.operation, "trainable_variables", []))

    def forward() -> Any:
        return gn.operation(*args, **kwargs)

    def both() -> Any:
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            out = [y for y in tree.flatten(gn.operation(*args, **kwargs)) if is_float(y)]
        return gradients(tape, out, sources)

    differentiable = bool(sources) and any(is_float(values[t]) for t in gn.outputs)
    return tf.function(forward), tf.function(both) if differentiable else None


def dispatch_overhead(repeats: int) -> float:
    """Median time of calling a compiled function that does nothing.

    Each node is timed as a call of its own compiled function, but inside a stage it runs
    fused with the others; subtracting this fixed cost keeps a reshape from looking as
    expensive as a small matrix product.
    """
    return median_time(tf.function(lambda: tf.constant(0.0)), max(repeats, 5))


def action_overhead(repeats: int) -> float:
    """What the runtime adds to one action of a stage whatever its layers, measured on a
    stage that does nothing: the mean of a compiled forward call and of a backward through
    the gradient tape around it (as every stage but the last runs its backward), plus the
    Python of a call (docs/benchmarks-log.md, Fixed cost per call, times the executor's
    calls)."""
    x = tf.zeros((1,))
    forward = tf.function(lambda x: x * 1.0)

    def backward() -> Any:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = forward(x)
        return tape.gradient(y, x)

    n = max(repeats, 5)
    return (median_time(lambda: forward(x), n) + median_time(backward, n)) / 2


def medians(fns: Sequence[Callable[[], Any]], repeats: int) -> list[float]:
    """The median seconds of each of ``fns``, its tensors fetched, over ``repeats`` rounds
    that call each in turn, after one round (tracing and warming up): drift hits all."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, took in zip(fns, times, strict=True):
            start = time.perf_counter()
            tree.map_structure(lambda x: x.numpy() if hasattr(x, "numpy") else x, fn())
            took.append(time.perf_counter() - start)
    return [float(statistics.median(t)) for t in times]


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """The median seconds of ``fn()``, its tensors fetched, over ``repeats`` calls after
    one (tracing and warming up)."""
    return medians([fn], repeats)[0]


def _new_param_bytes(operation: Any, seen: set[int]) -> int:
    total = 0
    for var in getattr(operation, "weights", []):
        if id(var) not in seen:
            seen.add(id(var))
            total += int(np.prod(var.shape)) * np.dtype(var.dtype).itemsize
    return total


def format_table(costs: CostModel) -> str:
    """A per-layer table of a cost model: times in milliseconds, bytes human-readable."""
    from partitioner.costs import format_bytes

    rows = [("#", "layer", "fwd ms", "bwd ms", "params", "act/sample", "cut/sample")]
    for i, layer in enumerate(costs.layers):
        rows.append(
            (
                str(i),
                layer.name,
                f"{layer.forward_time * 1e3:.3f}",
                f"{layer.backward_time * 1e3:.3f}",
                format_bytes(layer.param_bytes),
                format_bytes(layer.activation_bytes),
                format_bytes(layer.output_bytes),
            )
        )
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(w) if c == 1 else cell.rjust(w)
            for c, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    total_f = sum(layer.forward_time for layer in costs.layers) * 1e3
    total_b = sum(layer.backward_time for layer in costs.layers) * 1e3
    lines.append(
        f"{len(costs.layers)} layers, microbatch {costs.batch_size}: "
        f"forward {total_f:.3f} ms, backward {total_b:.3f} ms"
    )
    return "\n".join(lines)
