"""``@tfsift.step``: runs a forward/backward function over microbatches through the pipeline."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

import keras
import numpy as np
import tensorflow as tf
from keras import tree

from partitioner import schedule
from tfsift.parallel import runtime, watchdog
from tfsift.parallel.comm import PipeComm
from tfsift.pipeline import context, metrics, runlog, timeline
from tfsift.pipeline.executor import Executor, Microbatch, StepResult, Timed
from tfsift.pipeline.head import GRADS_MARKER, Head, mark_gradients
from tfsift.pipeline.outputs import StepGradients, StepOutput
from tfsift.pipeline.plan import Chunk, StepPlan, describe_arguments
from tfsift.pipeline.roles import role_for
from tfsift.pipeline.split import SplitBackward
from tfsift.pipeline.stage import Stage
from tfsift.planning import keras_internals
from tfsift.state import STATE

log = logging.getLogger("tfsift")

if TYPE_CHECKING:  # the model module imports this package: no import cycle at run time
    from tfsift.model import DistributedModel


@overload
def step(
    fn: Callable[..., Any], *, compile: bool = True, non_split_inputs: Sequence[str] = ()
) -> Callable[..., Any]: ...


@overload
def step(
    fn: None = None, *, compile: bool = True, non_split_inputs: Sequence[str] = ()
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def step(
    fn: Callable[..., Any] | None = None,
    *,
    compile: bool = True,
    non_split_inputs: Sequence[str] = (),
) -> Any:
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
    zeros: that probe partitions the model, learns whether the step trains and which
    Keras variables ``fn`` updates (its metrics), which every rank of the pipeline then
    holds after each step (``tfsift.pipeline.metrics``). The probe applies no update to
    a Keras variable; other Python side effects in ``fn`` do run.

    On the last stage ``fn`` is compiled with ``tf.function`` together with the stage's
    forward and backward (see ``tfsift.pipeline.head``): Python side effects in it run when it is
    traced, not every call. With one stage (``partitions=1``) one such call runs all the
    microbatches of a step, one after the other, and traces ``fn`` once for each.
    ``@tfsift.step(compile=False)`` runs it eagerly instead; a function that cannot be
    traced falls back to that, with a warning.

    Arguments named in ``non_split_inputs`` (as SageMaker model parallelism's
    ``non_split_inputs``) reach every microbatch whole: a temperature of shape (1,), say.

    Raises:
        ValueError: a batch size not divisible by ``microbatches``; a name in
            ``non_split_inputs`` that is not an argument of ``fn``; a call whose arguments
            have another structure than the first call's (its plan was made for them: an
            argument passed by name where it was passed by position counts as another).
    """
    if fn is None:
        return functools.partial(step, compile=compile, non_split_inputs=non_split_inputs)
    return _make_step(fn, compile, list(non_split_inputs))


