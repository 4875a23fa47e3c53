"""StepOutput reductions over microbatches."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfsift.pipeline.outputs import GradientOutput, StepOutput


def test_reductions_over_microbatches() -> None:
    out = StepOutput([tf.constant([[1.0, 2.0]]), tf.constant([[3.0, 6.0]])])
    np.testing.assert_array_equal(out.reduce_mean().numpy(), [[2.0, 4.0]])
    np.testing.assert_array_equal(out.reduce_sum().numpy(), [[4.0, 8.0]])
    np.testing.assert_array_equal(out.accumulate().numpy(), [[2.0, 4.0]])
    np.testing.assert_array_equal(out.concat().numpy(), [[1.0, 2.0], [3.0, 6.0]])
    np.testing.assert_array_equal(out.merge().numpy(), out.concat().numpy())
    assert out.stack().shape == (2, 1, 2)
    assert len(out) == 2


def test_gradient_output_keeps_only_the_sum() -> None:
    out = GradientOutput(tf.constant([4.0, 8.0]), 4)
    np.testing.assert_array_equal(out.accumulate().numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(out.reduce_mean().numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(out.reduce_sum().numpy(), [4.0, 8.0])
    assert len(out) == 4
    with pytest.raises(RuntimeError, match="per-microbatch gradients are not kept"):
        out.concat()
