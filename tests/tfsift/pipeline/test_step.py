"""Splitting step arguments into microbatches."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfsift.pipeline.step import split


def test_tensors_and_arrays_split_along_axis_0_and_other_arguments_repeat() -> None:
    x = tf.reshape(tf.range(12.0), (6, 2))
    pieces = split((x, np.arange(6), 0.5), {"flag": True}, 3)
    assert len(pieces) == 3
    args, kwargs = pieces[1]
    np.testing.assert_array_equal(args[0].numpy(), [[4.0, 5.0], [6.0, 7.0]])
    np.testing.assert_array_equal(args[1].numpy(), [2, 3])
    assert args[2] == 0.5 and kwargs == {"flag": True}


def test_batch_not_divisible_by_microbatches_is_rejected() -> None:
    with pytest.raises(ValueError) as err:
        split((tf.zeros((30, 2)),), {}, 4)
    assert str(err.value) == "batch size 30 is not divisible by microbatches=4"
