"""Keras metrics updated inside a ``@tfsift.step``: one value on every rank.

Only the last stage runs the part of a step function after the model call (the head),
so a metric updated there changes on that rank alone; stage 0 runs the function only up
to the model call and middle stages never run it. tfsift makes every rank agree:

1. **Which variables.** At a step function's first call every rank runs it once on
   zeros (the probe, ``tfsift.pipeline.step``), to its end, inside a recording
   ``keras.StatelessScope``: every Keras variable it assigns (a metric's ``total`` and
   ``count``, a confusion matrix, ...) is listed in the order of its first assignment
   and nothing is applied, so the probe never counts its zeros either (the model call
   inside leaves the scope: it partitions the model). The same code runs on every rank,
   so the lists agree; the stages compare them and fail together if not. The model's
   own variables are left out: they belong to the stages.
2. **After every step**, with ``old`` a variable's value before the step and
   ``Δr = new - old`` its change on the last stage of replica r::

       stage K-1 of replica r sets
         old + (Δ0 + ... + Δ(R-1))        aggregation "sum" (every keras.metrics state)
         old + (Δ0 + ... + Δ(R-1)) / R    "mean"
         old + Δ0                         "only_first_replica"
         old + Δr (unchanged)             "none": replica-local (never a metric's)
       and broadcasts it along the pipeline; stages 0 .. K-2 assign it.

   The rule is the variable's own ``aggregation``, as tf.distribute reads Keras metrics
   (their variables are ``synchronization="on_read"``, aggregated by sum). Every state
   of ``keras.metrics`` is a sum over samples, so summing the replicas' changes gives the
   metric over all replicas' samples: exactly for integer-valued states (counts, correct
   predictions), and for real-valued sums up to float rounding (the additions run in
   another order than in one process; the changes are summed in float64). A metric
   variable with ``aggregation="none"`` cannot be combined: with R > 1 the first call
   raises on every rank, naming it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from tfsift.parallel import collectives, runtime
from tfsift.parallel.comm import allgather_object, bcast_from_stage
from tfsift.planning import keras_internals

if TYPE_CHECKING:
    from tfsift.model import DistributedModel

log = logging.getLogger("tfsift")
Allreduce = Callable[[list[np.ndarray]], list[np.ndarray]]
COMBINED = ("sum", "mean", "only_first_replica")  # the aggregations replicas can combine


@dataclasses.dataclass(frozen=True)
class SharedMetrics:
    """The Keras variables a step function updates besides the model, kept equal on every
    rank of the pipeline and combined over the replicas (see the module docstring).

    Example:
        >>> shared = find(assigned, model, runtime.get(), "forward_backward")  # at plan time
        >>> with shared.sharing():  # around every call of the step (tfsift.pipeline.step)
        ...     outputs = run(plan, fn, microbatches)

    Args:
        variables: the variables, in the order of their first assignment.
        K, s, R, replica: stages, this rank's stage, replicas, this rank's replica.
        pipe: the pipeline's mpi4py communicator (ranked by stage).
        allreduce: sums arrays over the last stage's replicas (only called when R > 1).
        timeout: the config's ``timeout``: how long a stage waits for the values.
    """

    variables: tuple[Any, ...] = ()
    K: int = 1
    s: int = 0
    R: int = 1
    replica: int = 0
    pipe: Any = None
    allreduce: Allreduce | None = None
    timeout: float = 600.0  # seconds a stage waits for the last stage's values

    @property
    def aggregations(self) -> list[str]:
        """Each variable's Keras ``aggregation``, in order."""
        return [aggregation(v) for v in self.variables]

    @property
    def combines(self) -> bool:
        """Whether the last stage combines some variables over replicas after a step."""
        return self.R > 1 and any(a in COMBINED for a in self.aggregations)

    @contextlib.contextmanager
    def sharing(self) -> Iterator[None]:
        """Around one step: afterwards every rank holds the shared values (not if it raised)."""
        if not self.variables:
            yield
            return
        last = self.s == self.K - 1
        before = values(self.variables) if last and self.combines else None
        yield
        mine = values(self.variables) if last else None
        if mine is not None and before is not None:
            assert self.allreduce is not None
            mine = combine(mine, before, self.aggregations, self.replica, self.R, self.allreduce)
            assign(self.variables, mine)
        if self.K > 1:
            shared = self._broadcast(mine)
            if not last:
                assign(self.variables, shared)

    def _broadcast(self, mine: list[np.ndarray] | None) -> list[np.ndarray]:
        """The last stage's values on every stage, without blocking: a stage that waits
        longer than the config's ``timeout`` ends the job, naming the last stage."""
        if mine is None:
            arrays = [np.empty_like(a) for a in values(self.variables)]  # shapes, dtypes
        else:
            arrays = [np.ascontiguousarray(a) for a in mine]
        bcast_from_stage(self.pipe, arrays, self.K - 1, self.timeout, "step's metric values")
        return arrays


NONE = SharedMetrics()  # a step that updates nothing, or runs on one rank


