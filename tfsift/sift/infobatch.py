"""InfoBatch: at each epoch's start, prune part of the well-learned samples and reweigh the rest.

Qin et al., ICLR 2024, "InfoBatch: Lossless Training Speed Up by Unbiased Dynamic Data
Pruning"; the rule below is that of the reference implementation
(github.com/NUS-HPC-AI-Lab/InfoBatch, ``infobatch/infobatch.py``, ``InfoBatch.prune`` and
``IBSampler.reset``).

Letters: N samples in the score table, S_i the score of sample i (the loss it had when
it was last trained; NaN for a sample never scored), S̄ the mean of the finite scores,
W = {i : S_i < S̄} the well-learned samples, r = ``prune``, E = ``epochs``, δ =
``anneal``. At the start of each pruning epoch:

    keep k = floor((1 - r) |W|) of W, drawn uniformly without replacement, with weight
    1 / (1 - r); keep every other sample (S_i >= S̄, or never scored) with weight 1.

Epoch e (1 the first) prunes iff e > 1 and e - 1 < (1 - δ) E: never in the first epoch
(no sample has a score yet; the reference starts every score at 3, so none is below the
mean) nor in the last δ E epochs, which train on everything with weight 1. (The
reference prunes while e - 1 <= (1 - δ) E, so where (1 - δ) E is a whole number it
prunes one epoch more than its stated last-δ fraction; this module follows the paper.)

The weights make the expected gradient over an epoch the full data's: a sample of W is
kept with probability 1 - r and then counts 1 / (1 - r) times. Everything is pure NumPy;
``tfsift.sift.transform`` applies the epoch's plan to the samples as they stream by,
recognised by their keys (``tfsift.sift.stale``).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from tfsift.sift.selection import FloatArray, Selection
from tfsift.sift.stale import find_sorted

if TYPE_CHECKING:
    from tfsift.sift.config import SiftConfig


def prunes(epoch: int, epochs: int, anneal: float) -> bool:
    """Whether epoch ``epoch`` (1 the first) prunes, of a run of ``epochs`` annealed over
    its last ``anneal`` fraction.

    Example:
        >>> [prunes(e, 8, 0.125) for e in range(1, 10)]
        [False, True, True, True, True, True, True, False, False]
    """
    return epoch > 1 and epoch - 1 < round((1 - anneal) * epochs, 9)


def warn_past_the_run(epoch: int, epochs: int) -> None:
    """Logs, once, that a dataset sifted for ``epochs`` epochs is iterated for one more: its
    anneal came before the run's end, a silent change of schedule otherwise."""
    if epoch == epochs + 1:
        logging.getLogger("tfsift").warning(
            "policy='infobatch' was given epochs=%d and is iterated for epoch %d: it prunes in "
            "no epoch past them and stopped pruning before the run's end; give SiftConfig the "
            "epochs you train",
            epochs,
            epoch,
        )


def pruning_epochs(config: SiftConfig) -> int:
    """How many of ``config.epochs`` epochs prune (``policy="infobatch"``).

    Example:
        >>> from tfsift.sift.config import SiftConfig
        >>> config = SiftConfig(policy="infobatch", epochs=8)
        >>> pruning_epochs(config), pruning_epochs(config.replace(epochs=1))
        (6, 0)
    """
    assert config.epochs is not None  # SiftConfig checks it for infobatch
    return sum(prunes(e, config.epochs, config.anneal) for e in range(1, config.epochs + 1))


def infobatch_keep(scores: npt.ArrayLike, prune: float, rng: np.random.Generator) -> Selection:
    """The samples InfoBatch keeps of a table of ``scores`` (NaN: never scored), with
    their keep probabilities: 1 - ``prune`` for those drawn from below the mean, else 1
    (so the importance weight 1 / P is InfoBatch's).

    Example:
        >>> kept = infobatch_keep([1.0, 2.0, 6.0, float("nan")], 0.5, np.random.default_rng(0))
        >>> kept.indices.tolist(), kept.probs.tolist()
        ([1, 2, 3], [0.5, 1.0, 1.0])
    """
    array = np.asarray(scores, dtype=np.float64).reshape(-1)
    finite = np.isfinite(array)
    well = np.zeros(len(array), bool)
    if finite.any():
        well[finite] = array[finite] < array[finite].mean()
    members = np.flatnonzero(well)
    k = math.floor(round((1 - prune) * len(members), 9))
    drawn = rng.choice(members, size=k, replace=False) if len(members) else members
    kept = ~well
    kept[drawn] = True
    probs = np.where(well, 1.0 - prune, 1.0)
    indices = np.flatnonzero(kept)
    return Selection(indices.astype(np.int64), probs[indices])


class InfoBatchPolicy:
    """The plan of the current epoch: which sample keys are pruned and which reweighted.

    Example:
        >>> policy = InfoBatchPolicy(prune=0.5, anneal=0.125, epochs=8, seed=0)
        >>> keys, scores = np.array([10.0, 11.0, 12.0, 13.0]), np.array([1.0, 1.0, 5.0, 9.0])
        >>> policy.begin_epoch(2, keys, scores)
        >>> chosen = policy.select_keys(np.array([13.0, 10.0, 11.0, 99.0]))
        >>> chosen.indices.tolist(), chosen.probs.tolist()
        ([0, 2, 3], [1.0, 0.5, 1.0])
    """

    needs_logits = False

    def __init__(self, prune: float, anneal: float, epochs: int, seed: int = 0) -> None:
        self.prune, self.anneal, self.epochs, self.seed = prune, anneal, epochs, seed
        self._pruned = np.empty(0, np.float64)  # sorted keys left out this epoch
        self._boosted = np.empty(0, np.float64)  # sorted keys kept with 1 / (1 - prune)

    def begin_epoch(self, epoch: int, keys: FloatArray, scores: FloatArray) -> None:
        """Draws epoch ``epoch``'s plan from the score table (``keys``, ``scores``, NaN
        where unscored), with ``default_rng([seed, epoch])``: the same on every replica."""
        self._pruned = self._boosted = np.empty(0, np.float64)
        if not prunes(epoch, self.epochs, self.anneal):
            return
        kept = infobatch_keep(scores, self.prune, np.random.default_rng([self.seed, epoch]))
        left = np.ones(len(keys), bool)
        left[kept.indices] = False
        self._pruned = np.sort(keys[left])
        self._boosted = np.sort(keys[kept.indices[kept.probs < 1.0]])  # drawn from below the mean

    def select_keys(self, keys: FloatArray) -> Selection:
        """The samples of a round (by key) the plan keeps, with their keep probabilities;
        a key the plan does not know (never scored) is kept with probability 1."""
        # searched in the plan's sorted keys: np.isin would sort them again every round
        kept = np.flatnonzero(~find_sorted(self._pruned, keys)[1])
        boosted = find_sorted(self._boosted, keys[kept])[1]
        return Selection(kept.astype(np.int64), np.where(boosted, 1.0 - self.prune, 1.0))

    def metrics(self) -> dict[str, float]:
        """How many samples this epoch's plan prunes and reweighs."""
        return {"pruned": float(len(self._pruned)), "reweighted": float(len(self._boosted))}

    def state(self) -> dict[str, Any]:
        """The epoch's plan, for a checkpoint."""
        return {"pruned": self._pruned.copy(), "boosted": self._boosted.copy()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores the plan ``state`` holds."""
        self._pruned = np.asarray(state["pruned"], np.float64)
        self._boosted = np.asarray(state["boosted"], np.float64)
