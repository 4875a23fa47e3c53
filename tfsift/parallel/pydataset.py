"""A ``tf.data.Dataset`` made by Python: iterated in Python it runs its generator directly;
tf.data transformations, ``fit`` and ``tf.function`` read the same elements through
``from_generator``."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf
from keras import tree


class PythonDataset(tf.data.Dataset):  # type: ignore[misc]
    """Subclasses yield NumPy elements from ``_elements`` (one pass: an epoch); ``spec``
    their structure, ``cardinality`` the elements per pass if known."""

    def __init__(
        self, spec: Any, cardinality: int | None = None, options: tf.data.Options | None = None
    ) -> None:
        graph = tf.data.Dataset.from_generator(self._elements, output_signature=spec)
        if cardinality is not None:
            graph = graph.apply(tf.data.experimental.assert_cardinality(cardinality))
        if options is not None:
            graph = graph.with_options(options)
        self._tfsift_graph = graph
        super().__init__(tf.data.experimental.to_variant(graph))

    @abc.abstractmethod
    def _elements(self) -> Iterator[Any]:
        """One pass of NumPy elements."""

    def _inputs(self) -> list[tf.data.Dataset]:
        return []

    @property
    def element_spec(self) -> Any:
        return self._tfsift_graph.element_spec

    def __iter__(self) -> Iterator[Any]:
        for element in self._elements():
            if type(element) is tuple and all(isinstance(a, np.ndarray) for a in element):
                yield tuple(map(tf.constant, element))  # (x, y) or (x, y, weights): flat
            else:
                yield tree.map_structure(_tensor, element)


def _tensor(leaf: Any) -> Any:
    """``leaf`` as a tensor. A NumPy array goes through ``tf.constant``, which makes the
    same tensor as ``tf.convert_to_tensor`` in about three quarters of its time (it skips the
    conversion registry's dispatch): a small model's step reads a batch of two or three
    arrays each time (docs/benchmarks-log.md, Fixed cost per call: input per batch)."""
    return tf.constant(leaf) if isinstance(leaf, np.ndarray) else tf.convert_to_tensor(leaf)


def in_step_options() -> tf.data.Options:
    """Options that keep tf.data from reading a generator ahead of its consumer.

    A prefetch tf.data adds by itself, or an autotuned buffer, would run the generator
    ahead of the training step: a sifting round would score before the step has updated
    the weights, and a batch yielded ahead would take the record of the batch before it.
    """
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.autotune.enabled = False
    return options
