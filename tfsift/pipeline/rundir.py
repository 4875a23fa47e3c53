"""A run directory's timeline files: their layout, their records, and merging them into steps.

With ``tfsift.init({"log_dir": RUN_DIR})`` (``tfsift.pipeline.runlog``) a run leaves:

    RUN_DIR/timeline/rank-<r>.jsonl  one file per rank: a header line, then one line per
                                     recorded step (its actions, timed on this rank)
    RUN_DIR/plan.json                the plan rank 0 solved or reused (predicted bubble)
    RUN_DIR/events.out.tfevents.*    rank 0's TensorBoard scalars

A record's times are seconds since an origin the ranks of a pipeline share: a moment
on stage 0's ``time.perf_counter``, read on each rank's own clock through the offset
measured when the log opened (``tfsift.pipeline.runlog.clock_offset``). So the records
merge without MPI (``merge``) and without a barrier per step. This
module reads and writes the files only; it never imports TensorFlow, so ``tfsift
timeline`` stays quick.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from partitioner.schedule import Action
from partitioner.simulator import Event
from tfsift.pipeline.timeline import StepTimeline

TIMELINE_DIR = "timeline"
PLAN_FILE = "plan.json"  # tfsift.planning.bounds writes it under this name too
FORMAT = "tfsift-timeline"
VERSION = 1
EVERY = 100  # besides the first calls and the powers of two, every EVERY-th call is recorded


def recorded(call: int) -> bool:
    """Whether the ``call``-th call (from 0) of a step function is recorded: 0, the powers
    of two and the multiples of ``EVERY``, so a run of n steps records about
    log2(n) + n / 100 of them.

    Example:
        >>> [c for c in range(300) if recorded(c)]
        [0, 1, 2, 4, 8, 16, 32, 64, 100, 128, 200, 256]
    """
    return call & (call - 1) == 0 or call % EVERY == 0


def rank_file(run_dir: str | Path, rank: int) -> Path:
    """``RUN_DIR/timeline/rank-<rank>.jsonl``."""
    return Path(run_dir) / TIMELINE_DIR / f"rank-{rank}.jsonl"


@dataclasses.dataclass(frozen=True)
class Header:
    """The first line of a rank's file: who wrote it and the run's pipeline.

    Args:
        rank, stage, replica: the writer's global rank, stage s and pipeline replica.
        ranks: the global ranks of its pipeline, by stage (K of them).
        replicas: R.
        microbatches, pipeline, optimize: M and the schedule of the run's config.
        plan_file: the config's ``plan_file``, absolute (None: not set).
        started: ``time.time()`` at the log's origin (for people, not for merging).
        clock_offset: this rank's ``time.perf_counter`` minus stage 0's, in seconds.
        virtual_stages: v, the chunks each rank runs (1 in files written before it was
            recorded).
    """

    rank: int
    stage: int
    replica: int
    ranks: tuple[int, ...]
    replicas: int
    microbatches: int
    pipeline: str
    optimize: str
    plan_file: str | None
    started: float
    clock_offset: float
    virtual_stages: int = 1

    @property
    def stages(self) -> int:
        """K."""
        return len(self.ranks)

    def to_line(self) -> str:
        """One JSON line, tagged with the format and its version."""
        return json.dumps({"format": FORMAT, "version": VERSION, **dataclasses.asdict(self)})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Header:
        """Inverse of ``to_line`` (after ``json.loads``)."""
        known = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data}
        return cls(**{**known, "ranks": tuple(data["ranks"])})


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One recorded step on one rank.

    Args:
        step: the index of the step among every ``@tfsift.step`` call of the log (the same
            on every rank of a pipeline).
        name: the step function's qualified name.
        call: which call of that function it was (0: the first, which also compiles).
        training: whether the step computed gradients.
        stage: the rank's stage.
        entered, left: when the step call began and returned on this rank.
        samples: the rank's batch size for the step.
        actions: (action, start, end) for every schedule action, in order (``"1RF3"``).
    """

    step: int
    name: str
    call: int
    training: bool
    stage: int
    entered: float
    left: float
    samples: int
    actions: tuple[tuple[str, float, float], ...]

    def to_line(self) -> str:
        """One JSON line; times rounded to the microsecond to keep files small."""
        data = dataclasses.asdict(self)
        data["entered"], data["left"] = round(self.entered, 6), round(self.left, 6)
        data["actions"] = [[a, round(b, 6), round(e, 6)] for a, b, e in self.actions]
        return json.dumps(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        """Inverse of ``to_line`` (after ``json.loads``)."""
        actions = tuple((str(a), float(b), float(e)) for a, b, e in data["actions"])
        return cls(**{**data, "actions": actions})


def read_rank_file(path: str | Path) -> tuple[Header, list[StepRecord]]:
    """The header and the records of one rank's file.

    Raises:
        ValueError: the file is not a timeline file of this version (its name and line).
    """
    lines = Path(path).read_text().splitlines()
    try:
        head = json.loads(lines[0]) if lines else {}
        if head.get("format") != FORMAT or head.get("version") != VERSION:
            raise ValueError(f"the first line is not a {FORMAT} header of version {VERSION}")
        header = Header.from_dict(head)
        # a line cut short by a job that ended while writing it is the last one: skip it
        records = [StepRecord.from_dict(json.loads(line)) for line in _whole(lines[1:])]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"{str(path)!r} is not a tfsift timeline file ({type(err).__name__}: {err}). "
            f"Received: first line {lines[0][:80] if lines else ''!r}"
        ) from err
    return header, records


