"""The hooks the runtime offers to work outside its core: stage 0's waits, and room for them.

The pipeline's core knows nothing of sifting. A feature that runs work of its own on
stage 0 during training (``tfsift.sift.experimental``: early-exit scoring with
``overlap``) reaches the runtime through these two hooks, and only through them:

- ``reserve_stage0(model, reservation)``, before the model's first step: when
  ``DistributedModel.partition_model`` cuts ``model``, the planner leaves stage 0 room
  for ``reservation.forwards`` source batches of its own forwards per step, ranking the
  partitions by ``reservation.step_time`` (``Reservation``).
- ``offer_stage0_wait(work)``: while stage 0 waits for a microbatch's gradients in a
  training step, the executor hands the wait to ``work`` (a
  ``tfsift.parallel.comm.IdleWork``: ``run(microbatch, waited)`` while nothing has
  arrived, ``arrived(...)`` once it has); ``None`` withdraws it.

Both are kept in the process state (``tfsift.state``) and cleared by ``state.reset()``;
``tests/tfsift/test_hooks.py`` pins them.

Example:
    >>> reserve_stage0(model, Reservation(forwards=2.0, step_time=sifted_step_time))
    >>> stage0_reservation(model).forwards
    2.0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tfsift.state import STATE

# What a reservation ranks partitions by: (costs, partition, M, pipeline=, scoring=, call=)
# -> seconds per step, e.g. ``partitioner.experimental.scoring.sifted_step_time``.
StepTime = Callable[..., float]


@dataclasses.dataclass(frozen=True)
class Reservation:
    """Work stage 0 will run during each training step, for the planner to leave room for.

    Args:
        forwards: source batches of stage 0's forwards per step (each M microbatches).
        step_time: ranks a partition with that work: ``step_time(costs, partition, M,
            pipeline=..., scoring=S, call=c)``, S the forwards per step in microbatches
            and c a call's fixed seconds.
        call_seconds: times one call's fixed cost on rank 0 when it plans, given the traced
            graph and a source batch's rows (None: not timed, 0).
    """

    forwards: float
    step_time: StepTime
    call_seconds: Callable[[Any, int], float] | None = None


def reserve_stage0(model: Any, reservation: Reservation | None) -> None:
    """Asks the planner to leave stage 0 of ``model`` room for ``reservation`` (None: none).
    Read once, when the model is partitioned at its first step."""
    if reservation is None:
        STATE.reservations.pop(model, None)
    else:
        STATE.reservations[model] = reservation


def stage0_reservation(model: Any) -> Reservation | None:
    """What was reserved on stage 0 of ``model``, if anything (read by the planner)."""
    return STATE.reservations.get(model)


def offer_stage0_wait(work: Any) -> None:
    """Hands stage 0's waits for gradients to ``work`` (an ``IdleWork``; None: nobody)."""
    STATE.stage0_wait = work


def stage0_wait() -> Any:
    """The ``IdleWork`` stage 0's waits for gradients go to, or None (read by the executor)."""
    return STATE.stage0_wait
