"""Nested state (dicts, lists, NumPy arrays, numbers, strings) as the arrays of one ``.npz``.

The structure is JSON, stored as the string array ``__tree__``; every NumPy array or
scalar in it is a separate array named by its place in the structure, so a reader
sees ``np.load(f)["sift/policy/history/values"]`` without tfsift. Python numbers, strings,
``None`` and booleans stay in the JSON (floats round-trip exactly); NumPy scalars are
0-d arrays, so their dtype round-trips too.

Example:
    >>> arrays = pack({"step": 3, "losses": np.zeros(2, np.float32)})
    >>> sorted(arrays)
    ['__tree__', 'losses']
    >>> unpack(arrays)["losses"].dtype
    dtype('float32')
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

TREE = "__tree__"
_ARRAY, _TUPLE, _ITEMS = "__array__", "__tuple__", "__items__"


def pack(tree: Any) -> dict[str, np.ndarray]:
    """The arrays of ``tree``, plus its structure as JSON under ``__tree__``."""
    arrays: dict[str, np.ndarray] = {}
    structure = _encode(tree, "", arrays)
    arrays[TREE] = np.array(json.dumps(structure))
    return arrays


def unpack(arrays: Mapping[str, np.ndarray]) -> Any:
    """The tree ``pack`` was given."""
    return _decode(json.loads(str(arrays[TREE][()])), arrays)


def _encode(value: Any, path: str, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(value, (np.ndarray, np.generic)):
        return _encode_array(value, path, arrays)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(v, f"{path}/{i}", arrays) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{path}/{i}", arrays) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        plain = all(isinstance(k, str) and not k.startswith("__") for k in value)
        if plain:
            return {k: _encode(v, f"{path}/{k}", arrays) for k, v in value.items()}
        return {
            _ITEMS: [
                [_encode(k, path, {}), _encode(v, f"{path}/{k}", arrays)] for k, v in value.items()
            ]
        }
    raise TypeError(
        "checkpoint state must be dicts, lists, tuples, NumPy arrays, numbers, strings or None. "
        f"Received: {type(value).__name__} at {path or '/'}"
    )


def _encode_array(value: Any, path: str, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    array = np.asarray(value)
    as_object = array.dtype == object
    if as_object:  # bytes or str elements (tf.string data): a fixed-width array, no pickle
        array = np.array(array.tolist())
    key = path.strip("/") or "value"
    while key in arrays or key == TREE:
        key += "'"
    arrays[key] = array
    return {_ARRAY: key, "scalar": isinstance(value, np.generic), "object": as_object}


def _decode(value: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    if isinstance(value, list):
        return [_decode(v, arrays) for v in value]
    if not isinstance(value, dict):
        return value
    if _ARRAY in value:
        array = np.asarray(arrays[value[_ARRAY]])
        if value["object"]:
            array = array.astype(object)
        return array[()] if value["scalar"] else array
    if _TUPLE in value:
        return tuple(_decode(v, arrays) for v in value[_TUPLE])
    if _ITEMS in value:
        return {_key(_decode(k, arrays)): _decode(v, arrays) for k, v in value[_ITEMS]}
    return {k: _decode(v, arrays) for k, v in value.items()}


def _key(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key
