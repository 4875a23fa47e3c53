"""tfsift.from_arrays in one process: the batches and their order, the same batches
through tf.data, each pass the next epoch, replicas' deals, and its errors."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import tfsift
from tfsift.parallel import arrays

N, B = 100, 8


def data() -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(N * 3, dtype=np.float32).reshape(N, 3)  # row i holds 3i, 3i+1, 3i+2
    return x, np.arange(N) % 7


def rows_of(x: Any) -> list[int]:
    return (np.asarray(x)[:, 0] // 3).astype(int).tolist()


def test_each_pass_is_the_next_epochs_permutation_in_whole_batches() -> None:
    tfsift.init({})
    train = tfsift.from_arrays(data(), B, seed=5)
    for epoch in (1, 2):
        batches = [(rows_of(x), y.numpy().tolist()) for x, y in train]
        want = np.random.default_rng([5, epoch]).permutation(N)[: N // B * B]
        assert [r for rows, _ in batches for r in rows] == want.tolist()
        assert all(len(rows) == B and labels == [r % 7 for r in rows] for rows, labels in batches)
    assert train.element_spec == (
        tf.TensorSpec((B, 3), tf.float32),
        tf.TensorSpec((B,), tf.as_dtype(np.arange(1).dtype)),
    )
    assert int(train.cardinality()) == N // B


def test_tf_data_reads_the_same_batches_and_dicts_keep_their_structure() -> None:
    tfsift.init({})
    x, y = data()
    python = tfsift.from_arrays({"x": x, "y": y}, B, shuffle=False)
    graph = tfsift.from_arrays({"x": x, "y": y}, B, shuffle=False).map(lambda e: e["x"])
    assert [rows_of(e["x"]) for e in python] == [rows_of(e) for e in graph]
    assert rows_of(next(iter(python))["x"]) == list(range(B))


@pytest.mark.parametrize("structure", ["tuple", "dict", "nested"])
def test_python_iteration_yields_the_element_spec_as_tensors(structure: str) -> None:
    """A flat tuple of arrays takes ``tf.constant``'s short path, other structures are
    walked leaf by leaf: either way each leaf is the tensor its spec describes."""
    tfsift.init({})
    x, y = data()
    names = np.array([f"row {i}" for i in range(N)])
    built = {"tuple": (x, y, names), "dict": {"x": x, "y": y}, "nested": ({"x": x}, y)}
    train = tfsift.from_arrays(built[structure], B, shuffle=False)
    first = next(iter(train))
    tf.nest.assert_same_structure(first, train.element_spec)
    leaves, specs = tf.nest.flatten(first), tf.nest.flatten(train.element_spec)
    wanted = tf.nest.flatten(built[structure])
    for leaf, spec, array in zip(leaves, specs, wanted, strict=True):
        assert tf.is_tensor(leaf) and spec.is_compatible_with(leaf)
        rows = np.char.encode(array[:B]) if array.dtype.kind == "U" else array[:B]
        assert leaf.numpy().tolist() == rows.tolist()  # tf.string holds bytes


@pytest.mark.parametrize("replica", [0, 1, 2])
def test_replicas_are_dealt_the_permutation_round_robin_in_equal_shares(
    replica: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = SimpleNamespace(
        topology=SimpleNamespace(replicas=3),
        replica=replica,
        config=SimpleNamespace(microbatches=1),
    )
    monkeypatch.setattr(arrays.runtime, "get", lambda: fake)
    train = arrays.ArrayDataset(data(), B, shuffle=True, seed=0)
    order = np.random.default_rng([0, 1]).permutation(N)
    want = order[replica::3][: N // 3]
    got = [r for x, _ in train for r in rows_of(x)]
    assert got == want[: N // 3 // B * B].tolist()
    assert train.order(1, np.array([4, 9, 2, 7, 5, 1])).tolist() == (
        np.random.default_rng([0, 1]).permutation([4, 9, 2, 7, 5, 1])[replica::3][:2].tolist()
    )


def test_errors_say_what_was_expected_and_received() -> None:
    tfsift.init({"microbatches": 4})
    x, y = data()
    cases = [
        ((x, y[:5]), B, "row counts [100, 5]"),
        ((x, np.float32(1)), B, "row counts [100, None]"),
        ((), B, "no arrays"),
    ]
    for given, size, received in cases:
        with pytest.raises(ValueError) as err:
            tfsift.from_arrays(given, size)
        assert str(err.value) == (
            "from_arrays needs arrays with one sample per row, all with the same number of "
            f"rows. Received: {received}"
        )
    with pytest.raises(ValueError) as err:
        tfsift.from_arrays((x, y), 6)
    assert str(err.value) == (
        "from_arrays: batch_size must be a positive multiple of microbatches=4, since every "
        "batch splits into 4 microbatches. Received: batch_size=6"
    )
    with pytest.raises(ValueError) as err:
        tfsift.from_arrays((x, y), 104)
    assert str(err.value) == (
        "from_arrays: each of the 1 replica(s) gets 100 rows per epoch, fewer than one "
        "batch. Received: batch_size=104"
    )
    with pytest.raises(TypeError, match=r"batch_size must be an int. Received: float"):
        tfsift.from_arrays((x, y), 8.0)  # type: ignore[arg-type]
