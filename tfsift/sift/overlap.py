"""When stage 0 may score during a training step: only where it would otherwise wait.

With ``SiftConfig(overlap=True)`` stage 0 scores the next round one source batch (a
*unit*) at a time while it waits for gradients from the later stages. A unit that is
still running when the gradients arrive delays stage 0's next backward, and with it
every later stage: on a pipeline whose stage 0 is its slowest, its waits are shorter
than a unit and overlapping costs more than scoring at the round (measured in
``docs/benchmarks.md``). So a unit starts only if it is expected to end before the
gradients arrive: ``WaitModel`` remembers how long each microbatch's receive waited in
the last steps and how long a unit of each kind takes. The first unit of a round also
applies the exit head's update (``tfsift.sift.exit_head``): when that update learnt the
whole round at once it took 3.5x a plain unit, and one estimate for both let it start
where only a plain unit fits and then kept plain units out of waits they fit, so each
kind has its own (now about 1.25x, ``scripts/bench_exit_calls.py``).

Pure Python, no TensorFlow or MPI: the receive reports what it saw (``arrived``) and
asks before each unit (``allows``).
"""

from __future__ import annotations

SMOOTHING = 0.5  # weight of the newest observation in the running estimates
MARGIN = 0.8  # a unit may start if it ends within this fraction of the expected wait
BATCH = "batch"  # a unit that scores one source batch
UPDATE = "update"  # one that also applies the exit head's update first


class WaitModel:
    """Expected waits per microbatch and the cost of a unit of each kind, from observations.

    Example:
        >>> waits = WaitModel()
        >>> waits.allows(3, elapsed=0.0)  # nothing known: do not risk a delay
        False
        >>> waits.arrived(3, waited=0.010, exact=True)
        >>> waits.allows(3, elapsed=0.0)  # a unit's cost is unknown: one may try
        True
        >>> waits.unit(0.004)
        >>> waits.allows(3, elapsed=0.002), waits.allows(3, elapsed=0.005)
        (True, False)
        >>> waits.unit(0.009, UPDATE)
        >>> waits.allows(3, elapsed=0.0, kind=UPDATE)  # 9 ms > 0.8 x 10 ms
        False
    """

    def __init__(self) -> None:
        self.expected: dict[int, float] = {}  # seconds the receive of microbatch m waits
        self.costs: dict[str, float] = {}  # seconds one unit of each kind takes
        self.last = BATCH  # the kind of the last unit

    def allows(self, microbatch: int, elapsed: float, kind: str = BATCH) -> bool:
        """Whether a unit of ``kind`` started ``elapsed`` seconds into the wait for
        ``microbatch`` is expected to end before the message arrives."""
        expected = self.expected.get(microbatch, 0.0) * MARGIN
        return elapsed + self.costs.get(kind, 0.0) < expected

    def room(self) -> float:
        """Seconds stage 0 is expected to wait for gradients per step: the expected waits
        of every microbatch seen. Against the cost of the units a step needs (a source
        batch per unit, 1 / kept fraction per step), it says how much scoring can hide."""
        return sum(self.expected.values())

    def unit_cost(self) -> float:
        """Seconds a unit takes: a plain one, or where none has run yet (rounds of one
        source batch) the round's first, which also applies the head's update; 0 before
        any unit ran."""
        return self.costs.get(BATCH, self.costs.get(UPDATE, 0.0))

    def arrived(self, microbatch: int, waited: float, exact: bool) -> None:
        """The receive of ``microbatch`` ended ``waited`` seconds after it was posted.

        ``exact``: no unit was running when the message arrived, so ``waited`` is how
        long it took to come. Otherwise it came during the last unit, at an unknown time
        before ``waited``: the wait is taken as half a unit before that.
        """
        if not exact:
            waited = max(waited - 0.5 * self.costs.get(self.last, 0.0), 0.0)
        self.expected[microbatch] = _smoothed(self.expected.get(microbatch), waited)

    def unit(self, seconds: float, kind: str = BATCH, batches: float = 1.0) -> None:
        """A call took ``seconds`` for ``batches`` units: the first of ``kind``, the
        others plain batches (what no wait had room for is scored in one call at the
        round; timing it too lets an estimate that a trace inflated come down)."""
        plain = self.costs.get(BATCH)
        if kind == BATCH:
            self.costs[BATCH] = _smoothed(plain, seconds / batches)
        elif batches == 1 or plain is not None:
            own = max(seconds - (batches - 1) * (plain or 0.0), 0.0)
            self.costs[kind] = _smoothed(self.costs.get(kind), own)
        self.last = kind


def _smoothed(old: float | None, new: float) -> float:
    """The running estimate after observing ``new`` (the first observation as it is)."""
    return new if old is None else SMOOTHING * new + (1 - SMOOTHING) * old
