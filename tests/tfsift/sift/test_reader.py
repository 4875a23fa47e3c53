"""SourceReader: g batches per tf.data call when B is static, never a round across blocks;
the next block read on a thread of the reader's own, its errors raised in order."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf
from autotune import record_prompt_end

from tfsift.sift import reader as reader_module
from tfsift.sift.reader import SourceReader


def reads(reader: SourceReader, sizes: list[int]) -> list[tuple[list[int], int]]:
    out = []
    for k in sizes:
        got = reader.read(k)
        if got is None:
            out.append(([], 0))
            continue
        leaves, count = got
        out.append((leaves[0].tolist(), count))
    return out


def test_a_static_batch_size_is_read_in_blocks_of_g_and_handed_out_as_views() -> None:
    source = tf.data.Dataset.range(14).batch(2, drop_remainder=True)  # 7 batches of 2
    reader = SourceReader(source, batch_size=2, group=3)
    assert reads(reader, [1, 3, 3, 3, 3]) == [
        ([0, 1], 1),  # a delay round: one batch of the first block
        ([2, 3, 4, 5], 2),  # the rest of that block, not a round across two blocks
        ([6, 7, 8, 9, 10, 11], 3),
        ([12, 13], 1),  # the last, partial block
        ([], 0),  # the end
    ]


def test_the_block_is_not_copied_per_round() -> None:
    x = np.arange(24, dtype=np.float32).reshape(12, 2)
    reader = SourceReader(tf.data.Dataset.from_tensor_slices(x).batch(2), batch_size=2, group=3)
    first = reader.read(1)
    second = reader.read(2)
    assert first is not None and second is not None
    base = first[0][0].base
    assert base is not None and second[0][0].base is base  # both views of one block


def test_an_unknown_batch_size_is_read_batch_by_batch_and_joined() -> None:
    source = tf.data.Dataset.range(7).batch(3)  # sizes 3, 3, 1: no static batch size
    reader = SourceReader(source, batch_size=None, group=2)
    assert reader.first_size is None
    assert reads(reader, [2, 2, 2]) == [([0, 1, 2, 3, 4, 5], 2), ([6], 1), ([], 0)]
    assert reader.first_size == 3


def test_one_batch_per_round_is_read_as_it_comes() -> None:
    source = tf.data.Dataset.range(6).batch(2, drop_remainder=True)
    reader = SourceReader(source, batch_size=2, group=1)
    assert reads(reader, [1, 1, 1, 1]) == [([0, 1], 1), ([2, 3], 1), ([4, 5], 1), ([], 0)]


def reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tfsift-sift-reader")]


def test_the_next_block_is_read_on_the_readers_thread_while_the_current_one_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fetched_on = []
    fetch = SourceReader._fetch

    def recorded(self: SourceReader) -> list[np.ndarray] | None:
        fetched_on.append(threading.current_thread().name)
        return fetch(self)

    monkeypatch.setattr(SourceReader, "_fetch", recorded)
    source = tf.data.Dataset.range(14).batch(2, drop_remainder=True)  # blocks of 3, 3, 1
    reader = SourceReader(source, batch_size=2, group=3)
    assert reads(reader, [3]) == [([0, 1, 2, 3, 4, 5], 3)]
    # the first block on the caller's thread; the second already asked for on the reader's
    assert fetched_on[0] == threading.current_thread().name
    assert fetched_on[1:] == ["tfsift-sift-reader_0"]
    assert reads(reader, [3, 3, 3]) == [([6, 7, 8, 9, 10, 11], 3), ([12, 13], 1), ([], 0)]
    assert fetched_on[1:] == ["tfsift-sift-reader_0"] * 3  # the third block, then the end
    for thread in reader_threads():  # the source ended: the thread ends too
        thread.join(5.0)
    assert reader._thread is None and not any(t.is_alive() for t in reader_threads())


def test_an_error_upstream_is_raised_by_the_read_of_its_block_not_earlier() -> None:
    def check(v: tf.Tensor) -> tf.Tensor:
        with tf.control_dependencies([tf.debugging.assert_less(v, tf.constant(6, tf.int64))]):
            return tf.identity(v)

    source = tf.data.Dataset.range(12).map(check).batch(2, drop_remainder=True)
    reader = SourceReader(source, batch_size=2, group=2)  # the second block holds 6
    assert reads(reader, [2]) == [([0, 1, 2, 3], 2)]  # its read-ahead has failed by now
    with pytest.raises(tf.errors.InvalidArgumentError):
        reader.read(2)


def test_the_source_is_read_without_the_autotuner(monkeypatch: pytest.MonkeyPatch) -> None:
    # with it, TensorFlow 2.21 can end the epoch waiting for its thread (shard.prompt_end)
    read = record_prompt_end(monkeypatch, reader_module)
    source = tf.data.Dataset.range(4).batch(2)
    assert reads(SourceReader(source, batch_size=2, group=2), [2]) == [([0, 1, 2, 3], 2)]
    assert reads(SourceReader(source, batch_size=None, group=1), [2]) == [([0, 1, 2, 3], 2)]
    assert read == [False, False]
