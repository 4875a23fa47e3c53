"""Pipeline schedules as data: per-stage lists of actions, built and checked by pure functions.

Letters: K stages, M microbatches, s stage index, m microbatch index. An `Action` is one
step on one stage's rank, printed `{s}{kind}{m}`: `1F3` is the forward of microbatch 3 on
stage 1, `2SB0` stage 2 sending microbatch 0's input gradients to stage 1. A backward is
one action B, or, in a zero-bubble schedule, B (the stage's input gradients, which the
previous stage waits for) then W (its weight gradients, which nobody waits for). A
`Schedule` maps each stage to its ordered actions. Builders emit compute actions only;
`add_communication` inserts the sends and receives; `validate` checks any schedule,
including cross-stage deadlock, by an abstract execution.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """What an action does."""

    FORWARD = "F"
    BACKWARD = "B"  # the whole backward, or with W: the input gradients only
    WEIGHT = "W"  # the weight gradients of a backward split in two
    SEND_F = "SF"  # activations of m to s + 1
    RECV_F = "RF"  # activations of m from s - 1
    SEND_B = "SB"  # input gradients of m to s - 1
    RECV_B = "RB"  # input gradients of m from s + 1


COMPUTE = frozenset({Kind.FORWARD, Kind.BACKWARD, Kind.WEIGHT})
COMPUTE_ORDER = (Kind.FORWARD, Kind.BACKWARD)
_PATTERN = re.compile(r"(\d+)(F|B|W|SF|RF|SB|RB)(\d+)")


@dataclass(frozen=True, order=True)
class Action:
    """One step of a schedule.

    Example:
        >>> str(Action(1, Kind.FORWARD, 3)), Action.parse("2SB0")
        ('1F3', Action(stage=2, kind=<Kind.SEND_B: 'SB'>, microbatch=0))
    """

    stage: int
    kind: Kind
    microbatch: int

    def __post_init__(self) -> None:
        if self.stage < 0 or self.microbatch < 0:
            raise ValueError(
                "stage and microbatch must be >= 0. "
                f"Received: stage={self.stage}, microbatch={self.microbatch}"
            )
        object.__setattr__(self, "kind", Kind(self.kind))

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """Inverse of `str`: `Action.parse("1F3") == Action(1, Kind.FORWARD, 3)`."""
        match = _PATTERN.fullmatch(text.strip())
        if match is None:
            raise ValueError(
                "an action reads {stage}{F|B|W|SF|RF|SB|RB}{microbatch}, e.g. '1F3'. "
                f"Received: text={text!r}"
            )
        return cls(int(match[1]), Kind(match[2]), int(match[3]))


Schedule = dict[int, list[Action]]


class ScheduleError(ValueError):
    """A schedule that cannot run; the message shows where."""


def simple(K: int, M: int) -> Schedule:
    """GPipe: every stage runs all M forwards, then all M backwards; the last stage
    runs each backward right after its forward.

    The last stage's backward of m needs nothing but its forward of m, so running it
    at once never delays anything: each input gradient leaves no later than in the
    all-forwards-first order (so the step time is never longer), and the last stage
    holds one microbatch's activations instead of M. The runtime then fuses the two
    into one compiled call. K=2, M=3:

        stage 0  F0 F1 F2 B0 B1 B2
        stage 1  F0 B0 F1 B1 F2 B2
    """
    _check_sizes(K, M)
    schedule = {
        s: [Action(s, Kind.FORWARD, m) for m in range(M)]
        + [Action(s, Kind.BACKWARD, m) for m in range(M)]
        for s in range(K - 1)
    }
    last = K - 1
    schedule[last] = [Action(last, kind, m) for m in range(M) for kind in COMPUTE_ORDER]
    return schedule


def interleaved(K: int, M: int) -> Schedule:
    """1F1B (PipeDream-flush): a warm-up of forwards, then one forward per backward.

    Stage s warms up with min(K - s - 1, M) forwards, alternates F and B in the steady
    state, and drains the remaining backwards, so at most min(K - s, M) microbatches are
    in flight on stage s. K=3, M=4, forward 1 tick, backward 2 ticks, no transfer time
    (`simulate` draws the same picture):

        tick     0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17
        stage 0  F0 F1 F2 .  .  .  .  B0 B0 F3 B1 B1 .  B2 B2 .  B3 B3
        stage 1  .  F0 F1 .  .  B0 B0 F2 B1 B1 F3 B2 B2 .  B3 B3 .  .
        stage 2  .  .  F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 .  .  .  .

    Args:
        K: number of stages.
        M: number of microbatches.

    Returns:
        The compute-only schedule; `add_communication` adds the transfers.
    """
    _check_sizes(K, M)
    schedule: Schedule = {}
    for s in range(K):
        warmup = min(K - s - 1, M)
        actions = [Action(s, Kind.FORWARD, m) for m in range(warmup)]
        for m in range(M - warmup):
            actions += [Action(s, Kind.FORWARD, warmup + m), Action(s, Kind.BACKWARD, m)]
        actions += [Action(s, Kind.BACKWARD, m) for m in range(M - warmup, M)]
        schedule[s] = actions
    return schedule


def zero_bubble(K: int, M: int) -> Schedule:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B with each
    backward split into B (input gradients) and W (weight gradients), W deferred.

    Stage s runs 1F1B's forwards and B's in 1F1B's order (a warm-up of min(K - s - 1, M)
    forwards, then the next forward, if any, and one B per microbatch); after its
    (s + 1)-th B on, each B is followed by the W of the microbatch s before it, and the
    last s W's end its row. In 1F1B the later stages idle at the end of a step while the
    last input gradients travel back to stage 0; here a B is about half a backward, so
    they travel sooner, and stage s fills that end with its s deferred W's. A stage holds
    at most min(K, M) microbatches' activations (from F to W): 1F1B's peak, that of its
    stage 0. Stage 0 computes no input gradients: its B is its whole backward and its W
    is empty (`splits_stage`). K=3, M=4, forward 1 tick, backward 2 ticks (B 1, W 1), no
    transfer time, as `interleaved`'s picture, which takes 18 ticks (`simulate` draws it):

        tick     0  1  2  3  4  5  6  7  8  9 10 11 12 13
        stage 0  F0 F1 F2 .  .  B0 B0 F3 B1 B1 B2 B2 B3 B3
        stage 1  .  F0 F1 .  B0 F2 B1 W0 F3 B2 W1 B3 W2 W3
        stage 2  .  .  F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3

    Args:
        K: number of stages.
        M: number of microbatches.

    Returns:
        The compute-only schedule; `add_communication` adds the transfers.
    """
    _check_sizes(K, M)
    schedule: Schedule = {}
    for s in range(K):
        warmup = min(K - s - 1, M)
        actions = [Action(s, Kind.FORWARD, m) for m in range(warmup)]
        for m in range(M):
            if warmup + m < M:
                actions.append(Action(s, Kind.FORWARD, warmup + m))
            actions.append(Action(s, Kind.BACKWARD, m))
            if m >= s:
                actions.append(Action(s, Kind.WEIGHT, m - s))
        actions += [Action(s, Kind.WEIGHT, m) for m in range(max(M - s, 0), M)]
        schedule[s] = actions
    return schedule