def _whole(lines: Sequence[str]) -> list[str]:
    if lines and not _parses(lines[-1]):
        return list(lines[:-1])
    return list(lines)


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def merge(records: Sequence[StepRecord]) -> StepTimeline:
    """One step's records, one per stage of a pipeline, as a ``StepTimeline``.

    The step begins when stage 0 entered it, as if a barrier had started it (as in
    ``tfsift.timeline()``): no other stage can do anything before stage 0 sends its first
    activations, so a stage that entered earlier was waiting for stage 0 to finish the
    loop's work between steps, outside the schedule; its first receive counts from the
    step's start. A stage that entered later shows it as the others' waits.

    Example:
        >>> a = StepRecord(0, "train", 0, True, 0, 1.0, 2.0, 8, (("0F0", 1.0, 1.25),))
        >>> b = StepRecord(0, "train", 0, True, 1, 0.5, 2.0, 8,
        ...                (("1RF0", 0.5, 1.25), ("1F0", 1.25, 1.5)))
        >>> [(str(e.action), e.start, e.end) for e in merge([b, a]).events]
        [('0F0', 0.0, 0.25), ('1RF0', 0.0, 0.25), ('1F0', 0.25, 0.5)]

    Raises:
        ValueError: the records are not of one step, or not one per stage 0..K-1.
    """
    ordered = sorted(records, key=lambda r: r.stage)
    steps = sorted({r.step for r in ordered})
    stages = [r.stage for r in ordered]
    if len(steps) != 1 or stages != list(range(len(ordered))):
        raise ValueError(
            "merge needs one record per stage 0..K-1 of one step. Received: steps "
            f"{steps}, stages {stages}"
        )
    origin = ordered[0].entered
    events = tuple(
        Event(r.stage, Action.parse(text), max(start - origin, 0.0), max(end - origin, 0.0))
        for r in ordered
        for text, start, end in r.actions
    )
    return StepTimeline(events, len(ordered))


@dataclasses.dataclass(frozen=True)
class RecordedStep:
    """A step of the run, merged over its pipeline's ranks (``Run.steps``)."""

    step: int
    name: str
    call: int
    training: bool
    timeline: StepTimeline


@dataclasses.dataclass(frozen=True)
class Run:
    """The recorded steps of one pipeline replica of a run directory.

    Example:
        >>> run = Run.load("runs/exp1")  # after tfsift.init({..., "log_dir": "runs/exp1"})
        >>> [s.timeline.bubble_fraction for s in run.steps]
    """

    header: Header
    steps: tuple[RecordedStep, ...]

    @classmethod
    def load(cls, run_dir: str | Path, replica: int = 0) -> Run:
        """Reads the files of ``replica``'s ranks and merges the steps every rank recorded.

        Raises:
            ValueError: no such directory; no timeline files; ``replica`` not in the run; a
                rank of its pipeline without a file; files of different runs.
        """
        headers = _headers(run_dir)
        found = [h for h in headers if h.replica == replica]
        if not found:
            raise ValueError(
                f"replica {replica} has no timeline files in {str(run_dir)!r}. Received: "
                f"replicas {sorted({h.replica for h in headers})}"
            )
        ranks = found[0].ranks
        missing = [r for r in ranks if not rank_file(run_dir, r).exists()]
        if missing:
            raise ValueError(
                f"the pipeline of replica {replica} is ranks {list(ranks)}, and ranks "
                f"{missing} left no file in {str(Path(run_dir) / TIMELINE_DIR)!r} (did they "
                "fail, or is the directory a partial copy?)"
            )
        per_rank = [read_rank_file(rank_file(run_dir, r)) for r in ranks]
        _check_same_run([h for h, _ in per_rank], run_dir)
        return cls(per_rank[0][0], _steps([records for _, records in per_rank]))


