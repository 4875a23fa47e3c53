"""When stage 0 may score during a training step: only where it would otherwise wait.

With ``SiftConfig(overlap=True)`` stage 0 scores the next round one source batch (a
*unit*) at a time while it waits for gradients from the later stages. A unit that is
still running when the gradients arrive delays stage 0's next backward, and with it
every later stage: on a pipeline whose stage 0 is its slowest, its waits are shorter
than a unit and overlapping costs more than scoring at the round (measured in
``docs/benchmarks.md``). So a unit starts only if it is expected to end before the
gradients arrive: ``WaitModel`` remembers how long each microbatch's receive waited in
the last steps and how long a unit takes.

Pure Python, no TensorFlow or MPI: the receive reports what it saw (``arrived``) and
asks before each unit (``allows``).
"""

from __future__ import annotations

SMOOTHING = 0.5  # weight of the newest observation in the running estimates
MARGIN = 0.8  # a unit may start if it ends within this fraction of the expected wait


class WaitModel:
    """Expected waits per microbatch and the cost of a unit of work, from observations.

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
    """

    def __init__(self) -> None:
        self.expected: dict[int, float] = {}  # seconds the receive of microbatch m waits
        self.cost: float | None = None  # seconds one unit takes

    def allows(self, microbatch: int, elapsed: float) -> bool:
        """Whether a unit started ``elapsed`` seconds into the wait for ``microbatch``
        is expected to end before the message arrives."""
        expected = self.expected.get(microbatch, 0.0) * MARGIN
        return elapsed + (self.cost or 0.0) < expected

    def arrived(self, microbatch: int, waited: float, exact: bool) -> None:
        """The receive of ``microbatch`` ended ``waited`` seconds after it was posted.

        ``exact``: no unit was running when the message arrived, so ``waited`` is how
        long it took to come. Otherwise it came during the last unit, at an unknown time
        before ``waited``: the wait is taken as half a unit before that.
        """
        if not exact:
            waited = max(waited - 0.5 * (self.cost or 0.0), 0.0)
        self.expected[microbatch] = _smoothed(self.expected.get(microbatch), waited)

    def unit(self, seconds: float) -> None:
        """One unit of work took ``seconds``."""
        self.cost = _smoothed(self.cost, seconds)


def _smoothed(old: float | None, new: float) -> float:
    """The running estimate after observing ``new`` (the first observation as it is)."""
    return new if old is None else SMOOTHING * new + (1 - SMOOTHING) * old
