"""The last stage's forward, the user's loss head and the backward as one compiled call.

On the last stage a microbatch's forward and backward depend on nothing another
stage sends in between, so tfsift runs them together: one ``tf.function`` runs
the stage's layers, the rest of the ``@tfsift.step`` function (the loss and
whatever else it computes from the predictions), the gradients of the loss with
respect to the stage's variables and inputs, and adds them to the running sum.
Compared with an eager head this removes the per-microbatch Python work of the
loss, of two gradient tapes and of the gradient sum; it also means the last
stage keeps no activations between a forward and its backward.

With one stage (K = 1) the same call runs all M microbatches of a step, one after the
other (``Head.run_all``): nothing arrives between them, so the call's fixed cost is paid
once a step.

Where a zero-bubble schedule splits the last stage's backward (``tfsift.pipeline.split``),
the same call runs the stage's split forward, the rest of the step function, and B: the
input gradients, from the gradients of the loss with respect to the stage's outputs. It
keeps, instead of adding the stage's weight gradients to the sum, what W will read; a
loss that reads a variable directly still adds that gradient here.

The step function is traced, so Python side effects in it run when it is traced,
not every call (as in any ``tf.function``); with one stage, M times per trace. A
function that cannot be traced (it calls ``.numpy()``, for example) runs eagerly
instead, with a warning; ``@tfsift.step(compile=False)`` asks for that from the start.
Eagerly, the same code runs without ``tf.function`` (the stage's layers still run
compiled).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import tensorflow as tf
from keras import tree

from tfsift.pipeline import context
from tfsift.pipeline.compiled import Compiled, signature
from tfsift.pipeline.outputs import divide
from tfsift.pipeline.split import Layout as SplitLayout
from tfsift.pipeline.split import Pending, SplitBackward
from tfsift.pipeline.stage import Stage
from tfsift.planning.autodiff import add, gradients, is_float

log = logging.getLogger("tfsift")
GRADS_MARKER = "__tfsift_gradients__"
Microbatch = tuple[tuple[Any, ...], dict[str, Any]]


@dataclasses.dataclass
class HeadResult:
    """What one head call gives back for one microbatch."""

    results: Any  # the step function's return value, tfsift.gradients replaced by the marker
    grad_sum: list[tf.Tensor] | None  # the running sum of the stage's variable gradients
    in_grads: list[tf.Tensor]  # d loss / d stage inputs, for the previous stage
    pending: Pending | None = None  # a split backward: what its W reads


@dataclasses.dataclass
class AllResult:
    """What one call over all of a step's microbatches gives back (one stage)."""

    results: list[Any]  # per microbatch, as ``HeadResult.results``
    grad_sum: list[tf.Tensor] | None
    grad_mean: list[tf.Tensor] | None  # grad_sum / M (None for M = 1 or no gradients)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """How to rebuild the step function's return value from the compiled call's tensors."""

    skeleton: Any  # the return value with every tensor replaced by 0
    leaves: tuple[Any, ...]  # its flattened leaves (tensors' places hold 0)
    tensor_positions: tuple[int, ...]  # where in ``leaves`` the compiled outputs go