def _headers(run_dir: str | Path) -> list[Header]:
    root = Path(run_dir)
    if not root.is_dir():
        raise ValueError(f"the run directory does not exist. Received: {str(run_dir)!r}")
    paths = sorted((root / TIMELINE_DIR).glob("rank-*.jsonl"))
    if not paths:
        raise ValueError(
            f"{str(root / TIMELINE_DIR)!r} holds no rank-<r>.jsonl timeline files: run the "
            f"training with tfsift.init({{..., 'log_dir': {str(run_dir)!r}}}). Received: "
            f"{sorted(p.name for p in root.iterdir())}"
        )
    return [read_rank_file(p)[0] for p in paths]


def _check_same_run(headers: Sequence[Header], run_dir: str | Path) -> None:
    seen = {(h.ranks, h.microbatches, h.pipeline) for h in headers}
    described = [(h.rank, h.stage, list(h.ranks), h.microbatches) for h in headers]
    if len(seen) > 1 or [h.stage for h in headers] != list(range(len(headers))):
        raise ValueError(
            f"the timeline files in {str(run_dir)!r} come from different runs (delete the "
            "directory before reusing it with another layout). Received: (rank, stage, "
            f"pipeline ranks, M) {described}"
        )


def _steps(per_rank: Sequence[Sequence[StepRecord]]) -> tuple[RecordedStep, ...]:
    """The steps every rank recorded (a rank that died early recorded fewer), merged."""
    by_step = [{r.step: r for r in records} for records in per_rank]
    common = sorted(set.intersection(*(set(steps) for steps in by_step)))
    merged = []
    for i in common:
        first = by_step[0][i]
        timeline = merge([steps[i] for steps in by_step])
        merged.append(RecordedStep(i, first.name, first.call, first.training, timeline))
    return tuple(merged)


def predicted_bubble(
    run_dir: str | Path, header: Header, plan: str | Path | None = None
) -> tuple[float | None, str]:
    """The simulated bubble of the run's plan, and where it came from (or why there is none).

    The plan is ``plan`` if given, else ``RUN_DIR/plan.json`` (rank 0 keeps a copy there
    when it solves or reuses one), else the run's ``plan_file``. A plan made for another K,
    M or pipeline predicts nothing about this run.

    Raises:
        ValueError: ``plan`` does not exist, or a plan file is not a plan.
    """
    from partitioner.plan import Plan

    if plan is not None and not Path(plan).exists():
        raise ValueError(f"the plan file does not exist. Received: {str(plan)!r}")
    candidates = [Path(plan)] if plan is not None else [Path(run_dir) / PLAN_FILE]
    if plan is None and header.plan_file:
        candidates.append(Path(header.plan_file))
    found = next((path for path in candidates if path.exists()), None)
    if found is None:
        return None, (
            f"no simulated bubble: no {PLAN_FILE} in the run directory (rank 0 writes it when "
            "it solves the partition: auto_partition, partitions > 1); --plan PLAN.json names one"
        )
    made = Plan.load(found)
    v = made.virtual_stages
    planned = (len(made.stage_layers) // v, made.microbatches, made.pipeline, v)
    this = (header.stages, header.microbatches, header.pipeline, header.virtual_stages)
    if planned != this:
        return None, (
            f"no simulated bubble: the plan in {found} was made for {_layout(*planned)}; "
            f"this run is {_layout(*this)}"
        )
    return made.predicted_bubble, f"simulated bubble from {found}"


def _layout(K: int, M: int, pipeline: str, v: int) -> str:
    chunks = f" with {v} virtual stages" if v > 1 else ""
    return f"K={K}, M={M}, {pipeline}{chunks}"
