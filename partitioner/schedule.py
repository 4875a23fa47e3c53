"""Pipeline schedules as data: per-stage lists of actions, built and checked by pure functions.

Letters: K stages, M microbatches, s stage index, m microbatch index. An `Action` is one
step on one stage's rank, printed `{s}{kind}{m}`: `1F3` is the forward of microbatch 3 on
stage 1, `2SB0` stage 2 sending microbatch 0's input gradients to stage 1. A backward is
one action B, or, in a zero-bubble schedule, B (the stage's input gradients, which the
previous stage waits for) then W (its weight gradients, which nobody waits for). A
`Schedule` maps each stage to its ordered actions. Builders emit compute actions only;
`add_communication` inserts the sends and receives; `validate` checks any schedule,
including cross-stage deadlock, by an abstract execution.

Virtual stages (Megatron-LM's interleaved 1F1B): with v virtual stages the model is cut
into C = K v chunks, and the rank at pipeline position s runs chunks s, s + K, ...,
s + (v - 1) K. A `Schedule` then maps each rank s to its actions, and an action's
``stage`` is the chunk it runs (with v = 1 both are s): `2F0` on rank 0 of K = 2 is the
forward of microbatch 0 through chunk 2, whose input comes from chunk 1 on rank 1.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
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


def interleaved(K: int, M: int, virtual_stages: int = 1) -> Schedule:
    """1F1B (PipeDream-flush): a warm-up of forwards, then one forward per backward.

    Stage s warms up with min(K - s - 1, M) forwards, alternates F and B in the steady
    state, and drains the remaining backwards, so at most min(K - s, M) microbatches are
    in flight on stage s. K=3, M=4, forward 1 tick, backward 2 ticks, no transfer time
    (`simulate` draws the same picture):

        tick     0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17
        stage 0  F0 F1 F2 .  .  .  .  B0 B0 F3 B1 B1 .  B2 B2 .  B3 B3
        stage 1  .  F0 F1 .  .  B0 B0 F2 B1 B1 F3 B2 B2 .  B3 B3 .  .
        stage 2  .  .  F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 .  .  .  .

    With ``virtual_stages`` v > 1 it is Megatron-LM's interleaved 1F1B over v chunks
    per rank (`virtual`).

    Args:
        K: number of stages (ranks of the pipeline).
        M: number of microbatches.
        virtual_stages: v, the model chunks each rank runs.

    Returns:
        The compute-only schedule; `add_communication` adds the transfers.
    """
    _check_sizes(K, M)
    if virtual_stages != 1:
        return virtual(K, M, virtual_stages)
    schedule: Schedule = {}
    for s in range(K):
        warmup = min(K - s - 1, M)
        actions = [Action(s, Kind.FORWARD, m) for m in range(warmup)]
        for m in range(M - warmup):
            actions += [Action(s, Kind.FORWARD, warmup + m), Action(s, Kind.BACKWARD, m)]
        actions += [Action(s, Kind.BACKWARD, m) for m in range(M - warmup, M)]
        schedule[s] = actions
    return schedule


def virtual(K: int, M: int, v: int) -> Schedule:
    """Interleaved 1F1B with v virtual stages (Narayanan et al., "Efficient Large-Scale
    Language Model Training on GPU Clusters Using Megatron-LM", SC 2021; Megatron-LM's
    and torch.distributed.pipelining's ScheduleInterleaved1F1B).

    Rank s runs chunks s, s + K, ..., s + (v - 1) K of C = K v. The microbatches go in
    rounds of P = M / max(1, floor(M / K)) (M must be a multiple of that count of
    rounds): the i-th forward of rank s runs chunk s + K ((i // P) mod v) on microbatch
    P (i // (v P)) + i mod P, so each chunk takes P microbatches in turn; the j-th
    backward runs chunk s + K (v - 1 - (j // P) mod v) on the same microbatch formula of
    j, the chunks in reverse. Rank s warms up with min((v - 1) P + 2 (K - 1 - s), v M)
    forwards, then alternates the next forward with the next backward, then drains the
    backwards. A bubble is (K - 1) / v of 1F1B's, for v times as many transfers and
    actions. On rank K - 1 every backward of the last chunk directly follows its forward,
    as in 1F1B (the runtime fuses them). K=2, v=2, M=4 (chunks 0, 2 on rank 0; 1, 3 on
    rank 1), each chunk's forward 1 tick, backward 2 ticks, no transfer time (`simulate`
    draws the same picture):

        tick    0   1   2   3   4   5   6   7   8   9   10  11  12  13
        rank 0  0F0 0F1 2F0 2F1 0F2 .   2B0 2B0 0F3 2B1 2B1 2F2 0B0 0B0
        rank 1  .   1F0 1F1 3F0 3B0 3B0 3F1 3B1 3B1 1F2 1B0 1B0 1F3 1B1

        tick    14  15  16  17  18  19  20  21  22  23  24  25  26
        rank 0  2F3 0B1 0B1 .   2B2 2B2 .   2B3 2B3 0B2 0B2 0B3 0B3
        rank 1  1B1 3F2 3B2 3B2 3F3 3B3 3B3 1B2 1B2 1B3 1B3 .   .

    27 ticks, a bubble of 1/9; 1F1B on two stages of twice a chunk takes 30, a fifth idle.

    Args:
        K: number of stages (ranks), at least 2.
        M: number of microbatches.
        v: virtual stages, at least 2.

    Returns:
        The compute-only schedule, one row per rank; `add_communication(schedule,
        virtual_stages=v)` adds the transfers.

    Raises:
        ValueError: K < 2, v < 2, or M not a multiple of its count of rounds.
    """
    _check_sizes(K, M)
    P = rounds_of(K, M, v)
    schedule: Schedule = {}
    for s in range(K):
        forwards = [_nth(s, K, v, P, i, Kind.FORWARD) for i in range(v * M)]
        backwards = [_nth(s, K, v, P, j, Kind.BACKWARD) for j in range(v * M)]
        warmup = min((v - 1) * P + 2 * (K - 1 - s), v * M)
        actions = forwards[:warmup]
        for j in range(v * M - warmup):
            actions += [forwards[warmup + j], backwards[j]]
        schedule[s] = actions + backwards[v * M - warmup :]
    return schedule


def rounds_of(K: int, M: int, v: int) -> int:
    """P, the microbatches a chunk takes in turn in `virtual`: M / max(1, floor(M / K)).

    Raises:
        ValueError: K < 2 or v < 2, or M not a multiple of max(1, floor(M / K)).
    """
    if K < 2 or v < 2:
        raise ValueError(
            "virtual stages interleave chunks over two or more stages, v >= 2 chunks each. "
            f"Received: K={K}, virtual_stages={v}"
        )
    rounds = max(1, M // K)
    if M % rounds:
        raise ValueError(
            f"with virtual stages M must be a multiple of its rounds, max(1, M // K) = {rounds} "
            f"(each chunk takes M / rounds microbatches in turn), e.g. a multiple of K. "
            f"Received: K={K}, M={M}, virtual_stages={v}"
        )
    return M // rounds


def _nth(s: int, K: int, v: int, P: int, i: int, kind: Kind) -> Action:
    """The i-th forward (or backward) of rank s in `virtual`."""
    local = (i // P) % v
    chunk = s + K * (local if kind is Kind.FORWARD else v - 1 - local)
    return Action(chunk, kind, P * (i // (v * P)) + i % P)


def zero_bubble(K: int, M: int, deferred: Sequence[int] | None = None) -> Schedule:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B with each
    backward split into B (input gradients) and W (weight gradients), W deferred.

    Stage s runs 1F1B's forwards and B's in 1F1B's order (a warm-up of min(K - s - 1, M)
    forwards, then the next forward, if any, and one B per microbatch); with d_s =
    ``deferred[s]``, after its (d_s + 1)-th B on, each B is followed by the W of the
    microbatch d_s before it, and the last d_s W's end its row. In 1F1B the later stages
    idle at the end of a step while the last input gradients travel back to stage 0; here
    a B is about half a backward, so they travel sooner (with any d_s), and stage s fills
    that end with its d_s deferred W's. ZB-H1 defers d_s = s (the default): stage s then
    holds at most min(K, M) microbatches' activations (from F to W), 1F1B's count on its
    stage 0, and d_s = 0 holds 1F1B's own min(K - s, M). Stage 0 computes no input
    gradients: its B is its whole backward and its W is empty (`splits_stage`). K=3, M=4,
    forward 1 tick, backward 2 ticks (B 1, W 1), no transfer time, as `interleaved`'s
    picture, which takes 18 ticks (`simulate` draws it), ZB-H1:

        tick     0  1  2  3  4  5  6  7  8  9 10 11 12 13
        stage 0  F0 F1 F2 .  .  B0 B0 F3 B1 B1 B2 B2 B3 B3
        stage 1  .  F0 F1 .  B0 F2 B1 W0 F3 B2 W1 B3 W2 W3
        stage 2  .  .  F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3

    Args:
        K: number of stages.
        M: number of microbatches.
        deferred: d_s, the W's stage s defers, 0 <= d_s <= s (`check_deferred`); None:
            ZB-H1's s.

    Returns:
        The compute-only schedule; `add_communication` adds the transfers.
    """
    _check_sizes(K, M)
    d = check_deferred(K, deferred)
    schedule: Schedule = {}
    for s in range(K):
        warmup = min(K - s - 1, M)
        actions = [Action(s, Kind.FORWARD, m) for m in range(warmup)]
        for m in range(M):
            if warmup + m < M:
                actions.append(Action(s, Kind.FORWARD, warmup + m))
            actions.append(Action(s, Kind.BACKWARD, m))
            if m >= d[s]:
                actions.append(Action(s, Kind.WEIGHT, m - d[s]))
        actions += [Action(s, Kind.WEIGHT, m) for m in range(max(M - d[s], 0), M)]
        schedule[s] = actions
    return schedule


def check_deferred(K: int, deferred: Sequence[int] | None) -> tuple[int, ...]:
    """The W's each of K stages defers in `zero_bubble`: ``deferred`` checked, or ZB-H1's
    (0, 1, ..., K - 1) for None.

    Example:
        >>> check_deferred(3, None), check_deferred(3, [0, 0, 1])
        ((0, 1, 2), (0, 0, 1))

    Raises:
        ValueError: not K integers with 0 <= deferred[s] <= s.
    """
    if deferred is None:
        return tuple(range(K))
    d = tuple(deferred)
    if len(d) != K or any(
        not isinstance(x, int) or isinstance(x, bool) or not 0 <= x <= s for s, x in enumerate(d)
    ):
        raise ValueError(
            f"deferred must list the W's each of the {K} stages defers, an integer from 0 to "
            f"s on stage s (ZB-H1: {list(range(K))}). Received: deferred={list(d)}"
        )
    return d


def forward_only(K: int, M: int, virtual_stages: int = 1) -> Schedule:
    """Evaluation or data scoring: every stage runs the M forwards in order (with virtual
    stages, in `virtual`'s order of forwards)."""
    _check_sizes(K, M)
    if virtual_stages != 1:
        return {
            s: [a for a in row if a.kind is Kind.FORWARD]
            for s, row in virtual(K, M, virtual_stages).items()
        }
    return {s: [Action(s, Kind.FORWARD, m) for m in range(M)] for s in range(K)}


PIPELINES = ("simple", "interleaved", "zero_bubble")
_forward_only = forward_only  # `build` has a keyword of the same name


def build(
    pipeline: str,
    K: int,
    M: int,
    *,
    forward_only: bool = False,
    virtual_stages: int = 1,
    deferred: Sequence[int] | None = None,
) -> Schedule:
    """The compute schedule named `pipeline` (one of `PIPELINES`); with ``virtual_stages``
    v > 1, `interleaved` only (Megatron-LM's interleaved 1F1B); ``deferred``, the W's
    each stage defers, `zero_bubble` only (None: ZB-H1's)."""
    if pipeline not in PIPELINES:
        raise ValueError(
            f"pipeline must be one of {list(PIPELINES)}. Received: pipeline={pipeline!r}"
        )
    check_virtual(pipeline, virtual_stages)
    if deferred is not None and pipeline != "zero_bubble":
        raise ValueError(
            "deferred (the W's each stage defers) shapes the zero-bubble schedule only. "
            f"Received: pipeline={pipeline!r}, deferred={list(deferred)}"
        )
    if forward_only:
        return _forward_only(K, M, virtual_stages)
    if pipeline == "zero_bubble":
        return zero_bubble(K, M, deferred)
    if pipeline == "simple":
        return simple(K, M)
    return interleaved(K, M, virtual_stages)


def check_virtual(pipeline: str, virtual_stages: int) -> None:
    """Raises ValueError unless `pipeline` runs with ``virtual_stages`` chunks per rank."""
    if (
        not isinstance(virtual_stages, int)
        or isinstance(virtual_stages, bool)
        or virtual_stages < 1
    ):
        raise ValueError(
            f"virtual_stages must be an integer >= 1. Received: virtual_stages={virtual_stages!r}"
        )
    if virtual_stages > 1 and pipeline != "interleaved":
        raise ValueError(
            "virtual stages run Megatron-LM's interleaved 1F1B, pipeline='interleaved'; "
            f"{pipeline!r} runs one chunk per rank (virtual_stages=1). Received: "
            f"pipeline={pipeline!r}, virtual_stages={virtual_stages}"
        )


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


def add_communication(schedule: Schedule, *, virtual_stages: int = 1) -> Schedule:
    """Inserts the transfers around every compute action (a pure pass).

    RF before each F on s > 0 and SF after it on s < K - 1; RB before each B on
    s < K - 1 and SB after it on s > 0; nothing around a W. With ``virtual_stages`` v,
    s is the action's chunk and K v replaces K.

    Raises:
        ScheduleError: if the schedule already holds transfers.
    """
    C = len(schedule) * virtual_stages
    result: Schedule = {}
    for s, actions in schedule.items():
        row: list[Action] = []
        for a in actions:
            if a.kind not in COMPUTE:
                raise ScheduleError(
                    f"add_communication takes a compute-only schedule. Received: action {a}"
                )
            before, after = _transfers(a, C)
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
    chunks = _of_ranks(schedule)
    lines = []
    for s in sorted(schedule):
        row = [str(a).ljust(width) for a in schedule[s]]
        if s in marks:
            index, note = marks[s]
            row = [*row[: index + 1], f"<-- ERROR HERE{note and ' (' + note + ')'}"]
        lines.append(f"{'rank' if chunks else 'stage'} {s}: " + " ".join(row).rstrip())
    return "\n".join(lines)


def validate(schedule: Schedule, M: int, *, virtual_stages: int = 1) -> None:
    """Checks that a schedule runs every microbatch once, in order, without deadlock.

    Compute-only schedules are checked per stage, then through
    `add_communication(schedule)` for the cross-stage order. Schedules with transfers
    must also receive before they compute and send after, match every send with a
    receive, and finish under an abstract execution where sends never block and a
    receive waits for its send. With ``virtual_stages`` v, row s runs chunks s, s + K,
    ..., and every check holds per chunk.

    Raises:
        ScheduleError: naming the problem, with the timeline marked `<-- ERROR HERE`.
    """
    _check_shape(schedule, M, virtual_stages)
    _check_compute(schedule, M, virtual_stages)
    if all(a.kind in COMPUTE for row in schedule.values() for a in row):
        schedule = add_communication(schedule, virtual_stages=virtual_stages)
    _check_transfers(schedule, len(schedule) * virtual_stages)
    _check_deadlock(schedule)


def _of_ranks(schedule: Schedule) -> bool:
    """Whether the rows run chunks of other indices (virtual stages): rows of ranks."""
    return any(a.stage != s for s, row in schedule.items() for a in row)


def _check_sizes(K: int, M: int) -> None:
    if K < 1 or M < 1:
        raise ValueError(f"K (stages) and M (microbatches) must be >= 1. Received: K={K}, M={M}")


def _transfers(a: Action, K: int) -> tuple[list[Action], list[Action]]:
    """The transfers around `a` in a pipeline of K stages (chunks, with virtual stages)."""
    s, m = a.stage, a.microbatch
    if a.kind is Kind.FORWARD:
        return [Action(s, Kind.RECV_F, m)] * (s > 0), [Action(s, Kind.SEND_F, m)] * (s < K - 1)
    if a.kind is Kind.WEIGHT:  # nobody waits for weight gradients: nothing to send
        return [], []
    return [Action(s, Kind.RECV_B, m)] * (s < K - 1), [Action(s, Kind.SEND_B, m)] * (s > 0)


def _fail(schedule: Schedule, message: str, marks: dict[int, tuple[int, str]]) -> ScheduleError:
    return ScheduleError(f"{message}\n{format_schedule(schedule, marks)}")


def _check_shape(schedule: Schedule, M: int, v: int = 1) -> None:
    if M < 1 or sorted(schedule) != list(range(len(schedule))) or not schedule or v < 1:
        raise ScheduleError(
            "a schedule maps stages 0..K-1 to actions, M >= 1 and virtual_stages >= 1. "
            f"Received: stages={sorted(schedule)}, M={M}, virtual_stages={v}"
        )
    K = len(schedule)
    for s, row in schedule.items():
        for index, a in enumerate(row):
            if a.stage not in range(s, K * v, K) or not 0 <= a.microbatch < M:
                where = f"stage={s}" if v == 1 else f"one of the chunks {list(range(s, K * v, K))}"
                raise _fail(
                    schedule,
                    f"every action on {'stage' if v == 1 else 'rank'} {s} must have {where} "
                    f"and microbatch in [0, {M}). Received: {a}",
                    {s: (index, "")},
                )


def _check_compute(schedule: Schedule, M: int, v: int = 1) -> None:
    training = any(a.kind is Kind.BACKWARD for row in schedule.values() for a in row)
    kinds = [Kind.FORWARD, Kind.BACKWARD] if training else [Kind.FORWARD]
    kinds += [Kind.WEIGHT] * splits_backward(schedule)
    K = len(schedule)
    for s, row in schedule.items():
        first: dict[Action, int] = {}
        for index, a in enumerate(row):
            if a in first and a.kind in COMPUTE:
                raise _fail(schedule, f"duplicate action {a}", {s: (index, "")})
            c = a.stage
            if a.kind is Kind.BACKWARD and Action(c, Kind.FORWARD, a.microbatch) not in first:
                raise _fail(schedule, f"backward {a} before its forward", {s: (index, "")})
            if a.kind is Kind.WEIGHT and Action(c, Kind.BACKWARD, a.microbatch) not in first:
                raise _fail(schedule, f"weight gradients {a} before its backward", {s: (index, "")})
            first.setdefault(a, index)
        for c in range(s, K * v, K):
            for kind in kinds:
                for m in range(M):
                    if Action(c, kind, m) not in first:
                        raise _fail(schedule, _missing(Action(c, kind, m)), {})


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
        what = "ranks" if _of_ranks(schedule) else "stages"
        raise _fail(schedule, f"deadlock: {what} {rows} wait on receives that never come", marks)
