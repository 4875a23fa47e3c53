"""A Keras optimizer's variables keyed by the layer paths of the variables they belong to.

Keras names a slot variable after its model variable (``add_variable_from_reference``:
``dense_1_kernel`` + ``_momentum``); the slot is stored as ``momentum/<key>``, so it follows
its layer to whichever stage holds that layer in another partitioning. The other optimizer
variables (``iteration``, ``learning_rate``) are stored by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

Keyed = Sequence[tuple[str, Any]]  # (layer-path key, trainable variable)


def slots(optimizer: Any, trainable: Keyed) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(slot key -> variable, name -> other variable)`` over ``optimizer.variables``."""
    owners: dict[str, list[tuple[str, Any]]] = {}
    for key, var in trainable:
        owners.setdefault(_prefix(var), []).append((key, var))
    taken: dict[tuple[str, str], int] = {}
    slot_vars: dict[str, Any] = {}
    others: dict[str, Any] = {}
    for var in optimizer.variables:
        name = str(var.name)
        prefix = max(
            (
                p
                for p in owners
                if name.startswith(p) and len(name) > len(p) and _fits(var, owners[p])
            ),
            key=len,
            default=None,
        )
        if prefix is None:
            others[_unique(name, others)] = var
            continue
        kind = name[len(prefix) :]
        n = taken.get((prefix, kind), 0)  # two variables with one path: their order decides
        taken[(prefix, kind)] = n + 1
        keys = owners[prefix]
        slot_vars[f"{kind}/{keys[min(n, len(keys) - 1)][0]}"] = var
    return slot_vars, others


def _fits(slot: Any, owners: list[tuple[str, Any]]) -> bool:
    return any(tuple(slot.shape) == tuple(var.shape) for _, var in owners)


def arrays(optimizer: Any, trainable: Keyed) -> dict[str, np.ndarray]:
    """Every optimizer variable's value, slots by ``kind/key``, the others by name."""
    slot_vars, others = slots(optimizer, trainable)
    return {k: np.asarray(v.numpy()) for k, v in {**others, **slot_vars}.items()}


def wants_slots(trainable: Keyed, stored: Sequence[str]) -> bool:
    """Whether ``stored`` (keys of a checkpoint) holds a slot of any of ``trainable``."""
    mine = {key for key, _ in trainable}
    return any(k.split("/", 1)[-1] in mine for k in stored if "/" in k)


def load(
    optimizer: Any, trainable: Keyed, slot_values: Mapping[str, Any], others: Mapping[str, Any]
) -> None:
    """Assigns stored values: every slot of ``trainable`` (which must be there) and the
    other variables ``others`` holds (``iteration``, ``learning_rate``)."""
    slot_vars, other_vars = slots(optimizer, trainable)
    for key, var in slot_vars.items():
        if key not in slot_values:
            raise ValueError(
                f"the checkpoint has no optimizer value for {key!r}. "
                f"Received: optimizer keys {sorted(slot_values)[:8]}..."
            )
        _assign(var, slot_values[key], key)
    for name, var in other_vars.items():
        if name in others:
            _assign(var, others[name], name)


def check_class(optimizer: Any, saved: str | None) -> None:
    """Refuses to load the state of an optimizer of class ``saved`` (a checkpoint's; None:
    not recorded) into ``optimizer`` of another class.

    Raises:
        ValueError: naming both classes and ``optimizer=None``.
    """
    given = type(optimizer).__name__
    if saved is not None and saved != given:
        raise ValueError(
            f"the checkpoint holds the optimizer state of {saved}, and this run's optimizer "
            f"is {given}: its slots would take {saved}'s values without a word. Restore with "
            f"the {saved} the run saved, or give CheckpointManager optimizer=None to restore "
            f"the weights alone and start {given} afresh. Received: {saved} in the checkpoint, "
            f"{given} given"
        )


def _assign(var: Any, value: Any, key: str) -> None:
    value = np.asarray(value)
    if tuple(value.shape) != tuple(var.shape):
        raise ValueError(
            f"the stored optimizer variable {key!r} has another shape than the optimizer's. "
            f"Received: stored {tuple(value.shape)}, optimizer {tuple(var.shape)}"
        )
    var.assign(value)


def _prefix(var: Any) -> str:
    return str(var.path).replace("/", "_") + "_"


def _unique(name: str, taken: Mapping[str, Any]) -> str:
    n, candidate = 1, name
    while candidate in taken:
        candidate, n = f"{name}#{n}", n + 1
    return candidate
