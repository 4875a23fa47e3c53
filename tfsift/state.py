"""Process-wide mutable state, all in one place, with a reset for tests.

tfsift keeps a few things per process: the runtime ``tfsift.init`` set up (config,
rank layout, communicators), the ``tfsift.timeline()`` recordings and
``tfsift.partition()`` blocks open now, the step running now, the last sifted
dataset's metrics, and what the runtime's hooks were given (``tfsift.hooks``).
Everything else a step needs is built once into its immutable plan
(``tfsift.pipeline.plan``) and passed down.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any


@dataclasses.dataclass
class ProcessState:
    """The process's mutable state.

    Args:
        runtime: the ``tfsift.parallel.runtime.Runtime`` of the last ``tfsift.init``.
        timelines: open ``tfsift.timeline()`` recordings, innermost last.
        partitions: indices of open ``tfsift.partition()`` blocks, innermost last.
        running_step: the name of the ``@tfsift.step`` function running now, if any.
        sift_metrics: the metrics of the sifted dataset iterated last.
        stage0_wait: the work stage 0 runs while it waits for gradients in training
            steps, a ``tfsift.parallel.comm.IdleWork`` (``tfsift.hooks``).
        reservations: the work reserved on stage 0 of each model, for the planner
            (``tfsift.hooks``), by model (weakly: a model that goes takes its own).
        run_log: the open ``tfsift.pipeline.runlog.RunLog`` (``log_dir``), if any.
        profiles: cost models measured so far, by graph signature
            (``tfsift.planning.profiler.signature``) and calibration, and the seconds of
            a microbatch through the runtime's stage by signature and path (both timed
            once per process: ``profiler._microbatch``).
    """

    runtime: Any = None
    timelines: list[Any] = dataclasses.field(default_factory=list)
    partitions: list[int] = dataclasses.field(default_factory=list)
    running_step: str | None = None
    sift_metrics: Any = None
    stage0_wait: Any = None
    reservations: weakref.WeakKeyDictionary[Any, Any] = dataclasses.field(
        default_factory=weakref.WeakKeyDictionary
    )
    run_log: Any = None
    profiles: dict[str, Any] = dataclasses.field(default_factory=dict)


STATE = ProcessState()


def reset() -> None:
    """Forgets everything: frees the runtime's communicators and clears the open blocks.

    For tests; a training script calls ``tfsift.init`` once instead.
    """
    if STATE.runtime is not None:
        STATE.runtime.close()
    STATE.runtime = None
    STATE.timelines.clear()
    STATE.partitions.clear()
    STATE.running_step = None
    STATE.sift_metrics = None
    STATE.stage0_wait = None
    STATE.reservations.clear()
    if STATE.run_log is not None:
        STATE.run_log.close()
    STATE.run_log = None
    STATE.profiles.clear()
