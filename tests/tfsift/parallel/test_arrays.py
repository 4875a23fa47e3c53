"""tfsift.from_arrays and from_rows in one process: the batches and their order, the same
batches through tf.data, each pass the next epoch, replicas' deals, a memory-mapped array,
load's calls, and their errors."""

from __future__ import annotations

from pathlib import Path
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


def test_a_resumed_loop_sets_the_epochs_done_and_goes_on_in_the_same_order() -> None:
    tfsift.init({})
    whole = tfsift.from_arrays(data(), B, seed=5)
    want = [[rows_of(x) for x, _ in whole] for _ in range(3)]
    resumed = tfsift.from_arrays(data(), B, seed=5)  # a new process, after 2 epochs
    resumed.epochs = 2
    assert [rows_of(x) for x, _ in resumed] == want[2]


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


def test_from_rows_reads_from_arrays_batches_through_load_and_only_those() -> None:
    tfsift.init({})
    x, y = data()
    read: list[list[int]] = []

    def load(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        assert rows.dtype == np.int64 and rows.ndim == 1
        read.append(rows.tolist())
        return x[rows], y[rows]

    train = tfsift.from_rows(load, N, B, seed=5)
    assert read == [list(range(B))]  # the first batch's rows, read once for the spec
    arrays_ = tfsift.from_arrays((x, y), B, seed=5)
    assert train.element_spec == arrays_.element_spec
    assert int(train.cardinality()) == N // B
    for _ in (1, 2):  # each pass the next epoch, as from_arrays
        want = [rows_of(a) for a, _ in arrays_]
        assert [rows_of(a) for a, _ in train] == want
        assert read[-len(want) :] == want  # one call per batch, its rows in order
    assert len(read) == 1 + 2 * (N // B)


def test_from_rows_takes_a_list_of_fields_as_a_tuple() -> None:
    # tf.data refused it: "output_signature must contain objects that are subclass of
    # tf.TypeSpec"
    tfsift.init({})
    x, y = data()
    listed = tfsift.from_rows(lambda rows: [x[rows], y[rows]], N, B, seed=5)
    tupled = tfsift.from_rows(lambda rows: (x[rows], y[rows]), N, B, seed=5)
    assert listed.element_spec == tupled.element_spec
    assert [rows_of(a) for a, _ in listed] == [rows_of(a) for a, _ in tupled]


def test_a_memory_mapped_array_stays_mapped_and_batches_as_in_memory(tmp_path: Path) -> None:
    tfsift.init({})
    x, y = data()
    np.save(tmp_path / "x.npy", x)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    train = tfsift.from_arrays((mapped, y), B, seed=5)
    assert np.shares_memory(train.leaves[0], mapped)  # not read into memory whole
    want = [rows_of(a) for a, _ in tfsift.from_arrays((x, y), B, seed=5)]
    assert [rows_of(a) for a, _ in train] == want


def test_from_rows_errors_say_what_was_expected_and_received() -> None:
    tfsift.init({"microbatches": 4})
    x, y = data()

    def load(rows: np.ndarray) -> Any:
        return x[rows], y[rows]

    with pytest.raises(TypeError) as err:
        tfsift.from_rows(x, N, B)  # type: ignore[arg-type]
    assert str(err.value) == (
        "from_rows: load must be a function of the rows to read. Received: ndarray"
    )
    with pytest.raises(TypeError, match=r"^from_rows: rows must be an int. Received: float$"):
        tfsift.from_rows(load, 100.0, B)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^from_rows: rows must be at least 1. Received: rows=0$"):
        tfsift.from_rows(load, 0, B)
    with pytest.raises(ValueError) as err:
        tfsift.from_rows(load, N, 6)
    assert str(err.value) == (
        "from_rows: batch_size must be a positive multiple of microbatches=4, since every "
        "batch splits into 4 microbatches. Received: batch_size=6"
    )
    with pytest.raises(ValueError) as err:
        tfsift.from_rows(lambda rows: (x[rows], y[:3]), N, B)
    assert str(err.value) == (
        "from_rows: load(rows) must return one row per index of rows. Received: "
        "[(8, 3), (3,)] for 8 rows"
    )
    calls: list[int] = []

    def drifting(rows: np.ndarray) -> Any:  # float64 from its second call on
        calls.append(1)
        return x[rows].astype(np.float64 if len(calls) > 1 else np.float32), y[rows]

    train = tfsift.from_rows(drifting, N, B)
    with pytest.raises(ValueError) as err:
        next(iter(train))
    assert str(err.value) == (
        "from_rows: load(rows) must return the same structure, dtypes and row shapes at "
        "every call. Received: ('float64[3]', 'int64[]'); the first batch: "
        "('float32[3]', 'int64[]')"
    )


def test_from_rows_with_an_element_spec_reads_only_the_batches_trained() -> None:
    tfsift.init({})
    x, y = data()
    read: list[list[int]] = []

    def load(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        read.append(rows.tolist())
        return x[rows], y[rows]

    spec = (tf.TensorSpec((None, 3), tf.float32), tf.TensorSpec((None,), tf.int64))
    train = tfsift.from_rows(load, N, B, seed=5, element_spec=spec)
    assert read == []  # no read to learn the layout
    arrays_ = tfsift.from_arrays((x, y), B, seed=5)
    assert train.element_spec == arrays_.element_spec  # the batch dimension is B
    want = [rows_of(a) for a, _ in arrays_]
    assert [rows_of(a) for a, _ in train] == want
    assert read == want


def test_from_rows_element_spec_errors_say_what_was_expected_and_received() -> None:
    tfsift.init({})
    x, y = data()

    def load(rows: np.ndarray) -> Any:
        return x[rows], y[rows]

    with pytest.raises(TypeError) as err:
        tfsift.from_rows(load, N, B, element_spec=(tf.float32, tf.int64))
    assert str(err.value) == (
        "from_rows: element_spec must be a tf.TensorSpec, or a tuple or dict of them. "
        "Received: (tf.float32, tf.int64)"
    )
    for shape in [(4, 3), (), (B, None)]:
        with pytest.raises(ValueError) as err:
            tfsift.from_rows(load, N, B, element_spec=tf.TensorSpec(shape, tf.float32))
        assert str(err.value) == (
            "from_rows: element_spec must describe a batch: each shape (batch_size=8 or "
            f"None, then the row shape, fully defined). Received: "
            f"{tf.TensorSpec(shape, tf.float32)}"
        )
    spec = (tf.TensorSpec((B, 3), tf.float32), tf.TensorSpec((B,), tf.int32))
    train = tfsift.from_rows(load, N, B, element_spec=spec)  # y is int64
    with pytest.raises(ValueError) as err:
        next(iter(train))
    assert str(err.value) == (
        "from_rows: load(rows) must return the same structure, dtypes and row shapes at "
        "every call. Received: ('float32[3]', 'int64[]'); element_spec: "
        "('float32[3]', 'int32[]')"
    )


def test_from_rows_strings_of_any_width_are_one_dtype() -> None:
    # NumPy gives each batch of str its own width (<U1, <U2...); tf.data one tf.string
    tfsift.init({})
    names = np.array([str(i) for i in range(N)])

    def load(rows: np.ndarray) -> np.ndarray:
        return np.array(names[rows].tolist())  # the batch's own width: <U1 for rows 0-7

    train = tfsift.from_rows(load, N, B, shuffle=False)
    assert [b.numpy().astype(str).tolist() for b in train][-1] == names[-4 - B : -4].tolist()


def fake_runtime(monkeypatch: pytest.MonkeyPatch, replicas: int, replica: int, M: int = 1) -> None:
    fake = SimpleNamespace(
        topology=SimpleNamespace(replicas=replicas),
        replica=replica,
        config=SimpleNamespace(microbatches=M),
    )
    monkeypatch.setattr(arrays.runtime, "get", lambda: fake)


def test_a_global_batch_takes_the_same_samples_at_each_step_on_any_number_of_replicas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    G = 12
    steps: dict[int, list[set[int]]] = {}
    for R in (1, 2, 3, 4):
        union: list[set[int]] = []
        for r in range(R):
            fake_runtime(monkeypatch, R, r, M=1)
            train = tfsift.from_arrays(data(), global_batch_size=G, seed=3)
            assert (train.batch_size, train.global_batch) == (G // R, G)
            for t, (x, _) in enumerate(train):
                if r == 0:
                    union.append(set())
                union[t] |= set(rows_of(x))
        steps[R] = union
    perm = np.random.default_rng([3, 1]).permutation(N)
    want = [set(perm[t * G : (t + 1) * G].tolist()) for t in range(N // G)]
    assert steps == {1: want, 2: want, 3: want, 4: want}


def test_start_at_resumes_the_epoch_at_that_step_and_goes_on_with_the_next() -> None:
    tfsift.init({})
    x, y = data()
    whole = tfsift.from_arrays((x, y), 8, seed=2)
    batches = [rows_of(b[0]) for _ in range(3) for b in whole]  # 12 batches an epoch
    later = tfsift.from_arrays((x, y), global_batch_size=8, seed=2)
    later.start_at(17)  # epoch 2, its 6th batch
    resumed = [rows_of(b[0]) for _ in range(2) for b in later]
    assert resumed == batches[17:]
    with pytest.raises(ValueError, match=r"start_at: step must be an int >= 0. Received: -1"):
        later.start_at(-1)


def test_a_global_batch_size_is_checked_against_the_replicas_and_microbatches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_runtime(monkeypatch, replicas=2, replica=0, M=4)
    with pytest.raises(ValueError) as err:
        tfsift.from_arrays(data(), global_batch_size=12)
    assert str(err.value) == (
        "from_arrays: global_batch_size must be a positive multiple of replicas x "
        "microbatches = 2 x 4, since each of the 2 replica(s) takes an equal share, split "
        "into 4 microbatches. Received: global_batch_size=12"
    )
    for given in ({}, {"batch_size": 8, "global_batch_size": 16}):
        with pytest.raises(ValueError) as err:
            tfsift.from_rows(lambda rows: rows, N, **given)  # type: ignore[arg-type]
        assert str(err.value) == (
            "from_rows takes batch_size (each replica's) or global_batch_size (all replicas' "
            f"together), one of them. Received: batch_size={given.get('batch_size')}, "
            f"global_batch_size={given.get('global_batch_size')}"
        )
    assert tfsift.from_rows(lambda rows: rows, N, global_batch_size=16).batch_size == 8


def test_python_lists_of_numbers_are_arrays_and_a_list_of_arrays_is_a_tuple() -> None:
    # "anything np.asarray takes": a tuple of Python lists was refused with row counts of
    # None (its numbers became leaves); a list of arrays stays several arrays, as in fit
    tfsift.init({})
    lists = tfsift.from_arrays(([[1, 2]] * 8, list(range(8))), batch_size=2, shuffle=False)
    x, y = next(iter(lists))
    assert x.numpy().tolist() == [[1, 2], [1, 2]] and y.numpy().tolist() == [0, 1]
    arrays = tfsift.from_arrays([np.zeros((8, 2)), np.arange(8)], batch_size=4, shuffle=False)
    first, second = next(iter(arrays))
    assert first.shape == (4, 2) and second.numpy().tolist() == [0, 1, 2, 3]
