"""Collectives: over a stage's replicas on Horovod tensor ops, and over a pipeline's stages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from mpi4py import MPI

from tfsift.parallel import runtime, watchdog


def bounded(rt: runtime.Runtime, what: str) -> Any:
    """A guard that ends the job if the replicas of the caller's stage have not all joined
    the Horovod collective doing ``what`` within the config's ``timeout``."""

    def waited_for() -> str:
        group = rt.topology.dp_group(rt.stage)
        ranks = ", ".join(f"{r} (host {rt.hosts[r]})" if rt.hosts else str(r) for r in group)
        return (
            f"the other replicas of stage {rt.stage} (ranks {ranks}) to {what} (a replica "
            "stalled, or its host cannot be reached)"
        )

    return watchdog.guard(rt.config.timeout, waited_for)


def as_tensors(grads: Sequence[Any], call: str = "tfsift.allreduce(grads)") -> list[Any]:
    """``grads`` as tensors: a ``StepOutput``'s ``accumulate()``, a lookup's
    ``tf.IndexedSlices`` as it is, anything else converted.

    Raises:
        TypeError: one value, not a list (a tensor's rows were taken for gradients), named
            by ``call``, the public function taking them.
    """
    if one_value(grads):
        raise TypeError(
            f"{call} expects a list of gradients, one per trainable variable (a step's "
            "tfsift.gradients result); for one value, pass a list of it. Received: "
            f"{type(grads).__name__}"
        )
    return [_tensor(g) for g in grads]


def one_value(values: Any) -> bool:
    """Whether ``values``, where a list of values is expected, is one value: a tensor or an
    array (whose rows would be taken for values), a string, or anything not a sequence (a
    ``StepOutput``)."""
    return (
        tf.is_tensor(values)
        or hasattr(values, "__array__")
        or not isinstance(values, Sequence)
        or isinstance(values, (str, bytes))
    )


def _tensor(grad: Any) -> Any:
    # autodiff.as_gradient's rule, written here: planning sits above this layer
    if hasattr(grad, "accumulate"):
        return grad.accumulate()
    return grad if isinstance(grad, tf.IndexedSlices) else tf.convert_to_tensor(grad)


def allreduce(grads: Sequence[Any]) -> list[tf.Tensor]:
    """Averages gradients over the caller's data-parallel group in one fused allreduce.

    Args:
        grads: a list of tensors, or of ``StepOutput`` gradients (their ``accumulate()``
            is used).

    Returns:
        The averaged gradients, in the order given. A lookup's ``tf.IndexedSlices`` is
        gathered (every replica's rows, over the replicas), as one process's tape joins
        the whole batch's lookups and as Horovod's ``allreduce`` averages slices.

    Raises:
        TypeError: one value (a tensor, a ``StepOutput``) in place of a list.
    """
    tensors = as_tensors(grads)
    rt = runtime.get()
    if not rt.horovod or rt.topology.replicas == 1 or not tensors:
        return tensors
    import horovod.tensorflow as hvd

    out = list(tensors)
    dense = [i for i, g in enumerate(tensors) if not isinstance(g, tf.IndexedSlices)]
    with bounded(rt, "average the gradients"):
        if dense:
            averaged = hvd.grouped_allreduce(
                [tensors[i] for i in dense], op=hvd.Average, process_set=rt.dp_set
            )
            for i, g in zip(dense, averaged, strict=True):
                out[i] = g
        for i, g in enumerate(tensors):
            if isinstance(g, tf.IndexedSlices):
                values = hvd.allgather(g.values, process_set=rt.dp_set)
                indices = hvd.allgather(g.indices, process_set=rt.dp_set)
                count = tf.cast(rt.topology.replicas, values.dtype)
                out[i] = tf.IndexedSlices(values / count, indices, g.dense_shape)
    return out


def replica_sum(value: float, what: str) -> tuple[float, int]:
    """``value`` summed over the caller's data-parallel group, and the group's size."""
    rt = runtime.get()
    if not rt.horovod or rt.topology.replicas == 1:
        return value, 1
    import horovod.tensorflow as hvd

    with bounded(rt, what):
        total = hvd.allreduce(tf.constant([value], tf.float64), op=hvd.Sum, process_set=rt.dp_set)
    return float(total.numpy()[0]), rt.topology.replicas


def broadcast_variables(variables: Sequence[Any]) -> None:
    """Copies ``variables`` from dp_rank 0 to every replica of the caller's stage.

    Works on Keras 3 variables (it reads ``.value`` and calls ``.assign``; it never
    calls ``var.ref()``, which Keras 3 variables lack).
    """
    rt = runtime.get()
    if not rt.horovod or rt.topology.replicas == 1:
        return
    import horovod.tensorflow as hvd

    root = rt.topology.rank(rt.stage, 0)
    with bounded(rt, "broadcast the variables"):
        for var in variables:
            value = hvd.broadcast(tf.convert_to_tensor(var.value), root, process_set=rt.dp_set)
            var.assign(value)


def pipeline_sum(values: np.ndarray, what: str) -> np.ndarray:
    """The element-wise sum of ``values`` (float64) over the stages of the caller's pipeline.

    Every stage of the pipeline must call it; a stage that waits longer than the config's
    ``timeout`` for the others ends the job, saying it waited for them to ``what``.
    """
    rt = runtime.get()
    values = np.ascontiguousarray(values, np.float64)
    if rt.topology.partitions == 1:
        return values
    pipe, total = rt.pipe_comm, np.empty_like(values)
    if not watchdog.wait([pipe.Iallreduce(values, total, op=MPI.SUM)], rt.config.timeout):
        me = pipe.Get_rank()
        watchdog.abort(
            f"stage {me} ({watchdog.rank_name(pipe, me)}) waited {rt.config.timeout:g} s for "
            f"the other stages of its pipeline to {what}"
        )
    return total


def control_wait(request: Any, what: str) -> None:
    """Waits for ``request``, a nonblocking collective over every rank on the runtime's
    control communicator; a rank that waits longer than the config's ``timeout`` ends the
    job, saying ``rank R waited T s`` and then ``what``."""
    rt = runtime.get()
    if not watchdog.wait([request], rt.config.timeout):
        watchdog.abort(f"rank {rt.rank} waited {rt.config.timeout:g} s {what}")
