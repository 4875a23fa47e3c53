"""Early-exit scoring (SIFT, Das et al., ICML 2024): losses from a small head on stage 0.

Scoring with the full model costs a forward through every stage for each candidate,
which can cost more than the backward passes sifting saves. The early-exit scorer
runs only stage 0's layers up to ``exit_after`` and a small head (flatten + Dense to
the model's output shape, or ``SiftConfig.exit_head``) on that layer's output, on
stage 0 alone: the scored batch never traverses the pipeline. Stage 0 broadcasts the
losses to the other stages of its pipeline (a duplicate of the pipeline communicator),
so every rank keeps the same samples.

The head learns online from the features the scoring pass already computed: after
each selection one gradient step on the kept samples (during the delay, on all), with
the user's loss and its own Adam optimizer (``exit_lr``); no gradient reaches the
trunk. Its gradients are averaged over the replicas and its initial weights are
broadcast from replica 0, so the head is the same on every replica. Every
``VALIDATE_EVERY`` rounds the full pipelined loss is computed on the round's first source
batch and the Spearman rank correlation between the two is reported as ``exit_spearman``.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfsift.parallel import runtime
from tfsift.parallel.comm import bcast_from_stage
from tfsift.pipeline.compiled import Compiled
from tfsift.planning.graph import StageGraph
from tfsift.planning.profiler import profile
from tfsift.sift.config import SiftConfig
from tfsift.sift.overlap import BATCH, UPDATE, WaitModel
from tfsift.sift.replicas import ReplicaGroup
from tfsift.sift.scorer import (
    FullScorer,
    Scorer,
    Scores,
    describe,
    partition_for_training,
    training_microbatch,
)
from tfsift.state import STATE

log = logging.getLogger("tfsift")
VALIDATE_EVERY = 20  # rounds between two Spearman checks against the full loss
# Overlap that found room for less than LOW_OVERLAP of the batches of its first
# ADVICE_AFTER rounds says so, once: on a cut whose stage 0 is the slowest stage it
# cannot pay (scripts/bench_overlap.py), and the user can move the cut or the exit.
ADVICE_AFTER = 50
LOW_OVERLAP = 0.25
# With one stage, the default exit ends where at most this share of the model's forward
# time has been spent: an exit in the middle of a CNN took its costliest convolution and
# scored at the cost of the whole model (scripts/bench_sifting.py, docs/benchmarks.md).
EXIT_SHARE = 1 / 3


class EarlyExitScorer(Scorer):
    """Scores ``(x, y)`` elements with stage 0's layers up to the exit and a trained head."""

    def __init__(
        self, model: Any, per_sample_loss: Callable[..., Any], config: SiftConfig, logits: bool
    ) -> None:
        self.model, self.loss, self.config = model, per_sample_loss, config
        self.needs_logits = logits
        self.full = FullScorer(model, per_sample_loss, logits)
        self.metrics: dict[str, float] = {}
        self._built = False
        self._rounds = 0
        # features and labels of the last scoring, in parts (a round scored in several
        # calls), joined only where the head's update needs them
        self._last: tuple[list[Any], list[Any]] | None = None
        self._pending: dict[str, Any] | None = None  # a loaded state, applied once built
        self._prepared: _Prepared | None = None  # overlap: the round scored during steps
        # The head's update from the last selection, applied by the next scoring call
        # (one compiled call instead of two: ("step", feature parts, label parts, mask)
        # with one replica, ("apply", grads) with the gradients averaged over replicas).
        self._update: tuple[Any, ...] | None = None
        self._idle = _IdleScoring(self)
        self.overlapped = 0  # rounds scored entirely during training steps
        self.scored_while_waiting = 0  # their source batches scored during training steps
        self.scored_chunks = 0  # of so many prepared source batches
        self.prepared_rounds = 0  # rounds prepared and sifted (advice after ADVICE_AFTER)

    def bind(self, group: ReplicaGroup) -> None:
        """The replicas the head's gradients are averaged over (set by the sifter)."""
        self._group = group

    def __call__(self, element: Any) -> Scores:
        x, y = _pair(element)
        self._build(x)
        losses, logits = (None, None)
        if self._stage == 0:
            prepared = self._take_prepared(x)
            if prepared is None:
                features, labels, out_losses, out_logits = self._compute(x, y)
                self._last = ([features], [labels])
                losses, logits = out_losses.numpy(), out_logits.numpy()
            else:
                self._last, losses, logits = prepared
        n = int(np.asarray(x).shape[0])
        losses, logits, overlapped = self._share(n, losses, logits)
        if self.config.overlap:
            self.metrics["overlapped_rounds"] = float(overlapped[0])
            self.metrics["overlapped_fraction"] = float(overlapped[1])
        self._rounds += 1
        if self._rounds % VALIDATE_EVERY == 1:
            self._validate(element, losses)
        labels = np.asarray(y) if self.needs_logits else None
        return Scores(np.asarray(losses), logits, labels)

    def _share(self, n: int, losses: Any, logits: Any) -> tuple[np.ndarray, Any, np.ndarray]:
        """Stage 0's losses (logits, overlap counts) on every stage of the pipeline,
        broadcast without blocking: a stalled stage 0 ends the job after ``timeout``."""
        overlapped = np.array(
            [self.overlapped, self.scored_while_waiting / max(self.scored_chunks, 1)]
        )
        if self._pipe.Get_size() == 1:
            return losses, logits if self.needs_logits else None, overlapped
        buffer = np.empty(n + 2, np.float64)
        values = np.empty((n, *self._out_shape) if self.needs_logits else 0, np.float64)
        if self._stage == 0:
            buffer[:n], buffer[n:] = losses, overlapped
            if self.needs_logits:
                values[...] = logits
        timeout = runtime.get().config.timeout
        bcast_from_stage(self._pipe, [buffer, values], 0, timeout, "early-exit losses")
        shared_logits = values.astype(np.float32) if self.needs_logits else None
        return buffer[:n], shared_logits, buffer[n:]

    def prepare(self, element: Any) -> None:
        """With ``overlap``: stage 0 scores ``element`` one source batch at a time while
        the next training steps wait for gradients, where a batch is expected to fit in
        the wait (``tfsift.sift.overlap``); the round that follows scores the rest."""
        if not self.config.overlap:
            return
        x, y = _pair(element)
        self._build(x)
        n, B = int(np.asarray(x).shape[0]), self.batch_size
        if self._stage != 0 or not B or n % B:
            return  # a round of a partial batch is scored whole, when it is sifted
        self._prepared = _Prepared(x, y, B)
        STATE.idle_task = self._idle

    def _take_prepared(
        self, x: Any
    ) -> tuple[tuple[list[Any], list[Any]], np.ndarray, np.ndarray] | None:
        prepared, self._prepared = self._prepared, None
        if prepared is None or prepared.x is not x:
            return None
        self.scored_while_waiting += prepared.scored // prepared.rows
        self.scored_chunks += prepared.chunks
        self.prepared_rounds += 1
        if self.prepared_rounds == ADVICE_AFTER and self._group.replica == 0:
            _advise(self.scored_while_waiting / self.scored_chunks, self._pipe.Get_size())
        if prepared.done():
            self.overlapped += 1
        else:
            # What no wait had room for, in one call. Its size varies, but tf.function
            # (reduce_retracing) traces one function of any batch size at the second
            # size it meets: a new size costs a lookup (about 0.9 ms once,
            # scripts/bench_exit_calls.py), not a trace. Timed too, so
            # that a batch's cost once overestimated (that trace) can come down.
            self._idle.score(prepared, prepared.rest())
        return prepared.joined()

    def _compute(self, x: Any, y: Any) -> tuple[Any, Any, Any, Any]:
        labels = tf.convert_to_tensor(y)
        x = tf.convert_to_tensor(x)
        update, self._update = self._update, None
        if update is None:
            features, losses, logits = self._score(x, labels)
        elif update[0] == "step":
            features, losses, logits = self._step_and_score(
                x, labels, *_joined(update[1:3]), update[3]
            )
        else:
            features, losses, logits = self._apply_and_score(x, labels, update[1])
        return features, labels, losses, logits

    def learn(self, kept: np.ndarray) -> None:
        """One gradient step of the head on the kept samples of the last scoring,
        applied at the start of the next scoring call (or by ``state()``)."""
        if self._stage != 0 or self._last is None:
            return
        features, y = self._last
        mask = np.zeros(sum(int(part.shape[0]) for part in features), np.float32)
        mask[kept] = 1.0
        if self._group.replicas == 1:  # nothing to average: the whole step is deferred
            self._update = ("step", features, y, tf.constant(mask))
        else:
            grads = self._head_grads(*_joined([features, y]), tf.constant(mask))
            grads = [g.numpy() for g in grads]
            grads = self._group.mean(grads)
            self._update = ("apply", [tf.constant(g) for g in grads])
        self._last = None

    def _flush(self) -> None:
        """Applies a deferred head update now (before the head's weights are read)."""
        update, self._update = self._update, None
        if update is not None and update[0] == "step":
            self._head_step(*_joined(update[1:3]), update[3])
        elif update is not None:
            self._apply(update[1])

    def warm(self, element: Any) -> None:
        """During the delay: no selection, but the head learns from every sample."""
        self(element)
        n = int(np.asarray(_pair(element)[0]).shape[0])
        self.learn(np.arange(n))

    def state(self) -> dict[str, Any]:
        """The head's weights and its optimizer's variables (stage 0), and the round count."""
        if not self._built or self._stage != 0:
            return {"rounds": self._rounds}
        self._flush()
        return {
            "rounds": self._rounds,
            "head": [w.numpy() for w in self._head.weights],
            "optimizer": [v.numpy() for v in self._optimizer.variables],
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores ``state()``; the head is built at the next scoring and loaded then."""
        self._rounds = int(state["rounds"])
        self._pending = state if "head" in state else None
        self._update = None

    def _restore(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        for var, value in zip(self._head.weights, pending["head"], strict=True):
            var.assign(value)
        for var, value in zip(self._optimizer.variables, pending["optimizer"], strict=True):
            var.assign(value)

    def _build(self, x: Any) -> None:
        if self._built:
            return
        rt = runtime.get()
        batch = self.batch_size or int(np.asarray(x).shape[0])
        # no step has run yet: partition now (a collective, like a step)
        partition_for_training(self.model, x, batch)
        part = self.model.partitioned
        self._stage = part.stage.index
        self._pipe = rt.pipe_comm.Dup()
        self._out_shape = tuple(part.graph.tensors[part.graph.outputs[0]].shape[1:])
        if self._stage == 0:
            exit_after = _node_name(self.model, part.graph, self.config.exit_after)
            default = None
            if exit_after is None and len(part.bounds) == 2:  # one stage: the cheap prefix
                default = self._group.bcast(
                    self._cheapest_exit(part.graph, x, batch) if self._group.replica == 0 else None
                )
            exit_graph = _exit_graph(part.graph, part.bounds, exit_after, default)
            self._exit_graph = exit_graph
            feature_shape = tuple(part.graph.tensors[exit_graph.outputs[0]].shape[1:])
            self._head = _make_head(self.config.exit_head, feature_shape, self._out_shape)
            self._optimizer = keras.optimizers.Adam(self.config.exit_lr)
            self._optimizer.build(self._head.trainable_variables)
            self._score = Compiled(self._exit_losses, "early-exit scoring")
            self._step_and_score = Compiled(self._train_and_score, "exit head step and scoring")
            self._apply_and_score = Compiled(self._update_and_score, "exit head update and scoring")
            self._head_grads = Compiled(self._masked_grads, "exit head gradients")
            self._head_step = Compiled(self._train_head, "exit head step")
            self._apply = Compiled(self._apply_grads, "exit head update")
            self._sync_initial_weights()
            self._restore()
        self._built = True

    def _cheapest_exit(self, graph: Any, x: Any, batch: int) -> int:
        """The default exit with one stage, from each node's measured forward time on a
        training microbatch (replica 0 measures; the replicas must build the same head)."""
        costs = profile(graph, training_microbatch(x, batch), 3)
        return cheap_exit([layer.forward_time for layer in costs.layers])

    def _exit_losses(self, x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Features at the exit, per-sample losses and predictions: one compiled call."""
        features = self._exit_graph.run([x], False)[0]
        predictions = self._head(features, training=False)
        return features, tf.reshape(self.loss(y, predictions), [-1]), predictions

    def _train_and_score(
        self, x: tf.Tensor, y: tf.Tensor, features: tf.Tensor, labels: tf.Tensor, mask: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        # automatic control dependencies order the scoring's reads after the update
        self._apply_grads(self._masked_grads(features, labels, mask))
        return self._exit_losses(x, y)

    def _update_and_score(
        self, x: tf.Tensor, y: tf.Tensor, grads: list[Any]
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        self._apply_grads(grads)
        return self._exit_losses(x, y)

    def _train_head(self, features: tf.Tensor, y: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        grads = self._masked_grads(features, y, mask)
        self._apply_grads(grads)
        return tf.constant(0)

    def _apply_grads(self, grads: list[Any]) -> tf.Tensor:
        self._optimizer.apply(grads, self._head.trainable_variables)
        return tf.constant(0)

    def _masked_grads(self, features: tf.Tensor, y: tf.Tensor, mask: tf.Tensor) -> list[Any]:
        # The kept rows only: the head's forward and backward on every scored row, the
        # others weighted 0, was wasted work in the call that carries the update (the
        # round's first unit, which must fit in a wait); a boolean mask inside the
        # compiled call keeps its input shapes fixed, so the varying number kept traces
        # nothing.
        keep = mask > 0
        features, y = tf.boolean_mask(features, keep), tf.boolean_mask(y, keep)
        with tf.GradientTape() as tape:
            losses = tf.reshape(self.loss(y, self._head(features, training=True)), [-1])
            count = tf.cast(tf.shape(losses)[0], losses.dtype)
            loss = tf.reduce_sum(losses) / tf.maximum(count, 1.0)
        return list(tape.gradient(loss, self._head.trainable_variables))

    def _sync_initial_weights(self) -> None:
        weights = self._group.bcast([w.numpy() for w in self._head.weights])
        for var, value in zip(self._head.weights, weights, strict=True):
            var.assign(value)

    def _validate(self, element: Any, early: np.ndarray) -> None:
        """Spearman correlation of early-exit and full losses on the round's first source
        batch: the full loss runs through every stage, and on the whole round (g=8 batches)
        it took 12.5 ms against 2.0 ms on bench_overlap's 4-convolution model
        (``scripts/bench_exit_calls.py``), every 20 rounds, for a metric."""
        x, y = _pair(element)
        rows = min(self.batch_size or len(early), len(early))
        full = self.full((x[:rows], y[:rows])).losses
        early = early[:rows]
        finite = np.isfinite(early) & np.isfinite(full)
        if finite.sum() > 2:
            self.metrics["exit_spearman"] = spearman(early[finite], full[finite])


class _Prepared:
    """A round being scored: one source batch per compiled call during training steps,
    what no wait had room for in one call at the round."""

    def __init__(self, x: Any, y: Any, rows: int) -> None:
        self.x, self.y, self.rows = x, y, rows
        self.chunks = int(np.asarray(x).shape[0]) // rows
        self.results: list[tuple[Any, Any, Any, Any]] = []
        self.scored = 0  # rows scored so far

    def done(self) -> bool:
        return self.scored == self.rows * self.chunks

    def next_rows(self) -> tuple[Any, Any]:
        rows = slice(self.scored, self.scored + self.rows)
        return self.x[rows], self.y[rows]

    def rest(self) -> tuple[Any, Any]:
        return self.x[self.scored :], self.y[self.scored :]

    def add(self, result: tuple[Any, Any, Any, Any]) -> None:
        self.results.append(result)
        self.scored += int(result[2].shape[0])

    def joined(self) -> tuple[tuple[list[Any], list[Any]], np.ndarray, np.ndarray]:
        """((feature parts, label parts), losses, logits) of the whole round. The parts
        stay apart: joining 8 source batches' features at the round (tf.concat) took
        0.8 ms (``scripts/bench_exit_calls.py``), while the later stages waited for the
        losses; the head's update joins them, inside a wait where one has room."""
        features, labels, losses, logits = (
            list(parts) for parts in zip(*self.results, strict=True)
        )
        joined = [np.concatenate([part.numpy() for part in parts]) for parts in (losses, logits)]
        return (features, labels), joined[0], joined[1]


class _IdleScoring:
    """The prepared round's scoring as ``tfsift.parallel.comm.IdleWork``: one source
    batch per unit, started only where the ``WaitModel`` expects it to fit."""

    def __init__(self, scorer: EarlyExitScorer) -> None:
        self.scorer = scorer
        self.waits = WaitModel()

    def run(self, microbatch: int, waited: float) -> bool:
        prepared = self.scorer._prepared
        if prepared is None or prepared.done():
            return False
        if not self.waits.allows(microbatch, waited, self._kind()):
            return False
        self.score(prepared, prepared.next_rows())
        return True

    def score(self, prepared: _Prepared, rows: tuple[Any, Any]) -> None:
        """Scores ``rows`` of ``prepared`` and tells the ``WaitModel`` what it took."""
        kind, batches = self._kind(), int(np.asarray(rows[1]).shape[0]) / prepared.rows
        start = time.perf_counter()
        prepared.add(self.scorer._compute(*rows))
        self.waits.unit(time.perf_counter() - start, kind, batches)

    def _kind(self) -> str:
        """The next call's kind: it applies the head's pending update first, if any."""
        return BATCH if self.scorer._update is None else UPDATE

    def arrived(self, microbatch: int, waited: float, exact: bool) -> None:
        self.waits.arrived(microbatch, waited, exact)


def _joined(parts: Any) -> list[Any]:
    """Each list of tensors in ``parts`` as one tensor (rows in order)."""
    return [tensors[0] if len(tensors) == 1 else tf.concat(tensors, 0) for tensors in parts]


def _advise(fraction: float, stages: int) -> None:
    """Warns when overlap scored less than ``LOW_OVERLAP`` of its batches in waits."""
    if fraction >= LOW_OVERLAP:
        return
    where = (
        "with one stage nothing waits for gradients"
        if stages == 1
        else "stage 0's waits on this cut are short (it is the slowest stage, or a source "
        "batch takes longer than they last)"
    )
    log.warning(
        "tfsift.sift: overlap scored %.0f%% of the source batches of its first %d rounds "
        "while stage 0 waited for gradients; the rest was scored between steps, where every "
        "stage waits for it. Overlap pays only where stage 0 waits, and %s: put fewer "
        "layers on stage 0 (tfsift.partition with auto_partition=False) or exit earlier "
        "(exit_after). sift_metrics()['overlapped_fraction'] tracks it.",
        100 * fraction,
        ADVICE_AFTER,
        where,
    )


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (ties broken by position)."""
    ra = np.argsort(np.argsort(a, kind="stable"), kind="stable").astype(np.float64)
    rb = np.argsort(np.argsort(b, kind="stable"), kind="stable").astype(np.float64)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def _pair(element: Any) -> tuple[Any, Any]:
    if not (isinstance(element, tuple) and len(element) == 2):
        raise ValueError(
            "early-exit scoring needs dataset elements that are (x, y) pairs. Received: "
            f"{describe(element)}"
        )
    return element[0], element[1]


def _node_name(model: Any, graph: Any, exit_after: str | None) -> str | None:
    """``exit_after`` as a node name: a layer's name, or the model attribute holding it."""
    names = [gn.name for gn in graph.nodes]
    if exit_after is None or exit_after in names:
        return exit_after
    layer = getattr(model, exit_after, None)
    for gn in graph.nodes:
        if layer is not None and gn.operation is layer:
            return str(gn.name)
    return exit_after


def cheap_exit(forward: Sequence[float], share: float = EXIT_SHARE) -> int:
    """The default exit of a one-stage model: the last node before the output whose
    forward prefix (it and the nodes before it) takes at most ``share`` of the model's
    forward time; the first node if none does, the middle if nothing was measurable.

    Example:
        >>> cheap_exit([0.0, 0.1, 1.2, 0.0, 0.8, 0.1])  # reshape, conv, conv, ..., dense
        1
    """
    total = sum(forward)
    if total <= 0:
        return max(len(forward) // 2 - 1, 0)
    prefix = itertools.accumulate(forward[:-1])
    cheap = [i for i, spent in enumerate(prefix) if spent <= share * total]
    return cheap[-1] if cheap else 0


def _exit_graph(
    graph: Any, bounds: tuple[int, ...], exit_after: str | None, default: int | None
) -> StageGraph:
    """Stage 0's nodes up to and including the exit layer, ending at its output.

    ``default``: the exit node's index when ``exit_after`` is None and there is one stage.
    """
    names = [gn.name for gn in graph.nodes]
    first_stage = names[bounds[0] : bounds[1]]
    if exit_after is None:
        # the last layer of stage 0; with one stage that is the model's output, so the
        # cheap prefix instead (``cheap_exit``; scoring with the whole model is
        # scorer="full")
        if len(bounds) > 2:
            index = bounds[1] - 1
        else:
            assert default is not None, "one stage: _build passes cheap_exit's index"
            index = default
    elif exit_after not in first_stage:
        where = "is not a layer of the model" if exit_after not in names else "is not on stage 0"
        raise ValueError(
            "exit_after must name a layer of stage 0 (by layer name or model attribute: "
            f"{', '.join(first_stage)}); "
            f"{exit_after!r} {where}. Received: exit_after={exit_after!r}"
        )
    else:
        index = names.index(exit_after)
    node = graph.nodes[index]
    return StageGraph(tuple(graph.nodes[: index + 1]), graph.live(0), tuple(node.outputs[:1]))


def _make_head(user: Any, feature_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> Any:
    head = user or keras.Sequential(
        [
            keras.layers.Flatten(),
            keras.layers.Dense(math.prod(out_shape)),
            keras.layers.Reshape(out_shape),
        ]
    )
    head.build((None, *feature_shape))
    return head