def _whole_arguments(fn: Callable[..., Any], names: Sequence[str]) -> inspect.Signature | None:
    """``fn``'s signature when some arguments are not split (checked), else None."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"non_split_inputs must be a list of argument names. Received: {names!r}")
    if not names:
        return None
    signature = inspect.signature(fn)
    unknown = [n for n in names if n not in signature.parameters]
    if unknown:
        raise ValueError(
            "non_split_inputs must name arguments of the step function "
            f"({', '.join(signature.parameters)}). Received: {', '.join(map(repr, unknown))}"
        )
    return signature


class _Whole:
    """An argument passed whole to every microbatch (``non_split_inputs``)."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _mark_whole(
    signature: inspect.Signature | None,
    names: Sequence[str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if signature is None:
        return args, kwargs
    bound = signature.bind(*args, **kwargs)
    for name in names:
        if name in bound.arguments:
            bound.arguments[name] = _Whole(bound.arguments[name])
    return bound.args, bound.kwargs


def _unmark(microbatch: Microbatch) -> Microbatch:
    args, kwargs = microbatch
    unwrap = [a.value if isinstance(a, _Whole) else a for a in args]
    return tuple(unwrap), {k: v.value if isinstance(v, _Whole) else v for k, v in kwargs.items()}


def _make_step(
    fn: Callable[..., Any], compile: bool, names: Sequence[str] = ()
) -> Callable[..., Any]:
    plans: list[StepPlan] = []  # the one plan, made by the first call
    signature = _whole_arguments(fn, names)

    name = getattr(fn, "__qualname__", repr(fn))

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not tf.executing_eagerly():
            raise RuntimeError(context.GRAPH_MODE_ERROR)
        with _running(name):
            return _call(args, kwargs)

    def _call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        rt = runtime.get()
        marked = _mark_whole(signature, names, args, kwargs)
        if plans:
            plans[0].check(rt, *marked)
        microbatches = split(*marked, plans[0].M if plans else rt.config.microbatches)
        if signature is not None:  # only non_split_inputs put markers in
            microbatches = [_unmark(mb) for mb in microbatches]
        said = None
        if not plans:
            plans.append(make_plan(fn, microbatches[0], rt, compile, *marked))
            said = _state_updates(plans[0])
        with plans[0].shared.sharing():  # metrics updated in fn: equal on every rank after
            outputs = run(plans[0], fn, microbatches)
        if said is not None:
            said()
        return outputs

    wrapper.tfsift_step = True  # type: ignore[attr-defined]
    return wrapper


_LOCK = threading.Lock()


def _state_updates(plan: StepPlan) -> Callable[[], None] | None:
    """For a training step's first call on microbatches or replicas: what, after the step,
    says which of this rank's layers changed non-trainable variables of their own (a
    counter, running statistics of a custom layer): their call updates them for each
    microbatch, M times a step, and each replica its own, where one Keras process updates
    them once a step for the whole batch. Said where nothing else says it: Keras'
    ``BatchNormalization`` (said at partitioning) and the random layers' seeds are left out,
    as are frozen layers, which nothing updates. One copy of those variables, once."""
    rt = plan.runtime
    part = plan.model.partitioned
    if not plan.training or part is None or rt.config.microbatches * rt.topology.replicas == 1:
        return None
    watched = []
    for layer in part.stage.graph.layers():
        if not isinstance(layer, keras.layers.Layer) or not layer.trainable:
            continue
        told = {id(v) for v in keras_internals.seed_states(layer)}  # said elsewhere
        for sub in layer._flatten_layers(include_self=True):
            if isinstance(sub, keras.layers.BatchNormalization):
                told |= {id(v) for v in sub.variables}
        watched += [(layer, v) for v in layer.non_trainable_variables if id(v) not in told]
    before = [np.array(v.numpy()) for _, v in watched]

    def say() -> None:
        changed = {layer.name: None for (layer, v), was in zip(watched, before, strict=True)
                   if not np.array_equal(was, v.numpy())}  # fmt: skip
        if changed:
            log.warning(
                "layers (%s) changed non-trainable variables of their own in a training step: "
                "a layer's call updates them for each microbatch (microbatches=%d) and on "
                "each replica alone (replicas=%d), where one Keras process updates them once "
                "a step for the whole batch",
                ", ".join(changed),
                rt.config.microbatches,
                rt.topology.replicas,
            )

    return say


@contextlib.contextmanager
def _running(name: str) -> Iterator[None]:
    """Marks step ``name`` as running; refuses a step that would nest in or overlap another
    (two steps at once would interleave their messages on the same communicator)."""
    with _LOCK:
        other = STATE.running_step
        if other is None:
            STATE.running_step = name
    if other is not None:
        raise RuntimeError(
            f"the @tfsift.step function {name!r} was called while {other!r} was running; "
            "steps cannot nest or overlap (a sifted dataset read ahead of training by a "
            "prefetch or a parallel map after tfsift.sift does this)"
        )
    try:
        yield
    finally:
        STATE.running_step = None


def run(plan: StepPlan, fn: Callable[..., Any], microbatches: Sequence[Microbatch]) -> Any:
    """Runs one step of ``plan`` (recorded inside ``tfsift.timeline()`` and, with ``log_dir``,
    in the run log); returns its outputs."""
    executor = Executor(plan, fn, microbatches)
    recording, logged = timeline.active(), runlog.active(plan)
    if recording is None and logged is None:
        return _gather(executor.run(), plan)
    timed: Timed = []
    pipe = plan.comm.comm
    origin = timeline.start(pipe) if recording is not None else time.perf_counter()
    result = executor.run(timed)
    if recording is not None:
        timeline.finish(recording, pipe, plan.s, origin, timed)
    outputs = _gather(result, plan)
    if logged is not None:
        logged.record(plan, fn, microbatches, origin, timed, outputs)
    return outputs


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
                raise ValueError(
                    f"batch size {batch} is not divisible by microbatches={M}: every batch "
                    "splits into M equal microbatches (batch the dataset with "
                    "drop_remainder=True, or pass a non-batch argument through "
                    "@tfsift.step(non_split_inputs=[...]))"
                )
            pieces.append(tf.split(_as_tensor(leaf), M, axis=0))
        else:
            pieces.append([leaf] * M)
    return [tree.pack_sequence_as((args, kwargs), [p[m] for p in pieces]) for m in range(M)]


def _as_tensor(leaf: Any) -> Any:
    return tf.constant(leaf) if isinstance(leaf, np.ndarray) else leaf  # as pydataset._tensor


def make_plan(
    fn: Callable[..., Any],
    microbatch: Microbatch,
    rt: runtime.Runtime,
    compile: bool,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> StepPlan:
    """Probes ``fn`` on the first microbatch (partitioning the model) and builds its plan."""
    model, backward, training, assigned = _probe(fn, microbatch)
    part = model.partitioned
    assert part is not None
    cfg, K, v = rt.config, rt.topology.partitions, part.virtual_stages
    # the schedule the model was planned for: the config's, or what "auto" chose
    pipeline = part.pipeline or cfg.pipeline
    compute = schedule.build(
        pipeline,
        K,
        cfg.microbatches,
        forward_only=not backward,
        virtual_stages=v,
        deferred=part.deferred,  # a zero-bubble plan's (None for the other schedules)
    )
    actions = schedule.add_communication(compute, virtual_stages=v)
    s = part.stage.index

    def chunk(stage: Stage) -> Chunk:
        c = stage.index
        split = None
        if schedule.splits_backward(compute) and schedule.splits_stage(c, stage.recompute):
            split = SplitBackward(stage)
        head = None
        if c == K * v - 1:
            head = Head(
                stage,
                fn,
                part.output_structure,
                backward,
                training,
                compile,
                split,
                requested=part.stage.variables,
            )
        graph = stage.graph
        return Chunk(
            stage,
            role_for(c, K * v),
            _specs(part.graph, graph.inputs),
            # gradients come back only for float outputs (integer tensors carry none)
            tuple(s for s in _specs(part.graph, graph.outputs) if tf.as_dtype(s[1]).is_floating),
            head,
            split,
        )

    return StepPlan(
        K=K,
        M=cfg.microbatches,
        pipeline=pipeline,
        optimize=cfg.optimize,
        model=model,
        chunks=tuple(chunk(stage) for stage in part.stage.stages),
        actions=tuple(actions[s]),
        output_structure=part.output_structure,
        comm=PipeComm(rt.pipe_comm),
        backward=backward,
        training=training,
        arguments=describe_arguments(args, kwargs),
        runtime=rt,
        shared=metrics.find(assigned, model, rt, getattr(fn, "__qualname__", repr(fn))),
        tied=part.tied,
        combine=part.stage.combine if v > 1 else None,
    )


def _specs(graph: Any, ids: Sequence[int]) -> tuple[tuple[tuple[int, ...], Any], ...]:
    """(shape without batch, dtype) of each of the traced tensors ``ids``."""
    return tuple((tuple(graph.tensors[t].shape[1:]), graph.tensors[t].dtype) for t in ids)


def _probe(
    fn: Callable[..., Any], microbatch: Microbatch
) -> tuple[DistributedModel, bool, bool, list[Any]]:
    """Runs ``fn`` once with the model returning zeros; no Keras variable changes.

    Returns the model it calls, whether it trains, the model call's ``training`` and the
    Keras variables ``fn`` assigned (recorded, not applied).
    """
    seen: list[tuple[DistributedModel, bool]] = []

    def model_call(model: DistributedModel, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if keras_internals.tape_recording():
            raise context.StepFunctionError(
                "do not use tf.GradientTape inside a @tfsift.step function: the model's "
                "layers run on other ranks, so a tape here sees none of them. Return "
                "tfsift.gradients(loss, model.trainable_variables) instead"
            )
        inputs = [tf.convert_to_tensor(x) for x in tree.flatten(args)]
        part = model.partition_model(list(tree.map_structure(tf.convert_to_tensor, args)))
        seen.append((model, bool(kwargs.get("training", False))))
        # zeros of this call's batch size: the model may have been traced by another step
        batch = int(inputs[0].shape[0])
        outputs = (part.graph.tensors[i] for i in part.graph.outputs)
        flat = [tf.zeros((batch, *t.shape[1:]), t.dtype) for t in outputs]
        return tree.pack_sequence_as(part.output_structure, flat)

    args, kwargs = microbatch
    # To its end, past tfsift.gradients, to see the metrics it updates; a run on zeros must
    # not reach them. The model call partitions the model, so it keeps its state.
    probe = context.StepContext(metrics.stateful(model_call))
    with metrics.recording() as recorder, context.active(probe):
        returned = fn(*args, **kwargs)
    if not seen:
        raise RuntimeError("the @tfsift.step function did not call a tfsift.DistributedModel")
    if probe.requests and GRADS_MARKER not in tree.flatten(mark_gradients(returned)):
        # the gradients exist only as the step's result: left out, the step trained nothing
        raise RuntimeError(
            "the @tfsift.step function computes tfsift.gradients but does not return them: "
            "return them (e.g. return tfsift.gradients(loss, model.trainable_variables), "
            "loss) to get them back from the step. Received: a step returning "
            f"{'None' if returned is None else type(returned).__name__}"
        )
    called = list({id(m): m.name for m, _ in seen}.values())
    if len(called) > 1:
        # each model has a partition and a schedule of its own: one step runs one of them
        raise RuntimeError(
            "a @tfsift.step function may call only one DistributedModel: call each in a "
            "@tfsift.step function of its own (feeding one's outputs to the other), or "
            "write one DistributedModel whose call runs both. Received: calls of "
            + " and ".join(repr(name) for name in called)
        )
    if len(seen) > 1:
        # Only the last stage runs the step function; the other stages would run their
        # layers once, on the first call's inputs, and return wrong results silently.
        raise RuntimeError(
            f"a @tfsift.step function may call its DistributedModel once per step; "
            f"{seen[0][0].name!r} was called {len(seen)} times. Combine the inputs into one "
            "call (e.g. concatenate them along the batch axis and split the outputs)"
        )
    model, training = seen[0]
    return model, bool(probe.requests), training, recorder.assigned


def _gather(result: StepResult, plan: StepPlan) -> Any:
    """Per-output StepOutputs; the last stage's results are broadcast along the pipeline."""
    results = result.results
    if plan.K > 1:
        mine = [_strip(r) for r in results] if results is not None else None
        pipe, last = plan.comm, plan.K - 1

        def late() -> str:
            peer = watchdog.rank_name(pipe.comm, last)
            return f"stage {last} ({peer}) to broadcast the step's results"

        with watchdog.guard(pipe.timeout, late):  # blocking: a lost host would never end it
            shared = pipe.comm.bcast(mine, root=last)
        results = results if results is not None else shared
    assert results is not None
    grads = result.grad_sum or []
    if grads and plan.tied:  # before the step returns: every holder gets the same sum
        grads = plan.tied.sum_gradients(grads)
    return _merge(results, StepGradients(grads, plan.M, result.grad_mean).outputs)


def _strip(value: Any) -> Any:
    """Tensors become arrays (picklable); the head already put the marker for the gradients."""
    return tree.map_structure(lambda v: v.numpy() if tf.is_tensor(v) else v, value)


def _merge(results: list[Any], grads: Sequence[StepOutput]) -> Any:
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
