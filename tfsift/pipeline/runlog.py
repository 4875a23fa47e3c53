"""The run log: with ``log_dir`` set, each rank's recorded steps and rank 0's TensorBoard scalars.

Every ``@tfsift.step`` call is timed (the executor times each action anyway). Each rank
appends the calls ``rundir.recorded`` picks (the first, the powers of two and every
100th call of each step function) to ``RUN_DIR/timeline/rank-<r>.jsonl``, which ``tfsift
timeline RUN_DIR`` merges later (``tfsift.pipeline.rundir``). Rank 0 writes TensorBoard
scalars under ``RUN_DIR``, at the index of the training step (forward-only steps, such
as evaluation and sifting's scoring, are recorded in the files but not as scalars):

    step/loss                every training step: its output named "loss", else its first
                             scalar float output, averaged over the microbatches
    step/seconds             every training step: its run through the pipeline on rank 0
                             (the actions and the outputs' broadcast)
    step/samples_per_second  every training step but the first: R x the batch, over the
                             time since the previous training step began (the loop's work
                             between steps, the optimizer's update included)
    step/bubble_fraction     recorded training steps, as ``StepTimeline.bubble_fraction``
    stage<s>/busy_fraction   recorded training steps: stage s's forward and backward time
    stage<s>/idle_fraction   over the step time, and 1 minus that

What it costs: no barrier per step (when the log opens, ``clock_offset`` gives the
pipeline's ranks a common time origin); a gather of replica 0's records to rank 0 at
its recorded training steps only, after the step broadcast its outputs, so the ranks
are together already; scalars buffered in a list and written by one compiled call per
``FLUSH`` training steps (or ``FLUSH_SECONDS``), and at exit, instead of an eager summary
op per value (0.2 ms each here).
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from keras import tree

from partitioner.schedule import Action
from tfsift.parallel import watchdog
from tfsift.parallel.runtime import Runtime
from tfsift.pipeline import rundir
from tfsift.pipeline.executor import Microbatch, microbatch_size
from tfsift.pipeline.outputs import StepOutput
from tfsift.pipeline.plan import StepPlan
from tfsift.state import STATE

log = logging.getLogger("tfsift")
FLUSH = 50  # training steps of scalars buffered before they are written
FLUSH_SECONDS = 30.0  # ...or seconds, so a slow run still shows up in TensorBoard
CLOCK_TAG = 30000  # above the pipeline messages' tags (tfsift.parallel.comm), under 32767


class RunLog:
    """The run log of one ``tfsift.init`` with ``log_dir``, opened by its first step.

    Opening it is a collective over the pipeline's ranks (``clock_offset``: the common
    time origin) and truncates this rank's file. Use ``active(plan)``; ``close()`` runs at exit.
    """

    def __init__(
        self, rt: Runtime, comm: Any, pipeline: str | None = None, virtual_stages: int = 1
    ) -> None:
        cfg = rt.config
        assert cfg.log_dir is not None
        self.runtime, self._comm = rt, comm
        self.path = rundir.rank_file(cfg.log_dir, rt.rank)
        self.calls: dict[str, int] = {}  # calls so far per step function
        self.steps = 0  # step calls so far, of every function
        self.trained = 0  # training steps so far: the scalars' step
        self._previous: float | None = None  # when the last training step began
        offset = clock_offset(comm)
        # the common origin: a moment on stage 0's clock, as this rank's clock reads it
        stage0 = comm.bcast(time.perf_counter() if comm.Get_rank() == 0 else None)
        self.origin = float(stage0) + offset
        header = rundir.Header(
            rank=rt.rank,
            stage=rt.stage,
            replica=rt.replica,
            ranks=rt.topology.pipeline(rt.replica),
            replicas=rt.topology.replicas,
            microbatches=cfg.microbatches,
            pipeline=pipeline or cfg.pipeline,  # what pipeline="auto" chose
            optimize=cfg.optimize,
            plan_file=os.path.abspath(cfg.plan_file) if cfg.plan_file else None,
            started=time.time(),
            clock_offset=offset,
            virtual_stages=virtual_stages,  # the chunks this run's plan gave each rank
        )
        self._writable = self._write(header.to_line(), "w")
        self.scalars = Scalars.open(cfg.log_dir) if rt.rank == 0 else None
        atexit.register(self.close)
        log.info(
            "log_dir: recording the calls 0, 1, 2, 4, 8, ... and every %dth of each step "
            "function in %s; TensorBoard scalars in %s",
            rundir.EVERY,
            self.path.parent,
            cfg.log_dir,
        )

    def record(
        self,
        plan: StepPlan,
        fn: Callable[..., Any],
        microbatches: Sequence[Microbatch],
        entered: float,
        timed: Sequence[tuple[Action, float, float]],
        outputs: Any,
    ) -> None:
        """Logs one step call that began at ``entered`` (``time.perf_counter``) and ran
        ``timed``; a collective over the pipeline at recorded training steps."""
        left = time.perf_counter()
        name = getattr(fn, "__qualname__", repr(fn))
        call, step = self.calls.get(name, 0), self.steps
        self.calls[name], self.steps = call + 1, step + 1
        samples = sum(microbatch_size(mb) for mb in microbatches)
        record = None
        if rundir.recorded(call):
            t = self._since
            actions = tuple((str(a), t(start), t(end)) for a, start, end in timed)
            span = (t(entered), t(left))
            record = rundir.StepRecord(
                step, name, call, plan.backward, plan.s, *span, samples, actions
            )
            if self._writable:
                self._writable = self._write(record.to_line(), "a")
        if plan.backward:
            self._training(record, entered, left, samples, outputs)

    def _training(
        self,
        record: rundir.StepRecord | None,
        entered: float,
        left: float,
        samples: int,
        outputs: Any,
    ) -> None:
        gathered = None
        if record is not None and self.runtime.replica == 0:
            late = "the other stages of its pipeline to gather the run log's step record"
            with watchdog.guard(self.runtime.config.timeout, lambda: late):  # blocking MPI
                gathered = self._comm.gather(record, root=0)
        if self.scalars is not None:
            self._scalars(self.scalars, gathered, entered, left, samples, outputs)
        self._previous = entered
        self.trained += 1

    def _scalars(
        self,
        scalars: Scalars,
        gathered: list[rundir.StepRecord] | None,
        entered: float,
        left: float,
        samples: int,
        outputs: Any,
    ) -> None:
        at = self.trained
        scalars.add("step/seconds", at, left - entered)
        loss = step_loss(outputs)
        if loss is not None:
            scalars.add("step/loss", at, loss)
        if self._previous is not None and entered > self._previous:
            rate = samples * self.runtime.topology.replicas / (entered - self._previous)
            scalars.add("step/samples_per_second", at, rate)
        if gathered is not None:
            merged = rundir.merge(gathered)
            scalars.add("step/bubble_fraction", at, merged.bubble_fraction)
            for s, busy in enumerate(merged.busy()):
                fraction = busy / merged.step_time if merged.step_time > 0 else 0.0
                scalars.add(f"stage{s}/busy_fraction", at, fraction)
                scalars.add(f"stage{s}/idle_fraction", at, 1.0 - fraction)
        scalars.step_done()

    def _since(self, moment: float) -> float:
        """Seconds since the origin, to the microsecond, as the file holds them: so rank 0's
        scalars and ``tfsift timeline`` compute the same bubbles from the same numbers."""
        return round(moment - self.origin, 6)

    def _write(self, line: str, mode: str) -> bool:
        """Writes one line; False (with a warning) when the file cannot be written, after
        which this rank stops writing but keeps taking part in the gathers."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, mode, encoding="utf-8") as handle:
                handle.write(line + "\n")
        except OSError as err:
            log.warning("log_dir: cannot write %s (%s); this rank stops recording", self.path, err)
            return False
        return True

    def close(self) -> None:
        """Writes the buffered scalars and closes the TensorBoard writer (idempotent)."""
        atexit.unregister(self.close)
        if self.scalars is not None:
            self.scalars.close()
            self.scalars = None


