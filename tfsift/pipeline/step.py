"""``@tfsift.step``: runs a forward/backward function over microbatches through the pipeline."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, overload

import numpy as np
import tensorflow as tf
from keras import tree

from partitioner import schedule
from tfsift.parallel import runtime
from tfsift.parallel.comm import PipeComm
from tfsift.pipeline import context, timeline
from tfsift.pipeline.executor import Executor, Microbatch
from tfsift.pipeline.head import GRADS_MARKER, Head
from tfsift.pipeline.outputs import GradientOutput, StepOutput

if TYPE_CHECKING:  # the model module imports this package: no import cycle at run time
    from tfsift.model import DistributedModel


@dataclasses.dataclass
class _Probe:
    """What the first call learns about a step function (the same on every rank)."""

    model: DistributedModel
    backward: bool
    training: bool
    actions: list[schedule.Action]
    comm: PipeComm
    head: Head | None  # on the last stage


@overload
def step(fn: Callable[..., Any], *, compile: bool = True) -> Callable[..., Any]: ...


@overload
def step(
    fn: None = None, *, compile: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def step(fn: Callable[..., Any] | None = None, *, compile: bool = True) -> Any:
    """Turns a forward/backward function into a pipelined, microbatched step.

    Every tensor argument is split along axis 0 into ``microbatches`` pieces and
    ``fn`` runs once per piece; each return value becomes a ``StepOutput``. A
    function that calls ``tfsift.gradients`` is a training step, one that does not
    is forward-only (evaluation or data scoring).

    Example:
        >>> @step
        ... def forward_backward(x, y):
        ...     loss = loss_fn(y, model(x, training=True))
        ...     return tfsift.gradients(loss, model.trainable_variables), loss

    The first call also runs ``fn`` once on the first microbatch with the model returning
    zeros, up to ``tfsift.gradients``: that probe partitions the model and learns whether
    the step trains. Keep side effects (metric updates) after ``tfsift.gradients`` or
    outside the step.

    On the last stage ``fn`` is compiled with ``tf.function`` together with the stage's
    forward and backward (see ``tfsift.pipeline.head``): Python side effects in it run when it is
    traced, not every call. ``@tfsift.step(compile=False)`` runs it eagerly instead;
    a function that cannot be traced falls back to that, with a warning.

    Raises:
        ValueError: a batch size not divisible by ``microbatches``.
    """
    if fn is None:
        return functools.partial(step, compile=compile)
    return _make_step(fn, compile)


def _make_step(fn: Callable[..., Any], compile: bool) -> Callable[..., Any]:
    probes: list[_Probe] = []

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not tf.executing_eagerly():
            raise RuntimeError(context.GRAPH_MODE_ERROR)
        rt = runtime.get()
        microbatches = split(args, kwargs, rt.config.microbatches)
        if not probes:
            probes.append(_probe(fn, microbatches[0], rt, compile))
        probe = probes[0]
        part = probe.model.partitioned
        assert part is not None
        executor = Executor(
            part.stage,
            rt.topology.partitions,
            probe.comm,
            fn,
            microbatches,
            (part.in_specs, part.out_specs),
            part.output_structure,
            probe.backward,
            probe.training,
            probe.head,
        )
        recording = timeline.active()
        if recording is None:
            executor.run(probe.actions)
        else:
            timed: list[tuple[schedule.Action, float, float]] = []
            origin = timeline.start(rt.pipe_comm)
            executor.run(probe.actions, timed)
            timeline.finish(recording, rt.pipe_comm, rt.stage, origin, timed)
        return _gather(executor, rt)

    return wrapper


def split(args: tuple[Any, ...], kwargs: dict[str, Any], M: int) -> list[Microbatch]:
    """Splits every tensor (or array) argument with a batch axis into ``M`` microbatches."""
    leaves = tree.flatten((args, kwargs))
    if M == 1:
        tensors = [_as_tensor(leaf) for leaf in leaves]
        return [tree.pack_sequence_as((args, kwargs), tensors)]
    pieces = []
    for leaf in leaves:
        if (tf.is_tensor(leaf) or isinstance(leaf, np.ndarray)) and len(leaf.shape) > 0:
            batch = int(leaf.shape[0])
            if batch % M:
                raise ValueError(f"batch size {batch} is not divisible by microbatches={M}")
            pieces.append(tf.split(tf.convert_to_tensor(leaf), M, axis=0))
        else:
            pieces.append([leaf] * M)
    return [tree.pack_sequence_as((args, kwargs), [p[m] for p in pieces]) for m in range(M)]


def _as_tensor(leaf: Any) -> Any:
    return tf.convert_to_tensor(leaf) if isinstance(leaf, np.ndarray) else leaf


def _probe(
    fn: Callable[..., Any], microbatch: Microbatch, rt: runtime.Runtime, compile: bool
) -> _Probe:
    seen: list[tuple[DistributedModel, bool]] = []

    def model_call(model: DistributedModel, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        part = model.partition_model([tf.convert_to_tensor(x) for x in tree.flatten(args)])
        seen.append((model, bool(kwargs.get("training", False))))
        flat = [
            tf.zeros(t.shape, t.dtype) for t in (part.graph.tensors[i] for i in part.graph.outputs)
        ]
        return tree.pack_sequence_as(part.output_structure, flat)

    args, kwargs = microbatch
    backward = False
    try:
        with context.active(context.StepContext(model_call, probe=True)):
            fn(*args, **kwargs)
    except context.ProbeStop:
        backward = True
    if not seen:
        raise RuntimeError("the @tfsift.step function did not call a tfsift.DistributedModel")
    if len({id(m) for m, _ in seen}) > 1:
        raise RuntimeError("a @tfsift.step function may call only one DistributedModel")
    K, M = rt.topology.partitions, rt.config.microbatches
    plan = schedule.add_communication(
        schedule.build(rt.config.pipeline, K, M, forward_only=not backward)
    )
    model, training = seen[0]
    head = None
    if rt.stage == K - 1:
        part = model.partitioned
        assert part is not None
        head = Head(part.stage, fn, part.output_structure, backward, training, compile)
    return _Probe(model, backward, training, plan[rt.stage], PipeComm(rt.pipe_comm), head)


def _gather(executor: Executor, rt: runtime.Runtime) -> Any:
    """Per-output StepOutputs; the last stage's results are broadcast along the pipeline."""
    K, M = rt.topology.partitions, rt.config.microbatches
    results = [executor.results[m] for m in range(M)] if executor.last else None
    if K > 1:
        shared = rt.pipe_comm.bcast(
            [_strip(r) for r in results] if results is not None else None, root=K - 1
        )
        results = results if results is not None else shared
    assert results is not None
    grads = executor.grad_sum or []
    return _merge(results, [GradientOutput(g, M) for g in grads])


def _strip(value: Any) -> Any:
    """Tensors become arrays (picklable); the head already put the marker for the gradients."""
    return tree.map_structure(lambda v: v.numpy() if tf.is_tensor(v) else v, value)


def _merge(results: list[Any], grads: list[StepOutput]) -> Any:
    first = results[0]
    if isinstance(first, str) and first == GRADS_MARKER:
        return grads
    if isinstance(first, (list, tuple)):
        merged = [_merge([r[i] for r in results], grads) for i in range(len(first))]
        return type(first)(*merged) if hasattr(first, "_fields") else type(first)(merged)
    if isinstance(first, dict):
        return {k: _merge([r[k] for r in results], grads) for k in first}
    if isinstance(first, (np.ndarray, np.generic, float, int)) or tf.is_tensor(first):
        return StepOutput([tf.convert_to_tensor(r) for r in results])
    return first
