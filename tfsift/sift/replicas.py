"""What the data-parallel replicas of a sifted dataset agree on, over a communicator of their own.

Every rank of one pipeline reads the same source batches and receives the same
losses (the scorer broadcasts them along the pipeline), so the replicas only need
to agree among themselves. Each stage's ranks of all R replicas form one group
(rank order = replica order); every group computes the same agreements, so no
message ever crosses a pipeline. The communicator is a fresh split of the world,
never the pipeline's, so a sifting collective cannot be matched with a step's
activation message.

Per source round the replicas exchange two things:

- ``allgather``: every replica's scored losses, in replica order, so the loss
  history (and so every percentile) is identical on every rank (with
  ``scores="training"`` also the losses recorded from the training steps, so every
  replica holds the same score table);
- ``agree``: an elementwise MIN of small integer vectors, e.g. [batches ready, more
  data upstream], so every replica yields the same number of batches and all stop
  together when the shortest shard runs out.

Every collective of a round is non-blocking and waited on with the watchdog: a replica
that stalls makes the others end the job after the config's ``timeout`` (naming what
they waited for) instead of waiting forever in an MPI call.

Every replica must call these collectives in the same order. Each exchange sends a
code of its own along (two more values), so that replicas out of step end the job
saying which exchanges met, even where the collectives match in MPI (two agreements on
one value each, say) and would otherwise combine unrelated numbers without an error.
"""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np
from mpi4py import MPI

from tfsift.parallel import watchdog
from tfsift.parallel.runtime import Runtime

# What the replicas exchange, named in messages; an exchange's code is its place here + 1
LOSSES = "the sifting round's losses"
COUNTS = "the sifting round's batch counts"
FULL_BATCHES = "the epoch end's count of full batches"
REMAINDER = "the epoch end's remainder"
HEAD_GRADIENTS = "the sifting round's exit head gradients"
HEAD_WEIGHTS = "the exit head's first weights"
DEFAULT_EXIT = "the default exit replica 0 chose"
RECORDS = "the losses recorded from the training steps"
EXCHANGES = (
    LOSSES,
    COUNTS,
    FULL_BATCHES,
    REMAINDER,
    HEAD_GRADIENTS,
    HEAD_WEIGHTS,
    DEFAULT_EXIT,
    RECORDS,
)


class ReplicaGroup:
    """The ranks that hold this rank's stage in every replica (R of them)."""

    def __init__(self, rt: Runtime) -> None:
        self.replicas = rt.topology.replicas
        self.replica = rt.replica
        self.timeout = rt.config.timeout
        self._rank, self._stage = rt.rank, rt.stage
        # A collective over the world: every rank builds its group at the same point.
        self.comm: Any = rt.world.Split(color=rt.stage, key=rt.replica)

    def allgather(self, values: np.ndarray, what: str = LOSSES) -> list[np.ndarray]:
        """Every replica's ``values`` (float64), in replica order; ``what`` they are, one
        of ``EXCHANGES`` (the round's losses unless told)."""
        if self.replicas == 1:
            return [values]
        mine = np.ascontiguousarray(values, dtype=np.float64)
        code = exchange_code(what)
        sizes = np.empty(2 * self.replicas, np.int64)  # each replica's [size, code]
        self.wait(self.comm.Iallgather(np.array([mine.size, code], np.int64), sizes), what)
        counts, codes = sizes[0::2], sizes[1::2]
        if (codes != code).any():
            self.out_of_step(what, set(codes.tolist()) - {code})
        out = np.empty(int(counts.sum()), np.float64)
        request = self.comm.Iallgatherv(mine, [out, (counts, None), MPI.DOUBLE])
        self.wait(request, what)
        return np.split(out, np.cumsum(counts)[:-1])

    def agree(self, values: list[int], what: str) -> list[int]:
        """The elementwise minimum of ``values`` over the replicas; ``what`` they are, one
        of ``EXCHANGES``."""
        if self.replicas == 1:
            return list(values)
        code = exchange_code(what)
        # the minimum of code and of -code: the least and the greatest code of the replicas
        mine = np.asarray([code, -code, *values], dtype=np.int64)
        out = np.empty_like(mine)
        self.wait(self.comm.Iallreduce(mine, out, op=MPI.MIN), what)
        if out[0] != code or -out[1] != code:
            self.out_of_step(what, {int(out[0]), int(-out[1])} - {code})
        return [int(v) for v in out[2:]]

    def out_of_step(self, what: str, others: set[int] | None) -> NoReturn:
        """Ends the job: this replica's exchange ``what`` met others' (their codes, None
        where a sum hides them) in a collective that matched in MPI."""
        if others is None:
            theirs = "exchange of something else"
        else:
            names = [EXCHANGES[c - 1] if 0 < c <= len(EXCHANGES) else f"code {c}" for c in others]
            theirs = "exchange of " + " and ".join(sorted(names))
        watchdog.abort(
            f"rank {self._rank}'s exchange of {what} with the other replicas of stage "
            f"{self._stage} met another replica's {theirs}: the replicas called sifting's "
            "collectives out of step (a bug in tfsift: please report it with this message)"
        )

    def wait(self, request: Any, what: str) -> None:
        """Waits for the non-blocking collective ``request`` of exchange ``what``, within
        the config's ``timeout``; ends the job where it fails or times out."""
        try:
            done = watchdog.wait([request], self.timeout)
        except MPI.Exception as error:
            # Every replica must call these collectives in the same order. One that took a
            # branch on its own state (eaef77e and dbbe3a2 fixed two) makes this one meet
            # a collective of another size, and MPI reports only "MPI_ERR_IN_STATUS".
            watchdog.abort(
                f"rank {self._rank}'s exchange of {what} with the other "
                f"replicas of stage {self._stage} failed in MPI ({error.Get_error_string()}): "
                "the replicas called sifting's collectives out of step, and this one met a "
                "different collective (a bug in tfsift: please report it with this message)"
            )
        if not done:
            watchdog.abort(
                f"rank {self._rank} waited {self.timeout:g} s for the other replicas of stage "
                f"{self._stage} to exchange {what} (a replica stalled)"
            )


def exchange_code(what: str) -> int:
    """The code exchange ``what`` (one of ``EXCHANGES``) sends along."""
    return EXCHANGES.index(what) + 1