def forward_only(K: int, M: int) -> Schedule:
    """Evaluation or data scoring: every stage runs the M forwards in order."""
    _check_sizes(K, M)
    return {s: [Action(s, Kind.FORWARD, m) for m in range(M)] for s in range(K)}


PIPELINES = ("simple", "interleaved", "zero_bubble")
_BUILDERS = {"simple": simple, "interleaved": interleaved, "zero_bubble": zero_bubble}
_forward_only = forward_only  # `build` has a keyword of the same name


def build(pipeline: str, K: int, M: int, *, forward_only: bool = False) -> Schedule:
    """The compute schedule named `pipeline` (one of `PIPELINES`)."""
    if pipeline not in PIPELINES:
        raise ValueError(
            f"pipeline must be one of {list(PIPELINES)}. Received: pipeline={pipeline!r}"
        )
    if forward_only:
        return _forward_only(K, M)
    return _BUILDERS[pipeline](K, M)


def splits_backward(schedule: Schedule) -> bool:
    """Whether the schedule runs its backwards as B then W (it holds a W action)."""
    return any(a.kind is Kind.WEIGHT for row in schedule.values() for a in row)


def splits_stage(s: int, recompute: bool) -> bool:
    """Whether stage s of a schedule that splits its backwards computes B and W apart.

    Stage 0 sends no input gradients, so its B runs the whole backward and its W nothing
    (a W right after its B, as zero-bubble schedules place it, loses nothing). A stage that
    recomputes its forward inside its backward (``optimize="memory"``) does the same: to
    keep W apart it would keep the recomputed activations from B to W, which that mode
    exists not to hold, so its steps run as 1F1B's.
    """
    return s > 0 and not recompute


