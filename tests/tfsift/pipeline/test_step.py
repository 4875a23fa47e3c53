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
    assert str(err.value) == (
        "batch size 30 is not divisible by microbatches=4: every batch splits into M equal "
        "microbatches (batch the dataset with drop_remainder=True, or pass a non-batch "
        "argument through @tfsift.step(non_split_inputs=[...]))"
    )


def test_non_split_inputs_reach_every_microbatch_whole() -> None:
    import keras

    import tfsift

    tfsift.init({"microbatches": 4})

    class Net(tfsift.DistributedModel):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x: tf.Tensor) -> tf.Tensor:
            return self.dense(x)

    model = Net()
    seen: list[tuple[int, ...]] = []

    @tfsift.step(compile=False, non_split_inputs=["temperature"])
    def evaluate(x: tf.Tensor, temperature: tf.Tensor) -> tf.Tensor:
        seen.append(tuple(temperature.shape))
        return model(x, training=False) / temperature

    out = evaluate(tf.ones((8, 2)), temperature=tf.constant([2.0]))
    assert out.concat().shape == (8, 3)
    assert set(seen) == {(1,)}  # the probe and all four microbatches got it whole
    with pytest.raises(ValueError) as err:
        tfsift.step(lambda x, t: x, non_split_inputs=["temp"])
    assert str(err.value) == (
        "non_split_inputs must name arguments of the step function (x, t). Received: 'temp'"
    )
