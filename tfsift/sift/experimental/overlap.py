"""When stage 0 may score during a training step: only where it would otherwise wait.

With ``SiftConfig(overlap=True)`` stage 0 scores the next round in *units*, compiled
calls of one or more source batches, while it waits for gradients from the later
stages. A unit that is still running when the gradients arrive delays stage 0's next
backward, and with it every later stage: on a pipeline whose stage 0 is its slowest,
its waits are shorter than a unit and overlapping costs more than scoring at the round
(measured in ``docs/benchmarks-log.md``). So a unit starts only if it is expected to end
before the gradients arrive: ``WaitModel`` remembers how long each microbatch's receive
waited in the last steps and how long calls of each size and kind took.

A unit takes as many source batches as the wait has room for: most of a small call's
cost is fixed (one source batch took 0.38 ms to score, eight in one call 1.35 ms,
docs/benchmarks-log.md, Early-exit scoring calls), so one call of several batches costs
less than as many calls of one, and what no wait had room for is scored at the round,
where every stage waits for it (with ``SiftConfig(leftover="keep")`` it is kept unscored instead).
The first unit of a round also applies the exit head's update
(``tfsift.sift.experimental.exit_head``): when that update learnt the whole round at once it took
3.5x a plain unit, and one estimate for both let it start where only a plain unit fits
and then kept plain units out of waits they fit, so each kind has its own estimates. A
third kind takes the head's gradient sums after a round's last unit (``FINISH``,
``ExitHead.finish_early``), work stage 0 otherwise did after the losses' broadcast while
the other stages waited for it in the next step.

Pure Python, no TensorFlow or MPI: the receive reports what it saw (``arrived``) and
asks before each unit how many batches it may take (``batches``).
"""

from __future__ import annotations

SMOOTHING = 0.5  # weight of the newest observation in the running estimates
MARGIN = 0.8  # a unit may start if it ends within this fraction of the expected wait
BATCH = "batch"  # a unit that scores source batches
UPDATE = "update"  # one that also applies the exit head's update first
FINISH = "finish"  # the exit head's gradient sums taken, after a round's last unit


class WaitModel:
    """Expected waits per microbatch and the cost of a call of each size and kind.

    Example:
        >>> waits = WaitModel()
        >>> waits.batches(3, elapsed=0.0, most=8)  # nothing known: do not risk a delay
        0
        >>> waits.arrived(3, waited=0.010, exact=True)
        >>> waits.batches(3, elapsed=0.0, most=8)  # a call's cost is unknown: one may try
        1
        >>> waits.unit(0.002)  # a call of one batch took 2 ms; of two at most 4 ms then
        >>> waits.batches(3, elapsed=0.0, most=8), waits.batches(3, elapsed=0.003, most=8)
        (3, 2)
        >>> waits.unit(0.005, batches=4)  # four in one call took 5 ms
        >>> waits.batches(3, elapsed=0.0, most=8)  # 8 x 5 / 4 = 10 ms > 0.8 x 10 ms
        6
        >>> waits.batches(3, elapsed=0.0, most=8, kind=UPDATE)  # its cost is unknown
        1
    """

    def __init__(self) -> None:
        self.expected: dict[int, float] = {}  # seconds the receive of microbatch m waits
        # seconds one call of k source batches took, per kind
        self.costs: dict[str, dict[int, float]] = {BATCH: {}, UPDATE: {}, FINISH: {}}
        self.last = (BATCH, 1)  # the kind and size of the last call

    def batches(self, microbatch: int, elapsed: float, most: int, kind: str = BATCH) -> int:
        """How many source batches (up to ``most``) a call of ``kind`` started ``elapsed``
        seconds into the wait for ``microbatch`` may score and still be expected to end
        before the message arrives; 0 if none."""
        room = self.expected.get(microbatch, 0.0) * MARGIN - elapsed
        if not self.costs[kind]:
            return 1 if room > 0 else 0
        fits = [k for k in range(1, most + 1) if self.cost(k, kind) < room]
        return max(fits, default=0)

    def cost(self, k: int, kind: str = BATCH) -> float:
        """The expected seconds of a call of ``k`` source batches (0 if none of ``kind``
        was seen): the least of the bounds the sizes seen give, since a call of more
        batches costs more and one of fewer at least its share (a call's cost is a fixed
        part and a part per batch): cost(k) <= cost(j) for j >= k, cost(j) * k / j for j < k.
        """
        seen = self.costs[kind]
        bounds = [c if j >= k else c * k / j for j, c in seen.items()]
        return min(bounds, default=0.0)

    def unit_cost(self) -> float:
        """Seconds a call of one source batch takes: a plain one, or where none has run
        (rounds of one source batch) the round's first, which also applies the head's
        update; 0 before any call."""
        return self.cost(1, BATCH if self.costs[BATCH] else UPDATE)

    def room(self) -> float:
        """Seconds stage 0 is expected to wait for gradients per step: the expected waits
        of every microbatch seen. Against the cost of the batches a step needs (1 / kept
        fraction source batches), it says how much of the scoring can hide."""
        return sum(self.expected.values())

    def arrived(self, microbatch: int, waited: float, exact: bool) -> None:
        """The receive of ``microbatch`` ended ``waited`` seconds after it was posted.

        ``exact``: no unit was running when the message arrived, so ``waited`` is how
        long it took to come. Otherwise it came during the last unit, at an unknown time
        before ``waited``: the wait is taken as half a unit before that.
        """
        if not exact:
            kind, k = self.last
            waited = max(waited - 0.5 * self.cost(k, kind), 0.0)
        self.expected[microbatch] = _smoothed(self.expected.get(microbatch), waited)

    def unit(self, seconds: float, kind: str = BATCH, batches: int = 1) -> None:
        """A call of ``kind`` scored ``batches`` source batches in ``seconds`` (in a
        wait, or at the round what no wait had room for: timing that too tells the cost
        of larger calls)."""
        seen = self.costs[kind]
        seen[batches] = _smoothed(seen.get(batches), seconds)
        self.last = (kind, batches)


def _smoothed(old: float | None, new: float) -> float:
    """The running estimate after observing ``new`` (the first observation as it is)."""
    return new if old is None else SMOOTHING * new + (1 - SMOOTHING) * old
