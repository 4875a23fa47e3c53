"""Interprets one rank's list of schedule actions for one step.

Every schedule (``simple``, ``interleaved``, forward-only) is a list of
``partitioner.schedule.Action`` per stage; this is the only loop that runs them.
On the last stage a forward runs the user's step function (the "head": loss and
anything else computed from the predictions) and, in a training step, the
backward too, in one compiled call (``tfsift.pipeline.head``); the schedules put each
backward right after its forward there, and the backward action finds it done.
On stage 0 of a longer pipeline the step function runs only until the model is
called, to learn the model input.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from keras import tree

from partitioner.schedule import Action, Kind
from tfsift.parallel.comm import BACKWARD, FORWARD, PipeComm
from tfsift.pipeline import context
from tfsift.pipeline.head import Head
from tfsift.pipeline.stage import Saved, Stage

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
        head: Head | None,
    ) -> None:
        self.stage, self.s, self.K = stage, stage.index, num_stages
        self.head = head
        self.comm, self.fn, self.microbatches = comm, fn, microbatches
        self.in_specs, out_specs = specs
        # gradients come back only for float outputs (integer tensors carry none)
        self.grad_specs = [spec for spec in out_specs if tf.as_dtype(spec[1]).is_floating]
        self.output_structure = output_structure
        self.backward, self.training = backward, training
        self.inputs: dict[int, list[tf.Tensor]] = {}
        self.outputs: dict[int, list[tf.Tensor]] = {}
        self.saved: dict[int, Saved | None] = {}
        self.out_grads: dict[int, list[tf.Tensor]] = {}
        self.in_grads: dict[int, list[tf.Tensor]] = {}
        self.grad_sum: list[tf.Tensor] | None = None  # summed as backwards finish: no M copies
        self.fused: set[int] = set()  # last stage: microbatches whose backward is done
        self.results: dict[int, Any] = {}

    def run(
        self, actions: Sequence[Action], timed: list[tuple[Action, float, float]] | None = None
    ) -> None:
        """Executes ``actions`` in order, then completes outstanding sends.

        With ``timed``, appends (action, start, end) in ``time.perf_counter`` seconds.
        """
        for action in actions:
            start = time.perf_counter()
            # Look the handler up per action: a dict of bound methods on self would make a
            # reference cycle that keeps every step's tensors alive until a full GC.
            getattr(self, _HANDLERS[action.kind])(action.microbatch)
            if timed is not None:
                timed.append((action, start, time.perf_counter()))
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

    def _stage_forward(self, m: int, inputs: list[tf.Tensor]) -> None:
        self.outputs[m], self.saved[m] = self.stage.forward(
            inputs, self.training, keep=self.backward
        )

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
        assert self.head is not None, "the last stage runs the step function's head"
        inputs = [] if self.s == 0 else self.inputs.pop(m)
        done = self.head(inputs, self.microbatches[m], self.grad_sum)
        self.results[m] = done.results
        if self.backward:
            self.grad_sum, self.in_grads[m] = done.grad_sum, done.in_grads
            self.fused.add(m)

    def _backward(self, m: int) -> None:
        if self.last:
            self.fused.remove(m)  # ran with the forward; KeyError if the schedule is wrong
            return
        saved = self.saved.pop(m)
        assert saved is not None
        var_grads, self.in_grads[m] = self.stage.backward(saved, self.out_grads.pop(m))
        self.outputs.pop(m, None)
        self.grad_sum = self.stage.accumulate(self.grad_sum, var_grads)

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
