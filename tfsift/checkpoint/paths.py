"""Layer paths: names for a model's variables that do not depend on how it is partitioned.

A layer's path is the chain of attribute names, list indices and dict keys that leads
from the model to it (``blocks/0/dense``), public attributes preferred; a variable's
key is its layer's path and its own name (``blocks/0/dense/kernel``). A variable
belongs to the deepest layer that holds it, so a block's sub-layers keep their own
paths. Keys are the same on every rank and under every partitioning, so a checkpoint
saved with one plan restores into another.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import keras

_SEP = "/"
# Keras' and TensorFlow's own bookkeeping lists hold every sub-layer again, under
# names that say nothing about the model; a layer found only there keeps its name.
_BOOKKEEPING = ("_layers", "_tracked", "_self_")


def layer_paths(model: Any) -> dict[int, tuple[str, Any]]:
    """``id(layer) -> (path, layer)`` for every layer reachable from ``model``'s attributes.

    Example:
        >>> class Net(keras.Model):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.blocks = [keras.layers.Dense(2)]
        >>> [p for p, _ in layer_paths(Net()).values()]
        ['blocks/0']
    """
    found: dict[int, tuple[str, Any]] = {}
    for private in (False, True):  # a public path wins over a private one
        visited = {id(model)}
        frontier: list[tuple[str, Any]] = [("", model)]
        while frontier:  # breadth first: the shortest path wins
            following = []
            for path, layer in frontier:
                for sub_path, sub in _children(layer, path, private):
                    if id(sub) not in visited:
                        visited.add(id(sub))
                        following.append(found.setdefault(id(sub), (sub_path, sub)))
            frontier = following
    return found


def variable_keys(model: Any, extra_layers: Any = ()) -> dict[int, str]:
    """``id(variable) -> key`` for every variable of ``model``'s layers.

    ``extra_layers`` (the traced graph's operations) are named by their layer name
    when no attribute leads to them.
    """
    paths = dict(layer_paths(model))
    taken = {path for path, _ in paths.values()}
    for layer in extra_layers:
        if isinstance(layer, keras.layers.Layer) and id(layer) not in paths:
            name = layer.name
            while name in taken:
                name += "'"
            paths[id(layer)] = (name, layer)
            taken.add(name)
    paths[id(model)] = ("", model)  # the model's own weights, if any
    keys: dict[int, str] = {}
    deepest_first = sorted(paths.values(), key=lambda item: (-_depth(item[0]), item[0]))
    for path, layer in deepest_first:
        used: dict[str, int] = {}
        for var in layer.variables:
            if id(var) in keys:
                continue
            name = str(var.name)
            n = used.get(name, 0)
            used[name] = n + 1
            keys[id(var)] = _SEP.join(p for p in (path, name if n == 0 else f"{name}#{n}") if p)
    return keys


def _children(obj: Any, path: str, private: bool) -> Iterator[tuple[str, Any]]:
    """The layers directly held by ``obj``'s attributes (through lists, tuples, dicts)."""
    for name, value in list(vars(obj).items()):
        if name.startswith("__") or (name.startswith("_") and not private):
            continue
        if name.startswith(_BOOKKEEPING) or name == "_tfsift":
            continue
        yield from _layers_in(value, _join(path, name), depth=0)


def _layers_in(value: Any, path: str, depth: int) -> Iterator[tuple[str, Any]]:
    if isinstance(value, keras.layers.Layer):
        yield path, value
    elif depth < 4 and isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _layers_in(item, _join(path, str(i)), depth + 1)
    elif depth < 4 and isinstance(value, dict):
        for key, item in value.items():
            yield from _layers_in(item, _join(path, str(key)), depth + 1)


def _depth(path: str) -> int:
    return path.count(_SEP) + 1 if path else 0


def _join(path: str, name: str) -> str:
    return f"{path}{_SEP}{name}" if path else name
