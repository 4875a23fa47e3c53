"""The early-exit head and how it learns: from each round's kept samples, one round late.

The head takes one Adam step per sifted round on the exit features of the samples the
policy kept, with the user's loss (no gradient reaches the trunk). Where that step runs
matters on a pipeline: at the round every stage waits for stage 0, and as part of the
next round's first scoring call it made that call 3.5x a plain one (1.35 against
0.38 ms at 779644c, docs/benchmarks-log.md, Early-exit scoring calls), too long for
most of stage 0's waits for gradients, and the round's other units had to wait for it
(they score with the updated head). So the step is spread over the calls that score the next round
(now 0.68 against 0.54 ms). Letters: r a round, b one source batch of it::

    round r+1's calls:  apply mean(r-1), score b1 + sum grads(r, b1) | score b2 + grads(r, b2) | ...
    at round r+1:       select -> learn(kept of r+1): mean(r) = sums(r) / kept(r)
    round r+2's calls:  apply mean(r), score b1 + grads(r+1, b1) | ...

A call then costs a scoring and the gradient of as many batches' kept rows as it scores
(a unit of overlap may score several, ``tfsift.sift.experimental.overlap``), the first
of a round also the optimizer's update, and every call of a round scores with the same head
(the one learnt from the rounds up to two before), however overlap split the round.
With several replicas the mean is averaged at the round, where the losses are gathered
anyway, over the replicas whose calls learnt something (all of them join it). With
``learn_rest=False`` (overlap with ``leftover="keep"``) what the calls of a round did
not learn is dropped at the round instead of learnt there in a call of its own, and the
mean is over the kept rows the calls learnt: the head learns what stage 0's idle time
paid for, as the sifter sifts what it could score.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfsift.pipeline.compiled import Compiled
from tfsift.sift.experimental.collectives import HeadGroup
from tfsift.sift.replicas import HEAD_WEIGHTS

Grads = list[Any]
# features, labels and mask of kept rows (1.0) of a part of a round's scoring, and the
# [start, stop) of its rows one call learns
Chunk = tuple[Any, Any, Any, Any]
Queued = tuple[Any, Any, np.ndarray, int, int]  # part, labels, its mask, start, stop
# timed calls of ``call_seconds`` (0.35 to 0.37 ms each in bench_overlap.py's plans)
CALL_REPEATS = 20


class ExitHead:
    """A head on the exit's features, its optimizer and its pending learning.

    Example:
        >>> spec = tf.TensorSpec((None, 40, 32), tf.float32)  # the exit's features
        >>> head = ExitHead(None, spec, (10,), loss, 1e-3, exit_features, group)
        >>> features, losses, logits = head.score(x, y, chunks=None)
        >>> head.learn([features], [y], kept=np.array([0, 3]), batch=None)
    """

    def __init__(
        self,
        user: Any,
        feature: tf.TensorSpec,
        out_shape: tuple[int, ...],
        loss: Callable[..., Any],
        lr: float,
        features: Callable[[tf.Tensor], tf.Tensor],
        group: HeadGroup,
        learn_rest: bool = True,
    ) -> None:
        self.model = make_head(user, tuple(feature.shape[1:]), out_shape)
        self.loss, self.group, self._features = loss, group, features
        self.learn_rest = learn_rest
        self._feature, self._traced = feature, False
        self.optimizer = keras.optimizers.Adam(lr)
        head_vars = self.model.trainable_variables
        self.optimizer.build(head_vars)
        self._queue: list[Queued] = []  # round r's rows to learn
        # Their summed gradients, as far as computed, added inside the compiled calls:
        # added eagerly, one op per variable after each call, they took 0.13 ms of a
        # 1.05 ms unit in bench_overlap's pipeline (a throwaway profile).
        self._sums = [tf.Variable(tf.zeros_like(v), trainable=False) for v in head_vars]
        self._learnt = 0  # calls that added to them since round r-1's ended
        self._finished = False  # finish_early ran since the last learn
        self._kept = 0  # kept rows of round r that calls have learnt so far
        self._ready: tuple[Grads, tf.Tensor] | None = None  # round r-1's sums and 1/kept
        self._score = Compiled(self._scored, "early-exit scoring")
        self._learn_and_score = Compiled(self._learnt_and_scored, "exit head gradients and scoring")
        self._apply_and_score = Compiled(self._applied_and_scored, "exit head update and scoring")
        self._apply_learn_and_score = Compiled(self._all, "exit head update, gradients and scoring")
        self.grads = Compiled(self._kept_grads, "exit head gradients")
        self._learn = Compiled(self._add_grads, "exit head gradients, summed")
        self._apply = Compiled(self._apply_grads, "exit head update")
        self._take_sums = Compiled(self._sums_taken, "exit head gradient sums")

    @property
    def signatures(self) -> int:
        """Argument signatures met so far by the compiled calls; one more after a call
        means it traced or looked up a new shape, which its time says nothing about."""
        calls = (self._score, self._learn_and_score, self._apply_and_score)
        return sum(c.traces for c in (*calls, self._apply_learn_and_score))

    @property
    def applies_next(self) -> bool:
        """Whether the next scoring call also applies the optimizer's update."""
        return self._ready is not None

    def score(self, x: Any, y: Any, chunks: int | None) -> tuple[Any, Any, Any]:
        """Features, losses and predictions of ``(x, y)`` in one compiled call, which also
        applies a pending update first and computes the gradients of the next ``chunks``
        source batches of the round being learnt (``None``: all that are left)."""
        if not self._traced:
            self._trace(x, y)
        ready, self._ready = self._ready, None
        chunk = self._take(chunks)
        if ready is None:
            out = self._score(x, y) if chunk is None else self._learn_and_score(x, y, *chunk)
        elif chunk is None:
            out = self._apply_and_score(x, y, *ready)
        else:
            out = self._apply_learn_and_score(x, y, *ready, *chunk)
        features, losses, predictions = out
        return features, losses, predictions

    def _trace(self, x: Any, y: Any) -> None:
        """Traces the four scoring calls for any batch size, and the taking of the
        gradient sums, before the first call. Each traced lazily at its first use and
        again at its second shape: 8 traces that fell at random points of the first
        rounds, inside waits or at a round."""
        self._traced = True
        xs, ys = (tf.TensorSpec((None, *t.shape[1:]), t.dtype) for t in (x, y))
        variables = self.model.trainable_variables
        ready = (
            [tf.TensorSpec(v.shape, v.dtype) for v in variables],
            tf.TensorSpec((), variables[0].dtype),
        )
        chunk = (
            self._feature,
            ys,
            tf.TensorSpec((None,), tf.float32),
            tf.TensorSpec((2,), tf.int32),
        )
        self._score.function.get_concrete_function(xs, ys)
        self._learn_and_score.function.get_concrete_function(xs, ys, *chunk)
        self._apply_and_score.function.get_concrete_function(xs, ys, *ready)
        self._apply_learn_and_score.function.get_concrete_function(xs, ys, *ready, *chunk)
        self._take_sums.function.get_concrete_function()

    def learn(
        self, features: list[Any], labels: list[Any], kept: np.ndarray, batch: int | None
    ) -> None:
        """Round r's rows ``kept`` (positions over the parts ``features``/``labels`` of its
        scoring) are learnt by the calls that score the next round, ``batch`` rows per
        call; round r-1's gradients end here (with replicas: a collective)."""
        if self._finished:  # already, in a wait of the last step (``finish_early``)
            self._finished = False
        else:
            self._finish()
        mask = np.zeros(sum(int(part.shape[0]) for part in features), np.float32)
        mask[kept] = 1.0
        self._kept = 0
        self._queue = list(_chunks(features, labels, mask, batch))

    @property
    def finishes_early(self) -> bool:
        """Whether ``finish_early`` may run now: the round's calls have learnt something
        that is not finished yet, and there is one replica (with several the mean is a
        collective of the replicas, which must meet at the round)."""
        return self._learnt > 0 and not self._finished and self.group.replicas == 1

    def finish_early(self) -> None:
        """What ``learn`` does first, ahead of it: once a round's calls have all run,
        stage 0 may finish the gradients they learnt inside a wait for gradients instead
        of after the losses' broadcast, where the other stages wait for it in the next
        step (``scripts/bench_overlap.py`` times how much later stage 0 leaves a round
        than stage 1, with and without this: ``docs/benchmarks-log.md``)."""
        self._finish()
        self._finished = True

    def flush(self) -> None:
        """Applies what is pending and computes what is queued (before the weights are
        read): the calls after it then score and learn as they would have."""
        self._apply_pending()
        rest = self._take(None)
        if rest is not None:
            self._learn(*rest)

    def sync(self) -> None:
        """The weights of replica 0 on every replica (the head starts the same everywhere)."""
        weights = self.group.bcast([w.numpy() for w in self.model.weights], HEAD_WEIGHTS)
        for var, value in zip(self.model.weights, weights, strict=True):
            var.assign(value)

    def state(self) -> dict[str, Any]:
        """Weights, optimizer variables and the gradients learnt so far (after ``flush``)."""
        self.flush()
        sums = [s.numpy() for s in self._sums] if self._learnt else None
        return {
            "head": [w.numpy() for w in self.model.weights],
            "optimizer": [v.numpy() for v in self.optimizer.variables],
            "sums": sums,
            "kept": self._kept,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores ``state()``; learning queued or pending here is dropped."""
        for var, value in zip(self.model.weights, state["head"], strict=True):
            var.assign(value)
        for var, value in zip(self.optimizer.variables, state["optimizer"], strict=True):
            var.assign(value)
        sums = state.get("sums")  # absent from states saved before the head learnt late
        zeros = [np.zeros(v.shape) for v in self._sums]
        for var, value in zip(self._sums, sums or zeros, strict=True):
            var.assign(tf.cast(value, var.dtype))
        self._learnt = 0 if sums is None else 1
        self._kept, self._queue, self._ready = int(state.get("kept", 0)), [], None
        self._finished = False  # a finish_early before the load finished what it replaced

    def _finish(self) -> None:
        """Round r-1's gradients complete (what no call took, now, or with ``learn_rest``
        False dropped), and their mean ready."""
        if self.learn_rest:
            self.flush()
        else:
            # what no call took is not learnt; a pending update no call applied (no call
            # ran, so none learnt either) stays pending for the next round's first call
            self._queue = []
        if self.group.replicas > 1:
            self._finish_replicas()
            return
        if not self._learnt:
            return
        # a copy, taken and the sums zeroed in one compiled call: round r's gradients are
        # summed into the same variables from now on. Copied to NumPy and back, one eager
        # op per variable and step, it was most of stage 0's round wherever the head
        # finished there (rounds that end partly scored, as with leftover="keep"); since,
        # rank 0's next() with the leftover kept takes plain training's (bench_overlap,
        # docs/benchmarks-log.md)
        ready, scale = list(self._take_sums()), 1.0 / max(self._kept, 1)
        self._learnt = 0
        self._ready = (ready, tf.constant(scale, ready[0].dtype))

    def _finish_replicas(self) -> None:
        """``_finish``'s mean, over the replicas whose calls learnt something this round.

        Every replica joins it every round, learnt or not, and leaves it with the last mean
        applied: with ``learn_rest=False`` one replica's waits may hold no call of a round
        while another's hold some, and a mean that only some replicas joined was matched
        with the next round's agreement on batch counts (an MPI truncation error; CI at
        705db39). A replica that learnt nothing adds zeros and is not counted, so the mean
        is the same as if it had not taken part; with ``learn_rest``, where every replica
        scored (and so learns) every round, it is the plain mean over them, as before.
        """
        learnt = self._learnt > 0
        if learnt:
            scale = 1.0 / max(self._kept, 1)
            mine = [s.numpy() * scale for s in self._take_sums()]
        else:
            mine = [np.zeros(s.shape, s.dtype.as_numpy_dtype) for s in self._sums]
        self._learnt = 0
        *means, share = self.group.mean([*mine, np.array([float(learnt)])])
        # No call of this replica ran to apply the last mean: apply it now, so that after
        # every round each replica has applied the same means in the same order. Also
        # when no replica learnt: another replica's call may have applied it (one that had
        # nothing to learn), and left pending here until a replica learnt again, it kept
        # the heads apart, at the end of a job for good (CI at ee43bc3; test_exit_head)
        self._apply_pending()
        if share[0] == 0:  # no replica learnt: nothing new to apply
            return
        # share = learners / replicas: the mean over the learners
        ready = [tf.constant((m / share[0]).astype(m.dtype)) for m in means]
        self._ready = (ready, tf.constant(1.0, ready[0].dtype))

    def _apply_pending(self) -> None:
        ready, self._ready = self._ready, None
        if ready is not None:
            self._apply(*ready)

    def _take(self, chunks: int | None) -> Chunk | None:
        """The next ``chunks`` queued source batches (all if None) as one chunk."""
        count = len(self._queue) if chunks is None else min(chunks, len(self._queue))
        if not count:
            return None
        taken, self._queue = self._queue[:count], self._queue[count:]
        self._learnt += 1
        self._kept += int(sum(mask[start:stop].sum() for _, _, mask, start, stop in taken))
        merged = _merged(taken)
        if len(merged) == 1:
            return _rows(*merged[0])
        # rows of several parts (a call learns more source batches than one part held):
        # joined here, sliced where a part is not taken whole, as one part
        features = tf.concat([_part(part, start, stop) for part, _, _, start, stop in merged], 0)
        labels = tf.concat([_part(y, start, stop) for _, y, _, start, stop in merged], 0)
        mask = np.concatenate([m[start:stop] for _, _, m, start, stop in merged])
        return _rows(features, labels, mask, 0, len(mask))

    def _scored(self, x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        features = self._features(x)
        predictions = self.model(features, training=False)
        return features, tf.reshape(self.loss(y, predictions), [-1]), predictions

    def _learnt_and_scored(
        self,
        x: tf.Tensor,
        y: tf.Tensor,
        features: tf.Tensor,
        labels: tf.Tensor,
        mask: tf.Tensor,
        bounds: tf.Tensor,
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        self._add_grads(features, labels, mask, bounds)
        return self._scored(x, y)

    def _applied_and_scored(
        self, x: tf.Tensor, y: tf.Tensor, sums: Grads, scale: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        # automatic control dependencies order the scoring's reads after the update
        self._apply_grads(sums, scale)
        return self._scored(x, y)

    def _all(
        self,
        x: tf.Tensor,
        y: tf.Tensor,
        sums: Grads,
        scale: tf.Tensor,
        features: tf.Tensor,
        labels: tf.Tensor,
        mask: tf.Tensor,
        bounds: tf.Tensor,
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        self._apply_grads(sums, scale)
        return self._learnt_and_scored(x, y, features, labels, mask, bounds)

    def _sums_taken(self) -> Grads:
        """The gradient sums, copied, and the sums zeroed (automatic control dependencies
        order each read before its variable's assignment)."""
        taken = [total + 0 for total in self._sums]  # a new buffer, not the variable's
        for total in self._sums:
            total.assign(tf.zeros_like(total))
        return taken

    def _apply_grads(self, sums: Grads, scale: tf.Tensor) -> tf.Tensor:
        self.optimizer.apply([g * scale for g in sums], self.model.trainable_variables)
        return tf.constant(0)

    def _add_grads(
        self, features: tf.Tensor, y: tf.Tensor, mask: tf.Tensor, bounds: tf.Tensor
    ) -> tf.Tensor:
        """Adds the gradients of the kept rows in ``[bounds[0], bounds[1])`` to the round's
        sums (``_kept_grads``): the rows outside the bounds are masked out, not sliced
        off, so the call takes the whole part and no copy of it."""
        rows = tf.range(tf.shape(mask)[0])
        inside = tf.logical_and(rows >= bounds[0], rows < bounds[1])
        mask = tf.where(inside, mask, tf.zeros_like(mask))
        for total, grad in zip(self._sums, self._kept_grads(features, y, mask), strict=True):
            total.assign_add(grad)
        return tf.constant(0)

    def _kept_grads(self, features: tf.Tensor, y: tf.Tensor, mask: tf.Tensor) -> Grads:
        """The gradients of the kept rows' summed loss (their mean is taken at the round,
        when the round's kept count is known). The kept rows only, through a boolean mask
        inside the compiled call: the input shapes stay fixed, so the varying number kept
        traces nothing, and the rows not kept cost no forward or backward."""
        keep = mask > 0
        features, y = tf.boolean_mask(features, keep), tf.boolean_mask(y, keep)
        with tf.GradientTape() as tape:
            losses = tf.reshape(self.loss(y, self.model(features, training=True)), [-1])
            loss = tf.reduce_sum(losses)
        return list(tape.gradient(loss, self.model.trainable_variables))


def _chunks(
    features: list[Any], labels: list[Any], mask: np.ndarray, batch: int | None
) -> list[Queued]:
    """The parts' rows in slices of ``batch`` (one slice per part if None), each with its
    part's mask; nothing is sliced: a call takes the whole part and the slice's bounds."""
    out, offset = [], 0
    for part, y in zip(features, labels, strict=True):
        rows = int(part.shape[0])
        step, part_mask = batch or rows, mask[offset : offset + rows]
        for start in range(0, rows, step):
            out.append((part, y, part_mask, start, min(start + step, rows)))
        offset += rows
    return out


def _merged(chunks: list[Queued]) -> list[Queued]:
    """Consecutive chunks of one part as one: taking a whole round scored in one call
    must not slice its features into source batches only to join them again."""
    out = chunks[:1]
    for part, y, mask, start, stop in chunks[1:]:
        last = out[-1]
        if last[0] is part and last[4] == start:
            out[-1] = (part, y, mask, last[3], stop)
        else:
            out.append((part, y, mask, start, stop))
    return out


def _part(part: Any, start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` of ``part``: the part itself if that is all of it."""
    return part if start == 0 and stop == int(part.shape[0]) else part[start:stop]


def _rows(part: Any, y: Any, mask: np.ndarray, start: int, stop: int) -> Chunk:
    """A part and its rows ``[start, stop)`` as a call's arguments. Sliced here, the
    features and labels cost two eager ops per call, each a dispatch and a copy (a unit
    through ``score`` against the bare call: docs/benchmarks-log.md, Early-exit scoring
    calls); inside the call the bounds cost a mask."""
    return part, y, tf.constant(mask), tf.constant([start, stop], tf.int32)


class _NoGroup:
    """``call_seconds``'s head has no replicas: it learns rows queued once and finishes
    nothing, so no collective may start (rank 0 times it alone, while the others wait).
    It is a group of one, as the head may ask, and raises on anything else."""

    replicas = 1

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"call_seconds must not use a replica group (it read {name!r})")


def call_seconds(
    y: Any, out_shape: tuple[int, ...], loss: Callable[..., Any], repeats: int = CALL_REPEATS
) -> float:
    """The fixed cost of an overlap unit's call, for the planner
    (``partitioner.experimental.scoring``): the median seconds of ``ExitHead.score``
    scoring one source batch (labels ``y``) and learning one, with the default head on a
    feature of width 1 and no layers before it, so that what it times is the call, the
    head and reading the losses, not a layer's forward (the profile has those).
    """
    n = int(np.asarray(y).shape[0])
    x, labels = tf.zeros((n, 1)), tf.convert_to_tensor(y)
    group: Any = _NoGroup()
    head = ExitHead(None, tf.TensorSpec((None, 1)), out_shape, loss, 1e-3, lambda t: t, group)
    features, _, _ = head.score(x, labels, None)  # traces the calls
    parts = repeats + 1
    head.learn([features] * parts, [labels] * parts, np.arange(0, n * parts, 2), None)
    head.score(x, labels, 1)[1].numpy()  # the first learning call: a lookup, not timed
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        head.score(x, labels, 1)[1].numpy()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def make_head(user: Any, feature_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> Any:
    """The user's head, or flatten + Dense to the output's size, built for the features."""
    head = user or keras.Sequential(
        [
            keras.layers.Flatten(),
            keras.layers.Dense(math.prod(out_shape)),
            keras.layers.Reshape(out_shape),
        ]
    )
    head.build((None, *feature_shape))
    return head
