"""Interprets one rank's list of schedule actions for one step.

Every schedule (``simple``, ``interleaved``, forward-only) is a list of
``partitioner.schedule.Action`` per stage; this is the only loop that runs them.
On the last stage a forward runs the user's step function (the "head": loss and
anything else computed from the predictions) and a backward starts from the
gradient of the loss with respect to the predictions; on stage 0 the step
function runs only until the model is called, to learn the model input.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from keras import tree

from partitioner.schedule import Action, Kind
from tfsift import context
from tfsift.comm import BACKWARD, FORWARD, PipeComm
from tfsift.stage import Saved, Stage, is_float

Microbatch = tuple[tuple[Any, ...], dict[str, Any]]
Spec = tuple[tuple[int, ...], Any]


class Executor:
    """Runs the actions of stage ``s`` of a K-stage pipeline over M microbatches."""

    def __init__(
        self,
        stage: Stage,
        num_stages: int,
        comm: PipeComm,
        fn: Callable[..., Any],
        microbatches: Sequence[Microbatch],
        specs: tuple[Sequence[Spec], Sequence[Spec]],
        output_structure: Any,
        backward: bool,
        training: bool,
    ) -> None:
        self.stage, self.s, self.K = stage, stage.index, num_stages
        self.comm, self.fn, self.microbatches = comm, fn, microbatches
        self.in_specs, out_specs = specs
        # gradients come back only for float outputs (integer tensors carry none)
        self.grad_specs = [spec for spec in out_specs if tf.as_dtype(spec[1]).is_floating]
        self.output_structure = output_structure
        self.backward, self.training = backward, training
        self.inputs: dict[int, list[tf.Tensor]] = {}
        self.outputs: dict[int, list[tf.Tensor]] = {}
        self.saved: dict[int, Saved | None] = {}
        self.heads: dict[int, tuple[tf.GradientTape | None, list[context.GradientList]]] = {}
        self.out_grads: dict[int, list[tf.Tensor]] = {}
        self.in_grads: dict[int, list[tf.Tensor]] = {}
        self.grad_sum: list[tf.Tensor] | None = None  # summed as backwards finish: no M copies
        self.results: dict[int, Any] = {}

    def run(self, actions: Sequence[Action]) -> None:
        """Executes ``actions`` in order, then completes outstanding sends."""
        for action in actions:
            # Look the handler up per action: a dict of bound methods on self would make a
            # reference cycle that keeps every step's tensors alive until a full GC.
            getattr(self, _HANDLERS[action.kind])(action.microbatch)
        self.comm.wait()

    @property
    def last(self) -> bool:
        return self.s == self.K - 1

    def _forward(self, m: int) -> None:
        if self.last:
            self._run_head(m)
        elif self.s == 0:
            self._stage_forward(m, self._capture_input(m))
        else:
            self._stage_forward(m, self.inputs.pop(m))

    def _stage_forward(self, m: int, inputs: list[tf.Tensor]) -> list[tf.Tensor]:
        outputs, self.saved[m] = self.stage.forward(inputs, self.training, keep=self.backward)
        self.outputs[m] = outputs
        return outputs

    def _capture_input(self, m: int) -> list[tf.Tensor]:
        def capture(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            raise context.InputCaptured(_flat_inputs(args))

        args, kwargs = self.microbatches[m]
        try:
            with context.active(context.StepContext(capture, probe=False)):
                self.fn(*args, **kwargs)
        except context.InputCaptured as captured:
            return captured.inputs
        raise RuntimeError("the @tfsift.step function returned without calling the model")

    def _run_head(self, m: int) -> None:
        ctx = context.StepContext(lambda model, a, k: self._head_model_call(m, a), probe=False)
        args, kwargs = self.microbatches[m]
        tape = tf.GradientTape() if self.backward else None
        with context.active(ctx), tape if tape is not None else contextlib.nullcontext():
            ctx.tape = tape
            self.results[m] = self.fn(*args, **kwargs)
        if self.backward and len(ctx.requests) != 1:
            raise RuntimeError(
                "a training step must call tfsift.gradients exactly once per call. "
                f"Received: {len(ctx.requests)} calls"
            )
        self.heads[m] = (tape, ctx.requests)

    def _head_model_call(self, m: int, args: tuple[Any, ...]) -> Any:
        tape = context.current().tape  # type: ignore[union-attr]
        inputs = _flat_inputs(args) if self.s == 0 else self.inputs.pop(m)
        with tape.stop_recording() if tape is not None else contextlib.nullcontext():
            outputs = self._stage_forward(m, inputs)
        if tape is not None:
            tape.watch([y for y in outputs if is_float(y)])
        return tree.pack_sequence_as(self.output_structure, outputs)

    def _backward(self, m: int) -> None:
        direct: list[tf.Tensor | None] = []
        if self.last:
            out_grads, direct = self._head_gradients(m)
        else:
            out_grads = self.out_grads.pop(m)
        saved = self.saved.pop(m)
        assert saved is not None
        var_grads, self.in_grads[m] = self.stage.backward(saved, out_grads)
        self.outputs.pop(m, None)
        for i, extra in enumerate(direct):  # a loss that reads a variable directly (a penalty)
            if extra is not None:
                var_grads[i] = var_grads[i] + tf.convert_to_tensor(extra)
        if self.grad_sum is None:
            self.grad_sum = var_grads
        else:
            self.grad_sum = [a + b for a, b in zip(self.grad_sum, var_grads, strict=True)]

    def _head_gradients(self, m: int) -> tuple[list[tf.Tensor], list[tf.Tensor | None]]:
        """d loss / d predictions, and d loss / d variable along paths that skip the model."""
        tape, (request,) = self.heads.pop(m)
        assert tape is not None
        _check_request(request, self.stage.variables)
        predictions = [y for y in self.outputs[m] if is_float(y)]
        grads = tape.gradient(request.loss, predictions + list(self.stage.variables))
        n = len(predictions)
        out_grads = [
            tf.zeros_like(y) if g is None else tf.convert_to_tensor(g)
            for y, g in zip(predictions, grads[:n], strict=True)
        ]
        return out_grads, list(grads[n:])

    def _send_forward(self, m: int) -> None:
        self.comm.send(self.outputs[m], self.s + 1, FORWARD, m)
        if self.stage.recompute or not self.backward:
            self.outputs.pop(m)

    def _recv_forward(self, m: int) -> None:
        self.inputs[m] = self.comm.recv(self._shapes(self.in_specs, m), self.s - 1, FORWARD, m)

    def _send_backward(self, m: int) -> None:
        self.comm.send(self.in_grads.pop(m), self.s - 1, BACKWARD, m)

    def _recv_backward(self, m: int) -> None:
        self.out_grads[m] = self.comm.recv(
            self._shapes(self.grad_specs, m), self.s + 1, BACKWARD, m
        )

    def _shapes(self, specs: Sequence[Spec], m: int) -> list[Spec]:
        batch = microbatch_size(self.microbatches[m])
        return [((batch, *shape), dtype) for shape, dtype in specs]


def _check_request(request: context.GradientList, variables: Sequence[Any]) -> None:
    if [id(v) for v in request.variables] != [id(v) for v in variables]:
        raise ValueError(
            "tfsift.gradients must be called with model.trainable_variables (this rank's stage "
            f"variables, {len(variables)} of them). Received: a list of "
            f"{len(request.variables)} variables"
        )


_HANDLERS = {
    Kind.FORWARD: "_forward",
    Kind.BACKWARD: "_backward",
    Kind.SEND_F: "_send_forward",
    Kind.RECV_F: "_recv_forward",
    Kind.SEND_B: "_send_backward",
    Kind.RECV_B: "_recv_backward",
}


def microbatch_size(microbatch: Microbatch) -> int:
    """The leading dimension of the first tensor in a microbatch's arguments."""
    for leaf in tree.flatten(microbatch):
        if hasattr(leaf, "shape") and len(leaf.shape) > 0:
            return int(leaf.shape[0])
    raise ValueError("a @tfsift.step function needs at least one tensor argument with a batch axis")


def _flat_inputs(args: tuple[Any, ...]) -> list[tf.Tensor]:
    return [tf.convert_to_tensor(x) for x in tree.flatten(args)]
