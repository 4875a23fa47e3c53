"""This rank's stage variables keyed by layer path, and loading them from stored arrays."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfsift.checkpoint.paths import variable_keys
from tfsift.model import DistributedModel, Partitioned

Keyed = list[tuple[str, Any]]


def check_model(model: Any, caller: str) -> DistributedModel:
    """``model`` if it is a DistributedModel, else a TypeError naming ``caller``."""
    if not isinstance(model, DistributedModel):
        raise TypeError(
            f"{caller} needs a tfsift.DistributedModel. Received: {type(model).__name__}"
        )
    return model


def partitioned(
    model: DistributedModel,
    inputs: Sequence[tuple[Sequence[int], str]] | None,
    caller: str,
    takes_example: bool = False,
) -> Partitioned:
    """The model's stage, partitioning it first (a collective) for one microbatch of
    ``inputs`` (``(shape, dtype)`` each) when no step has run yet; ``takes_example``: the
    caller takes ``example=``, which its error then offers."""
    if model.partitioned is not None:
        return model.partitioned
    if inputs is None:
        other = ", or pass example=<a batch of model inputs>" if takes_example else ""
        raise ValueError(
            f"{caller} needs the model partitioned, which happens at its first step (the "
            f"first call of a @tfsift.step, fit, evaluate or predict): call it after one{other}. "
            "Received: a model no step has run"
        )
    return model.partition_model([tf.zeros(tuple(shape), dtype) for shape, dtype in inputs])


def example_inputs(example: Any, microbatches: int) -> list[tuple[tuple[int, ...], str]]:
    """``(shape, dtype)`` of one microbatch of the batch ``example`` (a tensor or a list)."""
    leaves = list(example) if isinstance(example, (list, tuple)) else [example]
    found = []
    for leaf in leaves:
        array = tf.convert_to_tensor(leaf)
        shape = (max(1, int(array.shape[0]) // microbatches), *map(int, array.shape[1:]))
        found.append((shape, array.dtype.name))
    return found


def keyed(model: DistributedModel, part: Partitioned) -> Keyed:
    """``(key, variable)`` for every variable of this rank's stage, in the stage's order."""
    keys = variable_keys(model, [gn.operation for gn in part.graph.nodes])
    return [(keys[id(v)], v) for v in part.stage.graph.variables()]


def trainable(model: DistributedModel, part: Partitioned) -> Keyed:
    """``(key, variable)`` for the stage's trainable variables (``model.trainable_variables``)."""
    keys = variable_keys(model, [gn.operation for gn in part.graph.nodes])
    return [(keys[id(v)], v) for v in part.stage.variables]


def local(model: DistributedModel, part: Partitioned) -> Keyed:
    """``(key, variable)`` for the stage's non-trainable variables (BatchNorm statistics, seed
    states): each replica updates its own, so each rank saves its own."""
    keys = variable_keys(model, [gn.operation for gn in part.graph.nodes])
    return [(keys[id(v)], v) for v in part.stage.state_variables]


def owned(variables: Keyed, part: Partitioned) -> Keyed:
    """``variables`` less the copies of tied weights another stage owns (saved once, by
    their owner; every holder restores them from the same key)."""
    if not part.tied:
        return list(variables)
    copies = {
        id(v) for v, mine in zip(part.stage.variables, part.tied.counted, strict=True) if not mine
    }
    return [(key, var) for key, var in variables if id(var) not in copies]


def values(variables: Keyed) -> dict[str, np.ndarray]:
    """The variables' current values by key."""
    return {key: np.asarray(var.numpy()) for key, var in variables}


def assign(variables: Keyed, stored: Mapping[str, Any], source: str) -> None:
    """Assigns every variable its stored value; raises ValueError naming a missing key or
    a shape mismatch (checked for all before any is assigned)."""
    missing = [key for key, _ in variables if key not in stored]
    if missing:
        others = sorted(set(stored) - {key for key, _ in variables})
        raise ValueError(
            f"{source} has no value for the layer paths {missing[:6]} of this model "
            f"(it holds {len(others)} others, e.g. {others[:6]}). Received: a "
            "checkpoint of another model?"
        )
    for key, var in variables:
        shape = tuple(np.shape(stored[key]))
        if shape != tuple(var.shape):
            raise ValueError(
                f"{source} holds {key!r} with another shape than the model's. "
                f"Received: stored {shape}, model {tuple(var.shape)}"
            )
    for key, var in variables:
        var.assign(np.asarray(stored[key]))