class Scalars:
    """Rank 0's TensorBoard scalars: buffered, then written by one compiled call."""

    def __init__(self, log_dir: str) -> None:
        import tensorflow as tf

        self._tf = tf
        self._writer = tf.summary.create_file_writer(log_dir)
        self._write = _batch_writer(self._writer)
        self._pending: list[tuple[str, int, float]] = []
        self._steps = 0  # training steps in the buffer
        self._flushed = time.monotonic()

    @classmethod
    def open(cls, log_dir: str) -> Scalars | None:
        """The scalars of ``log_dir``; None, with a warning, without tensorboard."""
        if importlib.util.find_spec("tensorboard") is None:
            log.warning(
                "log_dir: no TensorBoard scalars, the tensorboard package is not installed "
                "(pip install tensorboard); the timeline files are written. Received: "
                "log_dir=%r",
                log_dir,
            )
            return None
        return cls(log_dir)

    def add(self, tag: str, step: int, value: float) -> None:
        """Buffers one point of ``tag`` at ``step``."""
        self._pending.append((tag, step, float(value)))

    def step_done(self) -> None:
        """Ends a training step's points: writes them every ``FLUSH`` steps or seconds."""
        self._steps += 1
        if self._steps >= FLUSH or time.monotonic() - self._flushed >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Writes the buffered points to the event file."""
        if self._pending:
            tf = self._tf
            tags, steps, values = zip(*self._pending, strict=True)
            self._write(
                tf.constant(tags, tf.string),
                tf.constant(steps, tf.int64),
                tf.constant(values, tf.float32),
            )
            self._pending.clear()
        self._writer.flush()
        self._steps, self._flushed = 0, time.monotonic()

    def close(self) -> None:
        """Flushes, then closes the event file."""
        self.flush()
        self._writer.close()


def _batch_writer(writer: Any) -> Any:
    """A compiled function writing (tag, step, value) triples with ``writer``, with the
    metadata ``tf.summary.scalar`` gives its points (TensorBoard's scalars plugin)."""
    import tensorflow as tf

    plugin = tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars")
    metadata = tf.compat.v1.SummaryMetadata(plugin_data=plugin).SerializeToString()
    specs = (
        tf.TensorSpec([None], tf.string),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None], tf.float32),
    )

    def write(tags: Any, steps: Any, values: Any) -> None:
        with writer.as_default():
            for i in tf.range(tf.size(tags)):
                tf.summary.write(tags[i], values[i], step=steps[i], metadata=metadata)

    return tf.function(write, input_signature=specs)