def add_communication(schedule: Schedule) -> Schedule:
    """Inserts the transfers around every compute action (a pure pass).

    RF before each F on s > 0 and SF after it on s < K - 1; RB before each B on
    s < K - 1 and SB after it on s > 0; nothing around a W.

    Raises:
        ScheduleError: if the schedule already holds transfers.
    """
    K = len(schedule)
    result: Schedule = {}
    for s, actions in schedule.items():
        row: list[Action] = []
        for a in actions:
            if a.kind not in COMPUTE:
                raise ScheduleError(
                    f"add_communication takes a compute-only schedule. Received: action {a}"
                )
            before, after = _transfers(a, K)
            row += [*before, a, *after]
        result[s] = row
    return result


def format_schedule(schedule: Schedule, marks: dict[int, tuple[int, str]] | None = None) -> str:
    """One aligned row of actions per stage.

    Args:
        schedule: the schedule to print.
        marks: stage -> (action index, note); that row stops at the marked action and
            ends with `<-- ERROR HERE` and the note.
    """
    marks = marks or {}
    width = max((len(str(a)) for row in schedule.values() for a in row), default=1)
    lines = []
    for s in sorted(schedule):
        row = [str(a).ljust(width) for a in schedule[s]]
        if s in marks:
            index, note = marks[s]
            row = [*row[: index + 1], f"<-- ERROR HERE{note and ' (' + note + ')'}"]
        lines.append(f"stage {s}: " + " ".join(row).rstrip())
    return "\n".join(lines)


def validate(schedule: Schedule, M: int) -> None:
    """Checks that a schedule runs every microbatch once, in order, without deadlock.

    Compute-only schedules are checked per stage, then through
    `add_communication(schedule)` for the cross-stage order. Schedules with transfers
    must also receive before they compute and send after, match every send with a
    receive, and finish under an abstract execution where sends never block and a
    receive waits for its send.

    Raises:
        ScheduleError: naming the problem, with the timeline marked `<-- ERROR HERE`.
    """
    _check_shape(schedule, M)
    _check_compute(schedule, M)
    if all(a.kind in COMPUTE for row in schedule.values() for a in row):
        schedule = add_communication(schedule)
    _check_transfers(schedule, len(schedule))
    _check_deadlock(schedule)


def _check_sizes(K: int, M: int) -> None:
    if K < 1 or M < 1:
        raise ValueError(f"K (stages) and M (microbatches) must be >= 1. Received: K={K}, M={M}")


def _transfers(a: Action, K: int) -> tuple[list[Action], list[Action]]:
    s, m = a.stage, a.microbatch
    if a.kind is Kind.FORWARD:
        return [Action(s, Kind.RECV_F, m)] * (s > 0), [Action(s, Kind.SEND_F, m)] * (s < K - 1)
    if a.kind is Kind.WEIGHT:  # nobody waits for weight gradients: nothing to send
        return [], []
    return [Action(s, Kind.RECV_B, m)] * (s < K - 1), [Action(s, Kind.SEND_B, m)] * (s > 0)


def _fail(schedule: Schedule, message: str, marks: dict[int, tuple[int, str]]) -> ScheduleError:
    return ScheduleError(f"{message}\n{format_schedule(schedule, marks)}")


def _check_shape(schedule: Schedule, M: int) -> None:
    if M < 1 or sorted(schedule) != list(range(len(schedule))) or not schedule:
        raise ScheduleError(
            "a schedule maps stages 0..K-1 to actions and M >= 1. "
            f"Received: stages={sorted(schedule)}, M={M}"
        )
    for s, row in schedule.items():
        for index, a in enumerate(row):
            if a.stage != s or not 0 <= a.microbatch < M:
                raise _fail(
                    schedule,
                    f"every action on stage {s} must have stage={s} and microbatch in "
                    f"[0, {M}). Received: {a}",
                    {s: (index, "")},
                )


