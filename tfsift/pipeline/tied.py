"""Weights tied across stages: a copy on every stage that calls them, kept equal.

A layer called on stages s1 < s2 < ... (a token embedding reused as the output head) is
held by each of them (``tfsift.planning.graph.ties``). The copies start equal: the owner
s1 sends its values to the other holders when the model is partitioned. They stay equal:
at the end of every training step the holders exchange their gradients of the tied
weights and each adds them up in stage order, so every copy is given the bitwise same
gradient (the sum a single process computes for a layer called twice; where every
holder looks the weight up, their rows joined, as a tape joins lookups) and, with the same
optimizer state, takes the same update. Megatron-LM keeps its input and output
embeddings in step the same way (its "embedding group" allreduce).

Replicas need nothing more: this sum runs within each pipeline, before
``tfsift.allreduce`` averages over the replicas (both are linear). A global reduction over
the model's gradients (a global norm) counts a tied weight once, on its owner
(``counted``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from mpi4py import MPI

from tfsift.parallel import watchdog
from tfsift.planning.graph import Tie


@dataclasses.dataclass(frozen=True)
class TiedGroup:
    """The tied weights one set of stages holds: their positions in this stage's trainable
    variables, and the holders' communicator (ranked by stage: the owner is rank 0)."""

    stages: tuple[int, ...]
    indices: tuple[int, ...]
    comm: Any


@dataclasses.dataclass(frozen=True)
class TiedWeights:
    """This stage's share of the model's tied weights (no groups: nothing tied here).

    Args:
        groups: one per set of stages holding tied weights, that this stage is in.
        counted: per trainable variable of the stage, whether this stage counts it in a
            reduction over the whole model (False for a copy another stage owns).
        timeout: seconds a holder waits for the others' gradients before ending the job.
    """

    groups: tuple[TiedGroup, ...] = ()
    counted: tuple[bool, ...] = ()
    timeout: float = math.inf
    # per group, whether each of its weights is looked up on every holder, learnt at the
    # first exchange (a lookup's gradient is tf.IndexedSlices, one row per lookup)
    _rows: dict[int, tuple[bool, ...]] = dataclasses.field(default_factory=dict, compare=False)

    def __bool__(self) -> bool:
        return bool(self.groups)

    def sum_gradients(self, grads: Sequence[Any]) -> list[Any]:
        """``grads`` (one per trainable variable of the stage) with each tied weight's
        gradient replaced by the sum of every holder's, added in stage order: dense, as a
        tape adds a head's dense gradient to a lookup's; where every holder looks the
        weight up (an embedding shared by an encoder and a decoder), their rows joined in
        stage order, as a tape joins lookups of one table."""
        out = list(grads)
        for g, group in enumerate(self.groups):
            mine = [out[i] for i in group.indices]
            if g not in self._rows:
                self._rows[g] = self._looked_up(group, mine)
            rows = self._rows[g]
            if any(rows):
                totals = self._join(group, mine, rows)
            else:
                arrays = [np.ascontiguousarray(tf.convert_to_tensor(t)) for t in mine]
                totals = [tf.convert_to_tensor(t) for t in self._exchange(group, arrays)]
            for i, total in zip(group.indices, totals, strict=True):
                out[i] = total
        return out

    def _looked_up(self, group: TiedGroup, mine: list[Any]) -> tuple[bool, ...]:
        flags = np.array([isinstance(t, tf.IndexedSlices) for t in mine], np.uint8)
        everyone = self._gather(group, flags.view(np.uint8))
        return tuple(bool(np.all([part[j] for part in everyone])) for j in range(len(mine)))

    def _join(self, group: TiedGroup, mine: list[Any], rows: tuple[bool, ...]) -> list[Any]:
        """The group's totals where some weight is looked up on every holder (``rows``):
        those weights' rows joined, the others summed dense, each in stage order."""
        arrays = _packed(mine, rows)
        # each holder's part: its arrays' element counts (its rows differ), then the arrays
        header = np.array([a.size for a in arrays], np.int64)
        flat = np.concatenate([a.reshape(-1).view(np.uint8) for a in [header, *arrays]])
        holders = [_unpacked(part, header, arrays) for part in self._gather(group, flat)]
        totals, k = [], 0
        for t, joined in zip(mine, rows, strict=True):
            shape = tuple(t.dense_shape.numpy() if isinstance(t, tf.IndexedSlices) else t.shape)
            if joined:
                values = np.concatenate([h[k].reshape(-1, *shape[1:]) for h in holders])
                indices = tf.constant(np.concatenate([h[k + 1] for h in holders]))
                totals.append(tf.IndexedSlices(tf.constant(values), indices, tf.constant(shape)))
                k += 2
            else:
                total = holders[0][k].copy()
                for h in holders[1:]:  # in stage order on every holder: bitwise equal sums
                    total += h[k]
                totals.append(tf.convert_to_tensor(total.reshape(shape)))
                k += 1
        return totals

    def _gather(self, group: TiedGroup, data: np.ndarray) -> list[np.ndarray]:
        """Every holder's bytes ``data`` (of any length), in stage order."""
        sizes = np.zeros(len(group.stages), np.int64)
        self._wait(group, group.comm.Iallgather(np.array([data.size], np.int64), sizes))
        gathered = np.empty(int(sizes.sum()), np.uint8)
        layout = (sizes, None)  # displacements: the sizes' running sums
        self._wait(group, group.comm.Iallgatherv([data, MPI.BYTE], [gathered, layout, MPI.BYTE]))
        return np.split(gathered, np.cumsum(sizes)[:-1])

    def _wait(self, group: TiedGroup, request: Any) -> None:
        if not watchdog.wait([request], self.timeout):
            watchdog.abort(
                f"stage {group.stages[group.comm.Get_rank()]} waited {self.timeout:g} s for "
                f"stages {list(group.stages)} to exchange the gradients of the weights they share"
            )

    def _exchange(self, group: TiedGroup, arrays: list[np.ndarray]) -> list[np.ndarray]:
        mine = np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays])
        gathered = np.empty(len(group.stages) * mine.size, np.uint8)
        self._wait(group, group.comm.Iallgather([mine, MPI.BYTE], [gathered, MPI.BYTE]))
        parts = gathered.reshape(len(group.stages), mine.size)
        totals, offset = [], 0
        for a in arrays:
            views = [part[offset : offset + a.nbytes].view(a.dtype) for part in parts]
            total = views[0].copy()
            for view in views[1:]:  # in stage order on every holder: bitwise equal sums
                total += view
            totals.append(total.reshape(a.shape))
            offset += a.nbytes
        return totals