def step_loss(outputs: Any) -> float | None:
    """The step's loss: its output named ``"loss"``, else its first scalar float output
    (in ``keras.tree.flatten`` order), averaged over the microbatches; None if it has none.

    Example:
        >>> step_loss({"loss": StepOutput([tf.constant(1.0), tf.constant(3.0)])})
        2.0
    """
    if isinstance(outputs, dict) and _scalar(outputs.get("loss")):
        return _mean(outputs["loss"])
    for leaf in tree.flatten(outputs):
        if _scalar(leaf):
            return _mean(leaf)
    return None


def _scalar(value: Any) -> bool:
    # GradientOutputs are StepOutputs too, but hold gradients, never a loss
    return type(value) is StepOutput and all(
        o.shape.rank == 0 and o.dtype.is_floating for o in value.outputs
    )


def _mean(value: StepOutput) -> float:
    return float(np.mean([o.numpy() for o in value.outputs]))


def clock_offset(comm: Any, rounds: int = 8) -> float:
    """This rank's ``time.perf_counter`` minus stage 0's, in seconds (a collective).

    On stage 0's host it is 0: every process there reads the same clock (Linux's
    ``CLOCK_MONOTONIC``), and measuring would only add the measurement's error, a
    millisecond on a busy machine. On another host, Cristian's algorithm: stage 0 asks
    stage s for its clock ``rounds`` times and, from the exchange with the shortest round
    trip, takes s's reading minus the trip's midpoint (accurate to half that trip). A
    barrier would not do: a rank descheduled right after it reads the origin late.
    """
    hosts = comm.allgather(socket.gethostname())
    stage, offset = comm.Get_rank(), 0.0
    for peer in range(1, comm.Get_size()):
        if hosts[peer] == hosts[0]:
            continue
        if stage == 0:
            trips = [_ask(comm, peer) for _ in range(rounds)]
            comm.send(min(trips)[1], dest=peer, tag=CLOCK_TAG)
        elif stage == peer:
            for _ in range(rounds):
                comm.recv(source=0, tag=CLOCK_TAG)
                comm.send(time.perf_counter(), dest=0, tag=CLOCK_TAG)
            offset = comm.recv(source=0, tag=CLOCK_TAG)
    return float(offset)


def _ask(comm: Any, peer: int) -> tuple[float, float]:
    """(round trip, the peer's clock minus the trip's midpoint on this rank's clock)."""
    sent = time.perf_counter()
    comm.send(None, dest=peer, tag=CLOCK_TAG)
    theirs: float = comm.recv(source=peer, tag=CLOCK_TAG)
    back = time.perf_counter()
    return back - sent, theirs - (sent + back) / 2


def active(plan: StepPlan) -> RunLog | None:
    """The run log of ``plan``'s ``tfsift.init``, opened at its first step; None without
    ``log_dir``. A collective the first time, like the step itself."""
    rt = plan.runtime
    if rt.config.log_dir is None:
        return None
    current: RunLog | None = STATE.run_log
    if current is None or current.runtime is not rt:
        if current is not None:
            current.close()
        current = STATE.run_log = RunLog(rt, plan.comm.comm, plan.pipeline, len(plan.chunks))
    return current
