"""What a forward and a backward action mean on the first, a middle and the last stage.

The executor runs one schedule loop for every stage; the role it is given decides
where a forward's inputs come from and where a backward's gradients go:

- ``FirstStage`` (s = 0 < K - 1): runs the step function only up to the model call,
  to learn the model input, then the stage forward; its backward sends nothing back.
- ``MiddleStage`` (0 < s < K - 1): forward on received activations, backward on
  received gradients.
- ``LastStage`` (s = K - 1): the head runs stage forward, the rest of the step
  function and, in a training step, the backward, fused (only its B where a zero-bubble
  schedule splits it); the schedule's backward action only checks that it ran. A lone
  stage (K = 1) runs no actions: one call of the head runs every microbatch
  (``Executor.run``).

A W action (the weight gradients of a split backward) means the same on every stage and
needs no role: the executor runs it where the stage split its backward.

With virtual stages a rank runs several chunks, each with the role of its index among
the K v chunks (a rank's chunk K - 1 is a middle stage, sending to chunk K on rank 0);
every method is given the chunk its action runs.

Roles hold no state (the executor does), so one role object serves every step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import tensorflow as tf
from keras import tree

from tfsift.pipeline import context

if TYPE_CHECKING:
    from tfsift.pipeline.executor import Executor
    from tfsift.pipeline.plan import Chunk


class Role(Protocol):
    """Stage-specific meaning of the schedule's F and B actions."""

    def forward(self, ex: Executor, chunk: Chunk, m: int) -> None: ...

    def backward(self, ex: Executor, chunk: Chunk, m: int) -> None: ...


class FirstStage:
    """Stage 0 of a pipeline of two or more stages."""

    def forward(self, ex: Executor, chunk: Chunk, m: int) -> None:
        inputs = model_input(ex, m)
        try:
            ex.stage_forward(chunk, m, inputs)
        except tf.errors.InvalidArgumentError:  # checked on failure only: free for a step
            check_shapes(inputs, chunk.in_specs)
            raise

    def backward(self, ex: Executor, chunk: Chunk, m: int) -> None:
        ex.stage_backward(chunk, m)


def check_shapes(inputs: list[tf.Tensor], specs: Any) -> None:
    """Names a model input whose shape is not the one the model was traced for (but the
    batch size), where TensorFlow failed inside the stage ("Matrix size-incompatible")."""
    expected = [(None, *shape) for shape, _ in specs]
    received = [tuple(x.shape) for x in inputs]
    if len(received) != len(expected) or any(
        len(r) != len(e) or any(a is not None and a != b for a, b in zip(e, r, strict=True))
        for r, e in zip(received, expected, strict=True)
    ):
        raise ValueError(
            "the model's inputs keep the shapes of its first call, but for the batch size: "
            f"expected {', '.join(map(str, expected))}. Received: "
            f"{', '.join(map(str, received))}"
        ) from None  # TensorFlow's error inside the stage's graph says no more


class MiddleStage:
    """A stage that receives activations and sends them on."""

    def forward(self, ex: Executor, chunk: Chunk, m: int) -> None:
        ex.stage_forward(chunk, m, ex.inputs.pop((chunk.index, m)))

    def backward(self, ex: Executor, chunk: Chunk, m: int) -> None:
        ex.stage_backward(chunk, m)


class LastStage:
    """The stage that runs the step function's head, one microbatch an action."""

    def forward(self, ex: Executor, chunk: Chunk, m: int) -> None:
        head, c = chunk.head, chunk.index
        assert head is not None, "the last stage runs the step function's head"
        inputs = [] if c == 0 else ex.inputs.pop((c, m))
        done = head(inputs, ex.microbatches[m], ex.grad_sums.get(c))
        ex.results[m] = done.results
        if ex.plan.backward:
            ex.grad_sums[c], ex.in_grads[c, m] = done.grad_sum, done.in_grads
            ex.fused.add(m)
            if done.pending is not None:  # a split backward: W comes later
                ex.pending[c, m] = done.pending

    def backward(self, ex: Executor, chunk: Chunk, m: int) -> None:
        ex.fused.remove(m)  # ran with the forward; KeyError if the schedule is wrong


def role_for(s: int, K: int) -> Role:
    """The role of stage ``s`` of ``K`` (chunk s of K v, with virtual stages)."""
    if s == K - 1:
        return LastStage()
    return FirstStage() if s == 0 else MiddleStage()


def model_input(ex: Executor, m: int) -> list[tf.Tensor]:
    """Runs the step function on microbatch ``m`` until it calls the model; returns the input."""

    def capture(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise context.InputCaptured([tf.convert_to_tensor(x) for x in tree.flatten(args)])

    args, kwargs = ex.microbatches[m]
    try:
        with context.active(context.StepContext(capture)):
            ex.fn(*args, **kwargs)
    except context.InputCaptured as captured:
        return captured.inputs
    raise RuntimeError("the @tfsift.step function returned without calling the model")