def _packed(mine: list[Any], rows: tuple[bool, ...]) -> list[np.ndarray]:
    """A holder's gradients as arrays: a looked-up weight's rows and their indices, any
    other weight's dense gradient."""
    arrays: list[np.ndarray] = []
    for t, joined in zip(mine, rows, strict=True):
        if not joined:
            arrays.append(np.ascontiguousarray(tf.convert_to_tensor(t)))
        elif isinstance(t, tf.IndexedSlices):
            arrays += [np.ascontiguousarray(t.values), np.asarray(t.indices, np.int64)]
        else:  # no lookup reached it this step: its zeros, every row once
            arrays += [np.ascontiguousarray(t), np.arange(int(t.shape[0]), dtype=np.int64)]
    return arrays


def _unpacked(part: np.ndarray, header: np.ndarray, like: list[np.ndarray]) -> list[np.ndarray]:
    """A holder's ``_packed`` arrays from its bytes, read by its header of element counts,
    each of the dtype of this holder's ``like``."""
    counts = part[: header.nbytes].view(np.int64)
    pieces, offset = [], header.nbytes
    for a, n in zip(like, counts, strict=True):
        nbytes = int(n) * a.itemsize
        pieces.append(part[offset : offset + nbytes].view(a.dtype))
        offset += nbytes
    return pieces


def tie_stages(
    ties: Sequence[Tie], variables: Sequence[Any], pipe: Any, stage: int, timeout: float
) -> TiedWeights:
    """Joins the holders of each set of tied weights and gives them the owner's values.

    Collective over the pipeline ``pipe`` (every stage calls it with the same ``ties``,
    at partitioning, before other stages' weights are freed). ``variables`` are this
    stage's trainable variables, in order.
    """
    position = {id(v): i for i, v in enumerate(variables)}
    counted = [True] * len(variables)
    by_stages: dict[tuple[int, ...], list[Any]] = {}
    for tie in ties:
        by_stages.setdefault(tie.stages, []).extend(tie.layer.trainable_variables)
        if stage in tie.stages and stage != tie.owner:
            for var in tie.layer.trainable_variables:
                counted[position[id(var)]] = False
    groups = []
    for stages, tied in by_stages.items():  # the same order on every stage: the graph's
        held = stage in stages
        comm = pipe.Split(0 if held else MPI.UNDEFINED, stage)
        if not held:
            continue
        for var in tied:  # the owner's initial values, so that the copies start equal
            value = np.ascontiguousarray(var.numpy())
            comm.Bcast([value.reshape(-1).view(np.uint8), MPI.BYTE], root=0)
            var.assign(value)
        groups.append(TiedGroup(stages, tuple(position[id(v)] for v in tied), comm))
    return TiedWeights(tuple(groups), tuple(counted), timeout)
