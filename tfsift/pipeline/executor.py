"""Interprets one rank's list of schedule actions for one step.

Every schedule (``simple``, ``interleaved``, forward-only) is a list of
``partitioner.schedule.Action`` per stage; this is the only loop that runs them.
What a forward or a backward means on this stage is the plan's role
(``tfsift.pipeline.roles``): on the last stage a forward runs the user's step
function (the "head": loss and anything else computed from the predictions) and, in
a training step, the backward too, in one compiled call; the schedules put each
backward right after its forward there, and the backward action finds it done. A
zero-bubble schedule's W runs the weight gradients of a backward split into B and W
(``tfsift.pipeline.split``) where the stage splits it, and nothing elsewhere. On
stage 0 of a longer pipeline the step function runs only until the model is called,
to learn the model input. A lone stage (K = 1) sends and receives nothing, so one call
of the head runs all of a step's microbatches instead of the actions. With virtual
stages an action names the chunk it runs: what a microbatch leaves between actions is
kept per (chunk, microbatch), each chunk sums its own gradients, and the rank's are
combined from them at the end of the step (``tfsift.pipeline.chunks``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from keras import tree

from partitioner.schedule import Action, Kind
from tfsift import hooks
from tfsift.parallel.comm import BACKWARD, CHECK, FORWARD
from tfsift.pipeline.plan import Chunk, Spec, StepPlan
from tfsift.pipeline.split import Kept, Pending
from tfsift.pipeline.stage import Saved

Microbatch = tuple[tuple[Any, ...], dict[str, Any]]
FINGERPRINT = 4  # the values of a microbatch's fingerprint (``fingerprint``)
Timed = list[tuple[Action, float, float]]
Key = tuple[int, int]  # (chunk, microbatch)


@dataclasses.dataclass
class StepResult:
    """What one step left on this rank.

    Args:
        results: the step function's return value per microbatch (last stage only).
        grad_sum: the sum over microbatches of the stage's variable gradients (training).
        grad_mean: ``grad_sum / M`` where the step computed it already (one stage).
    """

    results: list[Any] | None
    grad_sum: list[tf.Tensor] | None
    grad_mean: list[tf.Tensor] | None = None


class Executor:
    """Runs this rank's actions of ``plan`` over the step's M microbatches."""

    def __init__(
        self, plan: StepPlan, fn: Callable[..., Any], microbatches: Sequence[Microbatch]
    ) -> None:
        self.plan, self.fn, self.microbatches = plan, fn, microbatches
        self.inputs: dict[Key, list[tf.Tensor]] = {}
        self.outputs: dict[Key, list[tf.Tensor]] = {}
        self.saved: dict[Key, Saved | None] = {}
        self.kept: dict[Key, Kept] = {}  # a split backward's F, for its B
        self.pending: dict[Key, Pending] = {}  # a split backward's B, for its W
        self.out_grads: dict[Key, list[tf.Tensor]] = {}
        self.in_grads: dict[Key, list[tf.Tensor]] = {}
        # per chunk, summed as backwards finish: no M copies
        self.grad_sums: dict[int, list[tf.Tensor] | None] = {}
        self.fused: set[int] = set()  # last stage: microbatches whose backward is done
        self.results: dict[int, Any] = {}
        self._fingerprints: dict[int, np.ndarray] = {}

    def run(self, timed: Timed | None = None) -> StepResult:
        """Executes the plan's actions in order, then completes outstanding sends.

        With ``timed``, appends (action, start, end) in ``time.perf_counter`` seconds.
        """
        if self.plan.K == 1:
            return self._run_all(timed)
        for action in self.plan.actions:
            start = time.perf_counter()
            # Look the handler up per action: a dict of bound methods on self would make a
            # reference cycle that keeps every step's tensors alive until a full GC.
            getattr(self, _HANDLERS[action.kind])(self.plan.chunk(action.stage), action.microbatch)
            if timed is not None:
                timed.append((action, start, time.perf_counter()))
        self.plan.comm.wait()
        combine = self.plan.combine
        grad_sum = self.grad_sums.get(self.plan.s) if combine is None else combine(self.grad_sums)
        if not self.plan.last:
            return StepResult(None, grad_sum)
        return StepResult([self.results[m] for m in range(len(self.microbatches))], grad_sum)

    def _run_all(self, timed: Timed | None) -> StepResult:
        """One stage: every microbatch in one call of the head (nothing to send or
        receive, so the schedule's actions need not run one by one)."""
        head = self.plan.head
        assert head is not None, "the only stage runs the step function's head"
        start = time.perf_counter()
        done = head.run_all(self.microbatches)
        end = time.perf_counter()
        if timed is not None:
            # One call ran them all: each forward (with its fused backward, as on any
            # last stage) is shown as an equal share of it, each backward as an instant.
            share, at = (end - start) / len(self.microbatches), start
            for action in self.plan.actions:
                took = share if action.kind == Kind.FORWARD else 0.0
                timed.append((action, at, at + took))
                at += took
        return StepResult(done.results, done.grad_sum, done.grad_mean)

    def stage_forward(self, chunk: Chunk, m: int, inputs: list[tf.Tensor]) -> None:
        """Runs the chunk on microbatch ``m``, keeping what its backward needs."""
        plan, key = self.plan, (chunk.index, m)
        if chunk.split is not None:
            self.outputs[key], self.kept[key] = chunk.split.forward(inputs, plan.training)
            return
        self.outputs[key], self.saved[key] = chunk.stage.forward(
            inputs, plan.training, keep=plan.backward
        )

    def stage_backward(self, chunk: Chunk, m: int) -> None:
        """Backward of microbatch ``m`` from the received output gradients (only the input
        gradients where the stage splits its backward)."""
        split, key = chunk.split, (chunk.index, m)
        if split is not None:
            grads = self.out_grads.pop(key)
            self.in_grads[key], self.pending[key] = split.backward_input(self.kept.pop(key), grads)
            return
        saved = self.saved.pop(key)
        assert saved is not None
        self.grad_sums[chunk.index], self.in_grads[key] = chunk.stage.backward(
            saved, self.out_grads.pop(key), self.grad_sums.get(chunk.index)
        )
        self.outputs.pop(key, None)

    def stage_weights(self, chunk: Chunk, m: int) -> None:
        """W of microbatch ``m``: its weight gradients, added to the sum, where the stage
        splits its backward; nothing where its B ran the whole backward."""
        split, c = chunk.split, chunk.index
        if split is not None:  # KeyError if the schedule runs W before B
            self.grad_sums[c] = split.backward_weights(
                self.pending.pop((c, m)), self.grad_sums.get(c)
            )

    def _forward(self, chunk: Chunk, m: int) -> None:
        chunk.role.forward(self, chunk, m)

    def _backward(self, chunk: Chunk, m: int) -> None:
        chunk.role.backward(self, chunk, m)

    def _weights(self, chunk: Chunk, m: int) -> None:
        self.stage_weights(chunk, m)

    def _send_forward(self, chunk: Chunk, m: int) -> None:
        key, dest = (chunk.index, m), self.plan.rank_of(chunk.index + 1)
        self.plan.comm.send([self._fingerprint(m)], dest, CHECK, m)
        self.plan.comm.send(self.outputs[key], dest, FORWARD, m)
        if chunk.stage.recompute or not self.plan.backward or chunk.split is not None:
            self.outputs.pop(key)

    def _recv_forward(self, chunk: Chunk, m: int) -> None:
        # Messages between two ranks for one microbatch but different chunks share a tag:
        # MPI keeps their order, and both ranks run the chunks of a microbatch in order.
        c, source = chunk.index, self.plan.rank_of(chunk.index - 1)
        (theirs,) = self.plan.comm.recv_arrays([((FINGERPRINT,), tf.float64)], source, CHECK, m)
        mine = self._fingerprint(m)
        if not np.array_equal(theirs, mine, equal_nan=True):
            raise RuntimeError(mismatch_message(c, m, theirs, mine))
        specs = self._shapes(chunk.in_specs, m)
        self.inputs[c, m] = self.plan.comm.recv(specs, source, FORWARD, m)

    def _send_backward(self, chunk: Chunk, m: int) -> None:
        dest = self.plan.rank_of(chunk.index - 1)
        self.plan.comm.send(self.in_grads.pop((chunk.index, m)), dest, BACKWARD, m)

    def _recv_backward(self, chunk: Chunk, m: int) -> None:
        specs = self._shapes(chunk.grad_specs, m)
        source = self.plan.rank_of(chunk.index + 1)
        # Stage 0 waits for gradients from the later stages: work offered for those waits
        # (tfsift.hooks; sifting's early exit with overlap scores its next round) runs then.
        idle = hooks.stage0_wait() if self.plan.s == 0 else None
        self.out_grads[chunk.index, m] = self.plan.comm.recv(specs, source, BACKWARD, m, idle=idle)

    def _fingerprint(self, m: int) -> np.ndarray:
        if m not in self._fingerprints:
            self._fingerprints[m] = fingerprint(self.microbatches[m])
        return self._fingerprints[m]

    def _shapes(self, specs: Sequence[Spec], m: int) -> list[Spec]:
        batch = microbatch_size(self.microbatches[m])
        return [((batch, *shape), dtype) for shape, dtype in specs]


_HANDLERS = {
    Kind.FORWARD: "_forward",
    Kind.BACKWARD: "_backward",
    Kind.WEIGHT: "_weights",
    Kind.SEND_F: "_send_forward",
    Kind.RECV_F: "_recv_forward",
    Kind.SEND_B: "_send_backward",
    Kind.RECV_B: "_recv_backward",
}


def fingerprint(microbatch: Microbatch) -> np.ndarray:
    """[batch size, sum, sum of squares, non-finite values] over the microbatch's tensors,
    in float64.

    Every stage of a pipeline must be given the same batches; this cheap summary lets a
    stage check that against the previous one before it receives any activations. NaN and
    infinite values are counted, not summed: a NaN would make both sums NaN, which equals
    nothing, and the same data holding a NaN would look like other data (the step then
    trains on it as one process does).

    Example:
        >>> fingerprint(((np.array([[1.0, np.nan], [2.0, np.inf]]),), {})).tolist()
        [2.0, 3.0, 5.0, 2.0]
    """
    total = np.zeros(FINGERPRINT)
    total[0] = microbatch_size(microbatch)
    for leaf in tree.flatten(microbatch):
        if (tf.is_tensor(leaf) or isinstance(leaf, np.ndarray)) and leaf.dtype != tf.string:
            values = np.asarray(leaf, dtype=np.float64)
            sums = values.sum(), np.square(values).sum()
            if not np.isfinite(sums).all():  # the rare case: the check costs a pass then
                finite = np.isfinite(values)
                total[3] += finite.size - np.count_nonzero(finite)
                sums = values[finite].sum(), np.square(values[finite]).sum()
            total[1:3] += sums
    return total


def mismatch_message(s: int, m: int, theirs: np.ndarray, mine: np.ndarray) -> str:
    """The error of a stage fed other data than the previous stage."""
    return (
        f"stage {s} was given other data than stage {s - 1} for microbatch {m} of this step "
        "(every stage of a pipeline must see the same batches in the same order). Give "
        "every stage of a pipeline the same data: shard with tfsift.shard(dataset, "
        "shuffle_buffer=..., seed=...), which shuffles alike along a pipeline, rather than "
        "dataset.shard(num_workers, rank) or an unseeded .shuffle(). Received: [batch size, "
        "sum, sum of squares, non-finite values] "
        f"{theirs.tolist()} from stage {s - 1}, {mine.tolist()} here"
    )


def microbatch_size(microbatch: Microbatch) -> int:
    """The leading dimension of the first tensor in a microbatch's arguments."""
    for leaf in tree.flatten(microbatch):
        if hasattr(leaf, "shape") and len(leaf.shape) > 0:
            return int(leaf.shape[0])
    raise ValueError("a @tfsift.step function needs at least one tensor argument with a batch axis")
