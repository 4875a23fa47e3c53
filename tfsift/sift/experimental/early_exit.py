"""Early-exit scoring (SIFT, Das et al., ICML 2024): losses from a small head on stage 0.

Scoring with the full model costs a forward through every stage for each candidate,
which can cost more than the backward passes sifting saves. The early-exit scorer
runs only stage 0's layers up to ``exit_after`` and a small head (flatten + Dense to
the model's output shape, or ``SiftConfig.exit_head``) on that layer's output, on
stage 0 alone: the scored batch never traverses the pipeline. Stage 0 broadcasts the
losses to the other stages of its pipeline (a duplicate of the pipeline communicator),
so every rank keeps the same samples.

The head learns online from the features the scoring pass already computed: one
gradient step per round on the kept samples (during the delay, on all), with the
user's loss and its own Adam optimizer (``exit_lr``), computed by the calls that score
the next round and applied by the first call of the round after (``exit_head``); no
gradient reaches the trunk. Its gradients are averaged over the replicas and its
initial weights are broadcast from replica 0, so the head is the same on every
replica. Every ``VALIDATE_EVERY`` rounds the full pipelined loss is computed on the
round's first source batch and the Spearman rank correlation between the two is
reported as ``exit_spearman``.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from partitioner.experimental.scoring import sifted_step_time
from tfsift import hooks
from tfsift.parallel import runtime
from tfsift.parallel.comm import StageBroadcast
from tfsift.planning.graph import StageGraph
from tfsift.planning.profiler import profile
from tfsift.sift.config import SiftConfig
from tfsift.sift.experimental.collectives import HeadGroup
from tfsift.sift.experimental.exit_head import ExitHead, call_seconds
from tfsift.sift.experimental.overlap import BATCH, FINISH, UPDATE, WaitModel
from tfsift.sift.replicas import DEFAULT_EXIT, ReplicaGroup
from tfsift.sift.scorer import (
    FullScorer,
    Scorer,
    Scores,
    describe,
    partition_for_training,
    training_microbatch,
)

log = logging.getLogger("tfsift")
# Rounds between two Spearman checks against the full loss. A check runs the full model
# on a source batch through every stage (1.9 ms alone, docs/benchmarks-log.md, Early-exit
# scoring calls; on a pipeline more, as every stage must meet for it), at a round, where
# every stage waits for it; for a metric, every 100 rounds costs a fifth of what every 20 did.
VALIDATE_EVERY = 100
# Overlap that found room for less than LOW_OVERLAP of the batches of its first
# ADVICE_AFTER rounds says so, once: on a cut whose stage 0 is the slowest stage it
# cannot pay (scripts/bench_overlap.py), and the user can move the cut or the exit.
ADVICE_AFTER = 50
LOW_OVERLAP = 0.25
# With one stage, the default exit ends where at most this share of the model's forward
# time has been spent: an exit in the middle of a CNN took its costliest convolution and
# scored at the cost of the whole model (the retired scripts/bench_sifting.py,
# docs/benchmarks-log.md).
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
        # calls): the next round's calls learn as many source batches as they score
        # (``exit_head``)
        self._last: tuple[list[Any], list[Any]] | None = None
        self._pending: dict[str, Any] | None = None  # a loaded state, applied once built
        self._prepared: _Prepared | None = None  # overlap: the round scored during steps
        self._idle = _IdleScoring(self)
        self.overlapped = 0  # rounds scored entirely during training steps
        self.scored_while_waiting = 0  # their source batches scored during training steps
        self.scored_chunks = 0  # of so many prepared source batches
        self.prepared_rounds = 0  # rounds prepared and sifted (advice after ADVICE_AFTER)
        self._reservation: hooks.Reservation | None = None
        if config.overlap and config.exit_after is None and model.partitioned is None:
            # The default exit ends stage 0, so scoring costs stage 0 a forward of its own
            # layers per source batch, 1 / kept of them per step: the planner (at the first
            # step) then leaves it room in its waits by giving it fewer layers.
            self._reservation = hooks.Reservation(1 / config.expected_kept(), sifted_step_time)
            hooks.reserve_stage0(model, self._reservation)

    def bind(self, group: ReplicaGroup) -> None:
        """The replicas the head's gradients are averaged over (set by the sifter)."""
        self._group = HeadGroup(group)

    def __call__(self, element: Any) -> Scores:
        x, y = _pair(element)
        self._build(x)
        n = int(np.asarray(x).shape[0])
        losses, logits, scored = (None, None, n)
        if self._stage == 0:
            prepared = self._take_prepared(x)
            if prepared is None:
                features, labels, out_losses, out_logits = self._compute(x, y, None)
                self._last = ([features], [labels])
                losses = out_losses.numpy()
                logits = out_logits.numpy() if self.needs_logits else None
            else:
                self._last, losses, logits, scored = prepared
        losses, logits, overlapped = self._share(n, losses, logits, scored)
        scored = int(overlapped[5])
        if self.config.overlap:
            self.metrics["overlapped_rounds"] = float(overlapped[0])
            self.metrics["overlapped_fraction"] = float(overlapped[1])
            self.metrics["overlap_wait_ms"] = float(overlapped[2])
            self.metrics["overlap_unit_ms"] = float(overlapped[3])
            self.metrics["overlap_late_fraction"] = float(overlapped[4])
        self._rounds += 1
        if self._rounds % VALIDATE_EVERY == 1:
            self._validate(element, losses)
        labels = np.asarray(y) if self.needs_logits else None
        return Scores(np.asarray(losses), logits, labels, None if scored == n else scored)

    def _share(
        self, n: int, losses: Any, logits: Any, scored: int
    ) -> tuple[np.ndarray, Any, np.ndarray]:
        """Stage 0's losses (logits, overlap counts and estimates, and how many of the
        first samples were scored) on every stage of the pipeline,
        broadcast without blocking: a stalled stage 0 ends the job after ``timeout``.
        Stage 0 goes on without waiting for the others to receive them (``StageBroadcast``):
        it finishes its update before the last stage does, and waiting here made it lose
        that head start on the next step at every round."""
        waits = self._idle.waits
        overlapped = np.array(
            [
                self.overlapped,
                self.scored_while_waiting / max(self.scored_chunks, 1),
                1e3 * waits.room(),
                1e3 * waits.unit_cost(),
                self._idle.late / max(self._idle.receives, 1),
                scored,
            ]
        )
        if self._pipe.Get_size() == 1:
            return losses, logits if self.needs_logits else None, overlapped
        buffer = np.empty(n + len(overlapped), np.float64)
        values = np.empty((n, *self._out_shape) if self.needs_logits else 0, np.float64)
        if self._stage == 0:
            buffer[:n], buffer[n:] = losses, overlapped
            if self.needs_logits:
                values[...] = logits
        self._losses_bcast([buffer, values])
        shared_logits = values.astype(np.float32) if self.needs_logits else None
        return buffer[:n], shared_logits, buffer[n:]

    def prepare(self, element: Any) -> None:
        """With ``overlap``: stage 0 scores ``element`` while the next training steps
        wait for gradients, in units of as many source batches as are expected to fit in
        the wait (``tfsift.sift.experimental.overlap``); the round that follows scores the rest."""
        if not self.config.overlap:
            return
        x, y = _pair(element)
        self._build(x)
        n, B = int(np.asarray(x).shape[0]), self.batch_size
        if self._stage != 0 or not B or n % B:
            return  # a round of a partial batch is scored whole, when it is sifted
        self._prepared = _Prepared(x, y, B)
        hooks.offer_stage0_wait(self._idle)

    def _take_prepared(
        self, x: Any
    ) -> tuple[tuple[list[Any], list[Any]], np.ndarray, np.ndarray | None, int] | None:
        prepared, self._prepared = self._prepared, None
        if prepared is None or prepared.x is not x:
            return None
        self.scored_while_waiting += prepared.scored // prepared.rows
        self.scored_chunks += prepared.chunks
        self.prepared_rounds += 1
        if self.prepared_rounds == ADVICE_AFTER and self._group.replica == 0:
            fraction = self.scored_while_waiting / self.scored_chunks
            _advise(fraction, self._pipe.Get_size(), self._idle.waits)
        if prepared.done():
            self.overlapped += 1
        elif self.config.leftover == "keep":
            pass  # the sifter keeps what no wait scored, unscored: nothing costs the step
        else:
            # What no wait had room for, in one call. Its size varies, but the scoring
            # calls were traced for any batch size (ExitHead._trace): a new size costs
            # a lookup (about 0.7 ms once, docs/benchmarks-log.md, Early-exit scoring
            # calls), not a trace.
            self._idle.score(prepared, prepared.rest(), None)
        return prepared.joined(self.needs_logits, self._out_shape)

    def _compute(self, x: Any, y: Any, chunks: int | None) -> tuple[Any, Any, Any, Any]:
        """One scoring call, which also learns ``chunks`` source batches of the last
        round (``ExitHead.score``)."""
        labels = tf.convert_to_tensor(y)
        features, losses, logits = self._head.score(tf.convert_to_tensor(x), labels, chunks)
        return features, labels, losses, logits

    def learn(self, kept: np.ndarray) -> None:
        """The head learns the kept samples of the last scoring, during the next round's
        scoring calls (``tfsift.sift.experimental.exit_head``)."""
        if self._stage != 0:
            return
        if self._last is None:
            # nothing scored this round (stale: every loss fresh). With replicas the head's
            # round still ends: its mean is a collective of the replicas, and another may
            # have scored (its samples were not fresh): 2x2 mpirun with stale, test_sift_mpi
            if self._built and self._group.replicas > 1:
                self._head.learn([], [], np.array([], np.int64), self.batch_size)
            return
        features, y = self._last
        self._head.learn(features, y, kept, self.batch_size)
        self._last = None

    def warm(self, element: Any) -> None:
        """During the delay: no selection, but the head learns from every sample."""
        self(element)
        n = int(np.asarray(_pair(element)[0]).shape[0])
        self.learn(np.arange(n))

    def state(self) -> dict[str, Any]:
        """The round count, and on stage 0 the head's weights, its optimizer's variables
        and the gradients it has learnt so far (``ExitHead.state``)."""
        if not self._built or self._stage != 0:
            return {"rounds": self._rounds}
        return {"rounds": self._rounds, **self._head.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores ``state()``: at once if the head is built, else when it is built."""
        self._rounds = int(state["rounds"])
        self._pending = state if "head" in state else None
        if self._built and self._stage == 0:
            self._restore()

    def _restore(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._head.load_state(pending)

    def expect(self, element_spec: Any) -> None:
        """With room to plan for (overlap at stage 0's end, no step yet): how the planner,
        on rank 0, times a scoring call's fixed cost (``exit_head.call_seconds``) on
        labels shaped as the dataset's, whether the first step comes before the first
        round or after it."""
        if self._reservation is None or self.model.partitioned is not None:
            return
        labels = _pair(element_spec)[1]

        def measure(graph: Any, rows: int) -> float:
            y = np.zeros((rows, *labels.shape[1:]), labels.dtype.as_numpy_dtype)
            return float(call_seconds(y, _out_shape(graph), self.loss))

        self._reservation = dataclasses.replace(self._reservation, call_seconds=measure)
        hooks.reserve_stage0(self.model, self._reservation)

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
        self._losses_bcast = StageBroadcast(self._pipe, 0, rt.config.timeout, "early-exit losses")
        self._out_shape = _out_shape(part.graph)
        if self._stage == 0:
            exit_after = _node_name(self.model, part.graph, self.config.exit_after)
            default = None
            if exit_after is None and len(part.bounds) == 2:  # one stage: the cheap prefix
                default = self._group.bcast(
                    self._cheapest_exit(part.graph, x, batch) if self._group.replica == 0 else None,
                    DEFAULT_EXIT,
                )
            exit_graph = _exit_graph(part.graph, part.bounds, exit_after, default)
            self._exit_graph = exit_graph
            exit_tensor = part.graph.tensors[exit_graph.outputs[0]]
            self._head = ExitHead(
                self.config.exit_head,
                tf.TensorSpec((None, *exit_tensor.shape[1:]), exit_tensor.dtype),
                self._out_shape,
                self.loss,
                self.config.exit_lr,
                lambda x: exit_graph.run([x], False)[0],
                self._group,
                learn_rest=self.config.leftover == "score",
            )
            self._head.sync()
            self._restore()
        self._built = True

    def _cheapest_exit(self, graph: Any, x: Any, batch: int) -> int:
        """The default exit with one stage, from each node's measured forward time on a
        training microbatch (replica 0 measures; the replicas must build the same head)."""
        costs = profile(graph, training_microbatch(x, batch), 3)
        return cheap_exit([layer.forward_time for layer in costs.layers])

    def _validate(self, element: Any, early: np.ndarray) -> None:
        """Spearman correlation of early-exit and full losses on the round's first source
        batch: the full loss runs through every stage, and on the whole round (g=8 batches)
        it took 12.1 ms against 2.0 ms on bench_overlap's 4-convolution model
        (docs/benchmarks-log.md, Early-exit scoring calls), every ``VALIDATE_EVERY`` rounds,
        for a metric."""
        x, y = _pair(element)
        rows = min(self.batch_size or len(early), len(early))
        full = self.full((x[:rows], y[:rows])).losses
        early = early[:rows]
        finite = np.isfinite(early) & np.isfinite(full)
        if finite.sum() > 2:
            self.metrics["exit_spearman"] = spearman(early[finite], full[finite])


class _Prepared:
    """A round being scored: in units of whole source batches during training steps,
    what no wait had room for in one call at the round."""

    def __init__(self, x: Any, y: Any, rows: int) -> None:
        self.x, self.y, self.rows = x, y, rows
        self.chunks = int(np.asarray(x).shape[0]) // rows
        self.results: list[tuple[Any, Any, Any, Any]] = []
        self.scored = 0  # rows scored so far

    def done(self) -> bool:
        return self.scored == self.rows * self.chunks

    def left(self) -> int:
        """Source batches not scored yet."""
        return self.chunks - self.scored // self.rows

    def next_rows(self, batches: int) -> tuple[Any, Any]:
        rows = slice(self.scored, self.scored + batches * self.rows)
        return self.x[rows], self.y[rows]

    def rest(self) -> tuple[Any, Any]:
        return self.x[self.scored :], self.y[self.scored :]

    def add(self, result: tuple[Any, Any, Any, Any]) -> None:
        self.results.append(result)
        self.scored += int(result[2].shape[0])

    def joined(
        self, needs_logits: bool, out_shape: tuple[int, ...]
    ) -> tuple[tuple[list[Any], list[Any]], np.ndarray, np.ndarray | None, int]:
        """((feature parts, label parts), losses, logits if ``needs_logits``, rows
        scored) of the round; the losses and logits of rows not scored (``leftover=
        "keep"``) are NaN. The parts stay apart: joining 8 source batches' features at
        the round (tf.concat) took 0.3 to 0.8 ms (docs/benchmarks-log.md, Early-exit
        scoring calls, two runs), while the later stages waited for the losses; the next
        round's calls learn them as they score (``ExitHead.score``)."""
        features, labels, losses, logits = ([r[i] for r in self.results] for i in range(4))
        total, scored = self.rows * self.chunks, self.scored
        parts = [part.numpy() for part in losses]
        joined = np.full(total, np.nan, parts[0].dtype if parts else np.float32)
        if parts:
            joined[:scored] = np.concatenate(parts)
        if not needs_logits:  # converting the predictions of 8 calls, for nothing
            return (features, labels), joined, None, scored
        out = np.full((total, *out_shape), np.nan, np.float32)
        if logits:
            out[:scored] = np.concatenate([part.numpy() for part in logits])
        return (features, labels), joined, out, scored


class _IdleScoring:
    """The prepared round's scoring as ``tfsift.parallel.comm.IdleWork``: units of as
    many source batches as the ``WaitModel`` expects to fit in the wait."""

    def __init__(self, scorer: EarlyExitScorer) -> None:
        self.scorer = scorer
        self.waits = WaitModel()
        self.receives = 0  # stage 0's gradient receives since overlap began
        self.late = 0  # of them, those whose gradients came while a unit ran

    def run(self, microbatch: int, waited: float) -> bool:
        prepared = self.scorer._prepared
        if prepared is None:
            return False
        if prepared.done():
            return self._finish(microbatch, waited)
        batches = self.waits.batches(microbatch, waited, prepared.left(), self._kind())
        if not batches:
            return False
        self.score(prepared, prepared.next_rows(batches), batches)
        return True

    def score(self, prepared: _Prepared, rows: tuple[Any, Any], chunks: int | None) -> None:
        """Scores ``rows`` of ``prepared`` (learning ``chunks`` source batches of the last
        round: as many as it scores in a unit, the rest in the call at the round) and
        tells the ``WaitModel`` what it took."""
        kind, batches = self._kind(), int(np.asarray(rows[1]).shape[0]) // prepared.rows
        signatures, start = self.scorer._head.signatures, time.perf_counter()
        prepared.add(self.scorer._compute(*rows, chunks))
        # A call that met a new signature (a trace of seconds while the head's calls
        # were traced lazily; a lookup of about 0.7 ms since) says nothing about a
        # unit's cost: counted, a trace kept the units of its kind out of the waits for
        # the rest of a short run.
        if self.scorer._head.signatures == signatures:
            self.waits.unit(time.perf_counter() - start, kind, batches)

    def _finish(self, microbatch: int, waited: float) -> bool:
        """After the round's last unit: the head's ``finish_early``, if the wait has room."""
        head = self.scorer._head
        # in a wait with room rather than after the losses' broadcast: it is then off the
        # critical path (docs/benchmarks-log.md, the exit head finished in a wait)
        if not head.finishes_early:
            return False
        if not self.waits.batches(microbatch, waited, 1, FINISH):
            return False
        start = time.perf_counter()
        head.finish_early()
        self.waits.unit(time.perf_counter() - start, FINISH)
        return True

    def _kind(self) -> str:
        """The next call's kind: it applies the head's pending update first, if any."""
        return UPDATE if self.scorer._head.applies_next else BATCH

    def arrived(self, microbatch: int, waited: float, exact: bool) -> None:
        # not exact: the gradients came during a unit, which delayed stage 0's backward by
        # up to its length (sift_metrics()["overlap_late_fraction"] counts how often)
        self.receives += 1
        self.late += not exact
        self.waits.arrived(microbatch, waited, exact)


def _advise(fraction: float, stages: int, waits: WaitModel) -> None:
    """Warns when overlap scored less than ``LOW_OVERLAP`` of its batches in waits."""
    if fraction >= LOW_OVERLAP:
        return
    where = (
        "with one stage nothing waits for gradients"
        if stages == 1
        else "stage 0's waits on this cut are short: it waited about "
        f"{1e3 * waits.room():.1f} ms per step for gradients, and scoring a source batch "
        f"took {1e3 * waits.unit_cost():.1f} ms there (it is the slowest stage, "
        "or a source batch takes longer than its waits last)"
    )
    log.warning(
        "tfsift.sift: overlap scored %.0f%% of the source batches of its first %d rounds "
        "while stage 0 waited for gradients; the rest was scored between steps, where every "
        "stage waits for it. Overlap pays only where stage 0 waits, and %s: put fewer "
        "layers on stage 0 (tfsift.partition with auto_partition=False) or exit earlier "
        "(exit_after). sift_metrics()['overlapped_fraction'] tracks it, and "
        "['overlap_wait_ms'] and ['overlap_unit_ms'] what it is made of.",
        100 * fraction,
        ADVICE_AFTER,
        where,
    )


def _out_shape(graph: Any) -> tuple[int, ...]:
    """The model output's shape after the batch dimension (the head's output)."""
    return tuple(graph.tensors[graph.outputs[0]].shape[1:])


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
