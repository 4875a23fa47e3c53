"""Nested state as .npz arrays: exact round trips, readable with NumPy alone."""

from __future__ import annotations

import io
import json
import random

import numpy as np
import pytest

from tfsift.checkpoint.codec import TREE, pack, unpack


def round_trip(tree: object) -> object:
    buffer = io.BytesIO()
    np.savez(buffer, **pack(tree))  # type: ignore[arg-type]
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as arrays:
        return unpack(arrays)


def test_arrays_scalars_tuples_and_plain_values_round_trip_with_their_types() -> None:
    tree = {
        "history": np.arange(5, dtype=np.float32),
        "step": np.int64(7),
        "loss": np.float32(0.25),
        "rounds": 3,
        "mean": 0.1 + 0.2,
        "name": "relative",
        "previous": None,
        "flags": [True, False],
        "leaves": [np.zeros((2, 3)), np.ones(2, np.int32)],
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "by_int": {1: "a", 2: "b"},
        "__odd__": 1,
        "text": np.array([b"ab", b"c"], dtype=object),
    }
    got = round_trip(tree)
    assert isinstance(got, dict)
    assert got["step"].dtype == np.int64 and got["step"] == 7
    assert got["loss"].dtype == np.float32 and got["loss"] == np.float32(0.25)
    assert got["history"].dtype == np.float32
    assert got["mean"] == 0.1 + 0.2  # floats round-trip exactly through JSON
    assert got["python"] == tree["python"]
    np.random.set_state(got["numpy"])  # accepted as a generator state
    assert got["by_int"] == {1: "a", 2: "b"} and got["__odd__"] == 1
    assert got["text"].tolist() == [b"ab", b"c"] and got["text"].dtype == object
    for key in ("rounds", "name", "previous", "flags"):
        assert got[key] == tree[key]


def test_every_array_is_named_by_its_place_and_the_structure_is_json() -> None:
    arrays = pack({"sift": {"policy": {"history": {"values": np.zeros(3)}}}, "x": [np.ones(1)]})
    assert sorted(arrays) == [TREE, "sift/policy/history/values", "x/0"]
    json.loads(str(arrays[TREE]))


def test_an_unsupported_value_names_its_place() -> None:
    with pytest.raises(TypeError, match="Received: set at /sift/odd"):
        pack({"sift": {"odd": {1, 2}}})