class Head:
    """Runs stage forward + step function (+ backward) of one microbatch on the last stage."""

    def __init__(
        self,
        stage: Stage,
        fn: Callable[..., Any],
        output_structure: Any,
        backward: bool,
        training: bool,
        compile: bool = True,
        split: SplitBackward | None = None,
        requested: Sequence[Any] | None = None,
    ) -> None:
        self.stage, self.fn, self.output_structure = stage, fn, output_structure
        self.split = split
        # what tfsift.gradients must be given: the rank's variables (``model.
        # trainable_variables``), which with virtual stages span more chunks than this one
        self.requested = list(stage.variables if requested is None else requested)
        self.backward, self.training = backward, training
        self.compiled = compile
        self._tried = not compile
        # One layout per traced signature: a concrete function traced for other arguments
        # (another Python value, say) returns that trace's non-tensor values.
        self._layouts: dict[Hashable, _Layout] = {}
        self._layout: _Layout | None = None  # the latest trace's
        self._key: Hashable = None
        name = f"the @tfsift.step function {getattr(fn, '__qualname__', fn)!r}"
        self._call: Callable[..., Any] = Compiled(self._run, name) if compile else self._run

    def __call__(
        self,
        inputs: Sequence[tf.Tensor],
        microbatch: Microbatch,
        grad_sum: list[tf.Tensor] | None,
    ) -> HeadResult:
        """Runs one microbatch; ``inputs`` are the stage inputs (empty on stage 0)."""
        layout = None
        if self.split is not None and self.backward:
            layout = self.split.layout(inputs, self.training)
        flats, grads, in_grads, _, kept = self._invoke(
            list(inputs), [microbatch], grad_sum, layout=layout
        )
        pending = None if layout is None else Pending(layout, *kept)
        return HeadResult(self._rebuild(flats[0]), grads, in_grads, pending)

    def run_all(self, microbatches: Sequence[Microbatch]) -> AllResult:
        """Every microbatch of a one-stage step in one compiled call (eagerly, one loop).

        With one stage nothing arrives between two microbatches, so a call's fixed cost
        (``Compiled``'s dispatch and the Python around it, ``scripts/bench_small.py``)
        is paid once a step instead of once a microbatch. The gradients' mean over the
        microbatches comes out of the same call, as it would from ``accumulate()``'s.
        """
        count = tf.constant(len(microbatches)) if self.backward and len(microbatches) > 1 else None
        flats, grads, _, means, _ = self._invoke([], list(microbatches), None, count)
        return AllResult([self._rebuild(flat) for flat in flats], grads, means or None)

    def _invoke(
        self,
        inputs: list[tf.Tensor],
        microbatches: list[Microbatch],
        grad_sum: list[tf.Tensor] | None,
        count: tf.Tensor | None = None,
        layout: SplitLayout | None = None,
    ) -> tuple[
        list[list[tf.Tensor]], list[tf.Tensor] | None, list[tf.Tensor], list[tf.Tensor], Any
    ]:
        call = (inputs, microbatches, grad_sum, count, layout)
        self._key = signature(call)
        try:
            if isinstance(self._call, Compiled):  # the key is its signature too
                flats, grads, in_grads, means, kept = self._call.call_keyed(self._key, *call)
            else:
                flats, grads, in_grads, means, kept = self._call(*call)
        except context.StepFunctionError:
            raise
        except Exception as error:
            if self._tried:
                raise
            self._fall_back(error)
            flats, grads, in_grads, means, kept = self._call(*call)
        self._tried = True
        # a split last stage's first microbatch may add no gradient yet (W will)
        grads = list(grads) if self.backward and grads is not None else None
        return list(flats), grads, list(in_grads), list(means), kept

    def _fall_back(self, error: Exception) -> None:
        """The first call could not trace the step function: run it eagerly from now on."""
        log.warning(
            "the @tfsift.step function could not be compiled with tf.function "
            "(%s: %s); it runs eagerly instead, which is slower. Make it "
            "tf.function-compatible, or use @tfsift.step(compile=False) to skip this attempt.",
            type(error).__name__,
            error,
        )
        self.compiled, self._tried, self._call = False, True, self._run

    def _rebuild(self, flat: Sequence[tf.Tensor]) -> Any:
        layout = self._layouts.get(self._key) if self._key is not None else None
        layout = layout or self._layout
        assert layout is not None
        leaves = list(layout.leaves)
        for position, tensor in zip(layout.tensor_positions, flat, strict=True):
            leaves[position] = tensor
        return tree.pack_sequence_as(layout.skeleton, leaves)

    def _run(
        self,
        inputs: list[tf.Tensor],
        microbatches: list[Microbatch],
        grad_sum: list[tf.Tensor] | None,
        count: tf.Tensor | None,
        layout: SplitLayout | None = None,
    ) -> tuple[list[list[tf.Tensor]], Any, list[tf.Tensor], list[tf.Tensor], Any]:
        # The step function is called here, not in a helper: AutoGraph converts what the
        # compiled function calls, but nothing that tfsift's own modules call.
        stage = self.stage
        first = stage.index == 0
        float_inputs = [x for x in inputs if is_float(x) and layout is None]
        wrt_inputs = [] if first else float_inputs
        split: list[Any] = []  # a split backward: the tape, then the split forward's results

        def model_call(model: Any, a: tuple[Any, ...], k: dict[str, Any]) -> Any:
            stage_inputs = [tf.convert_to_tensor(x) for x in tree.flatten(a)] if first else inputs
            if layout is None:
                outputs = stage.forward_call(stage_inputs, self.training)
            else:
                # the loss's gradients stop at the stage outputs (B and W walk the stage);
                # a tape around the nodes' forward functions could not differentiate them
                with split[0].stop_recording():
                    outputs, saved = layout.forward(list(stage_inputs))
                split[0].watch([y for y in outputs if is_float(y)])
                split[1:] = [outputs, saved]
            return tree.pack_sequence_as(self.output_structure, outputs)

        flats: list[list[tf.Tensor]] = []
        grads: list[tf.Tensor] | None = []
        in_grads: list[tf.Tensor] = []
        kept: Any = ()
        previous: list[tf.Tensor] = []
        for args, kwargs in microbatches:
            if previous:
                # One microbatch after the other, as in separate calls: a graph could run
                # them side by side and hold every microbatch's activations at once, which
                # microbatches in one process are there to avoid.
                with tf.control_dependencies(previous):
                    args, kwargs = tf.nest.map_structure(_after, (args, kwargs))
            ctx = context.StepContext(model_call, compiled=self.compiled)
            tape = tf.GradientTape() if self.backward else None
            split[:] = [tape]
            with tape if tape is not None else contextlib.nullcontext(), context.active(ctx):
                if tape is not None:
                    tape.watch(float_inputs)
                results = self.fn(*args, **kwargs)
            flats.append(self._flatten_results(results))
            previous = flats[-1]
            if tape is not None:
                request = single_request(ctx.requests)
                check_request(request, self.requested)
                if layout is not None:
                    grads, in_grads, kept = _split_backward(
                        tape, request.loss, layout, split[1:], grad_sum
                    )
                    continue
                sources = list(stage.variables) + wrt_inputs
                n = len(stage.variables)
                all_grads = gradients(tape, request.loss, sources, sparse=n)
                grads, in_grads = all_grads[:n], all_grads[n:]
                if grad_sum is not None:
                    grads = add(grad_sum, grads)
                grad_sum = previous = grads
        means = divide(grads, count) if count is not None and grads is not None else []
        return flats, grads, in_grads, means, kept

    def _flatten_results(self, results: Any) -> list[tf.Tensor]:
        """The tensors of ``results``; records how to put them back (the same every trace)."""
        marked = mark_gradients(results)
        leaves = tree.flatten(marked)
        positions = tuple(i for i, leaf in enumerate(leaves) if tf.is_tensor(leaf))
        plain = tuple(0 if i in positions else leaf for i, leaf in enumerate(leaves))
        layout = _Layout(tree.pack_sequence_as(marked, list(plain)), plain, positions)
        if self._layout is not None and (
            self._layout.tensor_positions != positions or len(self._layout.leaves) != len(plain)
        ):
            raise context.StepFunctionError(
                "a @tfsift.step function must return the same structure on every call. "
                f"Received: {len(positions)} tensors among {len(plain)} values, after "
                f"{len(self._layout.tensor_positions)} among {len(self._layout.leaves)}"
            )
        self._layout = layout
        if self._key is not None:
            self._layouts[self._key] = layout
        return [leaves[i] for i in positions]


