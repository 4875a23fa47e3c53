"""The gradient helpers: a lookup's slices kept for variables, joined, scaled and counted
by their rows as Keras counts them; dense for everything else."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from keras.src.optimizers import base_optimizer

from tfsift.planning import autodiff


def _lookup() -> tuple[keras.layers.Embedding, tf.Variable, tf.GradientTape, tf.Tensor]:
    embed = keras.layers.Embedding(5, 2, name="tokens")
    ids = tf.constant([[1, 1, 3]])
    embed.build((1, 3))
    x = tf.Variable(tf.ones((1, 3, 2)))
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(embed(ids) * x)
    return embed, x, tape, loss


def test_a_variables_lookup_gradient_stays_slices_and_an_inputs_is_dense() -> None:
    embed, x, tape, loss = _lookup()
    grads = autodiff.gradients(tape, loss, [embed.embeddings, x], sparse=1)
    assert isinstance(grads[0], tf.IndexedSlices)
    assert grads[0].indices.numpy().tolist() == [1, 1, 3]  # one row per lookup
    assert not isinstance(grads[1], tf.IndexedSlices)
    dense = autodiff.gradients(tape, loss, [embed.embeddings, x])
    assert not isinstance(dense[0], tf.IndexedSlices)
    assert dense[0].numpy().tolist() == [[0, 0], [2, 2], [0, 0], [1, 1], [0, 0]]


def test_slices_join_and_meet_a_dense_gradient_in_a_dense_sum() -> None:
    a = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([0]), tf.constant([3, 2]))
    b = tf.IndexedSlices(tf.constant([[3.0, 4.0]]), tf.constant([0]), tf.constant([3, 2]))
    joined, dense = autodiff.add([a, a], [b, tf.ones((3, 2))])
    assert isinstance(joined, tf.IndexedSlices)
    assert joined.indices.numpy().tolist() == [0, 0]
    assert joined.values.numpy().tolist() == [[1, 2], [3, 4]]
    assert dense.numpy().tolist() == [[2, 3], [1, 1], [1, 1]]
    halved = autodiff.scale(joined, 0.5)
    assert isinstance(halved, tf.IndexedSlices)
    assert halved.values.numpy().tolist() == [[0.5, 1], [1.5, 2]]
    # Keras' global norm counts each row, as autodiff.values gives them: sqrt(1+4+9+16)
    norm = float(base_optimizer.global_norm([joined]))
    assert np.isclose(norm, float(tf.norm(autodiff.values(joined)))) and np.isclose(norm, 30**0.5)