def _check_compute(schedule: Schedule, M: int) -> None:
    training = any(a.kind is Kind.BACKWARD for row in schedule.values() for a in row)
    kinds = [Kind.FORWARD, Kind.BACKWARD] if training else [Kind.FORWARD]
    kinds += [Kind.WEIGHT] * splits_backward(schedule)
    for s, row in schedule.items():
        first: dict[Action, int] = {}
        for index, a in enumerate(row):
            if a in first and a.kind in COMPUTE:
                raise _fail(schedule, f"duplicate action {a}", {s: (index, "")})
            if a.kind is Kind.BACKWARD and Action(s, Kind.FORWARD, a.microbatch) not in first:
                raise _fail(schedule, f"backward {a} before its forward", {s: (index, "")})
            if a.kind is Kind.WEIGHT and Action(s, Kind.BACKWARD, a.microbatch) not in first:
                raise _fail(schedule, f"weight gradients {a} before its backward", {s: (index, "")})
            first.setdefault(a, index)
        for kind in kinds:
            for m in range(M):
                if Action(s, kind, m) not in first:
                    raise _fail(schedule, _missing(Action(s, kind, m)), {})


def _missing(action: Action) -> str:
    s = action.stage
    if action.kind is Kind.WEIGHT:
        return (
            f"stage {s} has no weight gradients {action} while other stages split their "
            "backward (a schedule splits every backward into B and W or none)"
        )
    if action.kind is Kind.BACKWARD:
        return (
            f"stage {s} has no backward {action} while other stages train "
            "(a forward-only schedule mixed with a training one)"
        )
    return f"stage {s} has no forward {action}"


def _check_transfers(schedule: Schedule, K: int) -> None:
    positions: dict[Action, int] = {}
    for s, row in schedule.items():
        for index, a in enumerate(row):
            if a in positions:
                raise _fail(schedule, f"duplicate action {a}", {s: (index, "")})
            positions[a] = index
    for s, row in schedule.items():
        for index, a in enumerate(row):
            problem = _transfer_problem(a, K, positions)
            if problem:
                raise _fail(schedule, problem, {s: (index, "")})


def _transfer_problem(a: Action, K: int, positions: dict[Action, int]) -> str:
    """Why `a` cannot sit where it is, or "" if it can."""
    edge = {Kind.RECV_F: 0, Kind.SEND_F: K - 1, Kind.RECV_B: K - 1, Kind.SEND_B: 0}
    if edge.get(a.kind) == a.stage:
        return f"{a} has no neighbouring stage to talk to (K={K})"
    partner = _partner(a)
    if partner is not None and partner not in positions:
        return f"{a} has no matching {partner}"
    before = _needs(a, K)
    if before is not None and (before not in positions or positions[before] > positions[a]):
        return f"{a} needs {before} earlier on stage {a.stage}"
    return ""


def _partner(a: Action) -> Action | None:
    """The action on the neighbouring stage that pairs with a transfer."""
    s, m = a.stage, a.microbatch
    pairs = {
        Kind.SEND_F: (1, Kind.RECV_F),
        Kind.RECV_F: (-1, Kind.SEND_F),
        Kind.SEND_B: (-1, Kind.RECV_B),
        Kind.RECV_B: (1, Kind.SEND_B),
    }
    if a.kind not in pairs:
        return None
    step, kind = pairs[a.kind]
    return Action(s + step, kind, m)


def _needs(a: Action, K: int) -> Action | None:
    """The action that must precede `a` on its own rank: its receive or its compute."""
    s, m = a.stage, a.microbatch
    needs = {
        Kind.FORWARD: (s > 0, Kind.RECV_F),
        Kind.BACKWARD: (s < K - 1, Kind.RECV_B),
        Kind.SEND_F: (True, Kind.FORWARD),
        Kind.SEND_B: (True, Kind.BACKWARD),
    }
    applies, kind = needs.get(a.kind, (False, a.kind))
    return Action(s, kind, m) if applies else None


def _check_deadlock(schedule: Schedule) -> None:
    position = dict.fromkeys(schedule, 0)
    sent: set[Action] = set()
    progress = True
    while progress:
        progress = False
        for s, row in schedule.items():
            while position[s] < len(row):
                a = row[position[s]]
                if a.kind in (Kind.RECV_F, Kind.RECV_B) and _partner(a) not in sent:
                    break
                if a.kind in (Kind.SEND_F, Kind.SEND_B):
                    sent.add(a)
                position[s] += 1
                progress = True
    stuck = {s: i for s, i in position.items() if i < len(schedule[s])}
    if stuck:
        marks = {s: (i, f"waits for {_partner(schedule[s][i])}") for s, i in stuck.items()}
        rows = ", ".join(str(s) for s in stuck)
        raise _fail(schedule, f"deadlock: stages {rows} wait on receives that never come", marks)
