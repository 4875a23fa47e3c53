"""What a model call or ``tfsift.gradients`` does depends on which part of a step is running."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf


class InputCaptured(Exception):
    """Raised inside the step function on stage 0 once the model input is known."""

    def __init__(self, inputs: list[Any]) -> None:
        super().__init__("model input captured")
        self.inputs = inputs


GRAPH_MODE_ERROR = (
    "do not wrap a @tfsift.step function in tf.function: tfsift compiles the "
    "stages' forward and backward and the loss head itself"
)


class StepFunctionError(ValueError):
    """A ``@tfsift.step`` function broke a rule of steps (found while it runs or is traced)."""

    # AutoGraph leaves errors with this attribute as they are, instead of re-raising them
    # as a StagingError, so the rule's message reaches the user unchanged from the trace.
    ag_pass_through = True


class GradientList(list[Any]):
    """What ``tfsift.gradients`` returns inside a step: filled in by the backward pass."""

    def __init__(self, loss: tf.Tensor, variables: Sequence[Any]) -> None:
        super().__init__([None] * len(variables))
        self.loss = loss
        self.variables = list(variables)


class StepContext:
    """The hooks a model call and ``tfsift.gradients`` use while a step function runs."""

    def __init__(
        self,
        model_call: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any],
        compiled: bool = False,
    ) -> None:
        self.model_call = model_call
        self.compiled = compiled  # the step function is being traced by tfsift itself
        self.requests: list[GradientList] = []


_CURRENT: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar(
    "tfsift_step", default=None
)


def current() -> StepContext | None:
    """The context of the step function running now, if any."""
    return _CURRENT.get()


@contextlib.contextmanager
def active(ctx: StepContext) -> Iterator[StepContext]:
    """Makes ``ctx`` current while a step function runs."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


def gradients(loss: tf.Tensor, variables: Sequence[Any]) -> GradientList:
    """Asks for the gradients of ``loss`` with respect to ``variables`` inside a step.

    Call it with ``model.trainable_variables``: on every rank the result holds the
    gradients of that rank's stage variables, in the same order.

    Raises:
        RuntimeError: outside a ``@tfsift.step`` function.
    """
    ctx = current()
    if ctx is None:
        raise RuntimeError("tfsift.gradients() can only be called inside a @tfsift.step function")
    request = GradientList(loss, variables)
    ctx.requests.append(request)
    return request