def _split_backward(
    tape: tf.GradientTape,
    loss: Any,
    layout: SplitLayout,
    forward: list[Any],
    grad_sum: list[tf.Tensor] | None,
) -> tuple[list[tf.Tensor] | None, list[tf.Tensor], tuple[Any, ...]]:
    """B of a split last stage, from the loss and ``forward`` (the split forward's outputs
    and intermediates): (the running sum, with the gradients of variables the loss reads
    directly; the input gradients; what W reads)."""
    outputs, saved = forward
    stage_vars = list(layout.split.stage.variables)
    wanted = [y for y in outputs if is_float(y)]
    found = tape.gradient(loss, stage_vars + wanted)
    direct, out_grads = found[: len(stage_vars)], found[len(stage_vars) :]
    out_grads = [
        tf.zeros_like(y) if g is None else g for y, g in zip(wanted, out_grads, strict=True)
    ]
    if any(g is not None for g in direct):  # a penalty on a weight, say
        direct = [
            tf.zeros(tuple(v.shape), v.dtype) if g is None else tf.convert_to_tensor(g)
            for v, g in zip(stage_vars, direct, strict=True)
        ]
        grad_sum = direct if grad_sum is None else add(grad_sum, direct)
    in_grads, grads = layout.backward_input(saved, out_grads)
    return grad_sum, list(in_grads), ([saved[i] for i in layout.weighted], list(grads))


def _after(value: Any) -> Any:
    """A tensor read again, under the caller's control dependencies; anything else as is."""
    return tf.identity(value) if tf.is_tensor(value) else value


def mark_gradients(value: Any) -> Any:
    """``value`` with every ``tfsift.gradients`` result replaced by ``GRADS_MARKER``."""
    if isinstance(value, context.GradientList):
        return GRADS_MARKER
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(mark_gradients(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(mark_gradients(v) for v in value)
    if isinstance(value, dict):
        return {k: mark_gradients(v) for k, v in value.items()}
    return value


def single_request(requests: Sequence[context.GradientList]) -> context.GradientList:
    """The one ``tfsift.gradients`` call a training step makes per microbatch."""
    if len(requests) != 1:
        raise context.StepFunctionError(
            "a training step must call tfsift.gradients exactly once per call. "
            f"Received: {len(requests)} calls"
        )
    return requests[0]


def check_request(request: context.GradientList, variables: Sequence[Any]) -> None:
    """Gradients must be asked for this rank's stage variables, in their order."""
    if [id(v) for v in request.variables] != [id(v) for v in variables]:
        received = f"a list of {len(request.variables)} variables"
        if len(request.variables) == len(variables):
            at = next(
                i for i, (a, b) in enumerate(zip(request.variables, variables, strict=True))
                if a is not b
            )  # fmt: skip
            received += (
                f", the same number but not the same variables in the same order (first "
                f"difference at position {at}: {getattr(request.variables[at], 'path', '?')!r} "
                f"where {getattr(variables[at], 'path', '?')!r} was expected)"
            )
        raise context.StepFunctionError(
            "tfsift.gradients must be called with model.trainable_variables (this rank's stage "
            f"variables, {len(variables)} of them). Received: {received}"
        )
