"""The gradient helper: dense results, and the one warning a sparse gradient gets."""

from __future__ import annotations

import logging
from typing import Any

import keras
import pytest
import tensorflow as tf

from tfsift.planning import autodiff
from tfsift.planning.graph import trace


def test_a_lookups_gradient_is_summed_dense_and_warned_of_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Keras' Adam takes a lookup's tf.IndexedSlices, a row looked up twice as two
    # gradients, where tfsift's dense sum gives another update: 0.44 apart after 2 epochs
    # of a small model, without a word
    monkeypatch.setattr(autodiff, "_SPARSE_WARNED", set())
    embed, dense = keras.layers.Embedding(5, 2, name="tokens"), keras.layers.Dense(1)
    ids = tf.constant([[1, 1, 3]])
    embed.build((1, 3))
    dense.build((1, 3, 2))
    sources = [embed.embeddings, *dense.trainable_variables]
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(dense(embed(ids)))
        with caplog.at_level(logging.WARNING, logger="tfsift"):
            grads = autodiff.gradients(tape, loss, sources, warn_sparse=True)
    assert not any(isinstance(g, tf.IndexedSlices) for g in grads)
    kernel = dense.kernel.numpy()[:, 0].tolist()
    assert grads[0].numpy().tolist() == [[0, 0], [2 * k for k in kernel], [0, 0], kernel, [0, 0]]
    assert [r.getMessage() for r in caplog.records] == [
        "the gradient of 'tokens/embeddings' is sparse (tf.IndexedSlices, a lookup's): "
        "tfsift sums the microbatches' and replicas' gradients dense, and where a batch looks "
        "a row up more than once, Adam, AdamW, RMSprop and Adagrad update it otherwise than "
        "Keras does in one process (there, the sum of the lookups' squared gradients; here, "
        "the square of their sum): with those optimizers this layer trains differently. SGD "
        "and Lion update the same. A head tied to the embedding "
        "(keras.layers.ReversibleEmbedding) makes its gradient dense in one process too"
    ]


def test_a_weight_tied_across_stages_is_not_warned_of(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an embedding reversed as the head: one stage's lookup gives a sparse gradient, but
    # the tied copies' sum is dense, as one process's tape makes it
    monkeypatch.setattr(autodiff, "_SPARSE_WARNED", set())

    class Tied(keras.Model):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.embed = keras.layers.ReversibleEmbedding(5, 2, name="tied_tokens")

        def call(self, ids: Any) -> Any:
            return self.embed(self.embed(ids), reverse=True)

    model = Tied()
    graph = trace(model, [tf.zeros((1, 3), tf.int32)])
    assert graph.reused == {id(model.embed.embeddings)}  # the layer called twice
    assert graph.stage(0, 1).reused == graph.reused
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        autodiff.note_sparse(
            model.embed.embeddings,
            tf.IndexedSlices(tf.ones((2, 2)), tf.constant([1, 1])),
            graph.reused,
        )
    assert caplog.records == []