def find(
    assigned: Sequence[Any], model: DistributedModel, rt: runtime.Runtime, name: str
) -> SharedMetrics:
    """What to share of the variables step function ``name``'s probe ``assigned``.

    Called by every rank of the pipeline at the step function's first call (it compares
    the lists along the pipeline).

    Raises:
        RuntimeError: the ranks of the pipeline found different variables, or a metric
            variable cannot be combined over replicas (``aggregation="none"``).
    """
    K, R = rt.topology.partitions, rt.topology.replicas
    if K == 1 and R == 1:
        return NONE
    part = model.partitioned
    assert part is not None, "the probe partitions the model"
    owned = {id(v) for v in part.graph.stage(0, len(part.graph)).variables()}  # every stage's
    found = [v for v in assigned if id(v) not in owned]
    if K > 1:
        check_agree(allgather_object(rt.pipe_comm, describe(found)), name)
    check_combinable(found, R, name)
    local = [v.path for v in found if aggregation(v) not in COMBINED]
    if R > 1 and local and rt.rank == 0:
        log.warning(
            "the @tfsift.step function %r updates %s, whose aggregation is 'none': each "
            "replica keeps its own value (shared along its pipeline). Give it "
            "aggregation='sum', 'mean' or 'only_first_replica' to combine the replicas",
            name,
            ", ".join(map(repr, local)),
        )
    return SharedMetrics(
        variables=tuple(found),
        K=K,
        s=rt.stage,
        R=R,
        replica=rt.replica,
        pipe=rt.pipe_comm,
        timeout=rt.config.timeout,
        allreduce=replica_sum(rt) if R > 1 else None,
    )


@contextlib.contextmanager
def recording() -> Iterator[keras_internals.AssignmentRecorder]:
    """Keras variable assignments inside are listed and dropped (the probe's run on zeros)."""
    with keras_internals.AssignmentRecorder() as recorder:
        yield recorder


def stateful(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` run outside any ``recording`` block (the model call, which partitions)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        with keras_internals.stateful():
            return call(*args, **kwargs)

    return run


def aggregation(variable: Any) -> str:
    """How replicas combine ``variable`` ("none" for a variable without the attribute)."""
    return str(getattr(variable, "aggregation", "none") or "none")


def is_metric_state(variable: Any) -> bool:
    """Keras creates every metric variable replica-local, aggregated when read."""
    return getattr(variable, "synchronization", None) == "on_read"


def describe(variables: Sequence[Any]) -> list[str]:
    """What must match on every rank: each variable's path, shape, dtype and aggregation."""
    return [f"{v.path} {tuple(v.shape)} {v.dtype} aggregation={aggregation(v)}" for v in variables]


def check_agree(lists: Sequence[list[str]], name: str) -> None:
    """Every stage found the same variables (else every stage raises the same error)."""
    if all(found == lists[-1] for found in lists):
        return
    seen = "; ".join(f"stage {s}: [{', '.join(found)}]" for s, found in enumerate(lists))
    raise RuntimeError(
        f"the stages found different Keras variables updated by the @tfsift.step function "
        f"{name!r}, so its metrics cannot be shared along the pipeline; it must update the "
        f"same metrics on every rank (no branch on the rank or stage). Received: {seen}"
    )


def check_combinable(variables: Sequence[Any], R: int, name: str) -> None:
    """With replicas, every metric variable must say how to combine them."""
    if R == 1:
        return
    bad = [v.path for v in variables if is_metric_state(v) and aggregation(v) not in COMBINED]
    if bad:
        received = ", ".join(f"{path!r} (aggregation='none')" for path in bad)
        raise RuntimeError(
            f"the @tfsift.step function {name!r} updates metric variables that its {R} "
            f"replicas cannot combine: a metric variable's aggregation must be one of "
            f"{', '.join(map(repr, COMBINED))} (Metric.add_variable's default is 'sum'). Create "
            "them so, or return what the metric needs from the step and update the metric "
            "after it, e.g. metric.update_state(labels, predictions.concat()) (that sees this "
            f"replica's samples only). Received: {received}"
        )


def combine(
    new: Sequence[np.ndarray],
    old: Sequence[np.ndarray],
    aggregations: Sequence[str],
    replica: int,
    R: int,
    allreduce: Allreduce,
) -> list[np.ndarray]:
    """This replica's ``new`` values with every replica's changes since ``old`` combined.

    ``allreduce`` sums a list of arrays over the R replicas (one call for all variables).

    Example:
        >>> combine([np.float32(5)], [np.float32(2)], ["sum"], 0, 2, lambda xs: [x * 2 for x in xs])
        [np.float32(8.0)]
    """
    at = [i for i, a in enumerate(aggregations) if a in COMBINED]
    if not at:
        return list(new)
    changes = []
    for i in at:
        change = _wide(new[i]) - _wide(old[i])
        first_only = aggregations[i] == "only_first_replica" and replica != 0
        changes.append(np.zeros_like(change) if first_only else change)
    out = list(new)
    for i, total in zip(at, allreduce(changes), strict=True):
        total = total / R if aggregations[i] == "mean" else total
        out[i] = np.asarray(_wide(old[i]) + total).astype(np.asarray(new[i]).dtype)
    return out


def values(variables: Sequence[Any]) -> list[np.ndarray]:
    return [np.asarray(v.numpy()) for v in variables]


def assign(variables: Sequence[Any], new: Sequence[np.ndarray]) -> None:
    for variable, value in zip(variables, new, strict=True):
        variable.assign(value)


def _wide(value: np.ndarray) -> np.ndarray:
    """float64 for floats, int64 for integers: the changes of R replicas add up exactly."""
    value = np.asarray(value)
    return value.astype(np.float64 if np.issubdtype(value.dtype, np.floating) else np.int64)


def replica_sum(rt: runtime.Runtime) -> Allreduce:
    """Sums over the caller's data-parallel group (the last stage's replicas), in one call."""
    dp_set = rt.dp_set

    def allreduce(arrays: list[np.ndarray]) -> list[np.ndarray]:
        import horovod.tensorflow as hvd

        tensors = [tf.constant(a) for a in arrays]
        with collectives.bounded(rt, "sum the metrics' states"):
            summed = hvd.grouped_allreduce(tensors, op=hvd.Sum, process_set=dp_set)
        return [np.asarray(t.numpy()) for t in summed]

    return allreduce
