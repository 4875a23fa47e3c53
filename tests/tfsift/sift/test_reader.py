"""SourceReader: g batches per tf.data call when B is static, never a round across blocks."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

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
