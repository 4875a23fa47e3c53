"""The model stages one rank runs: its stage s, or with v virtual stages its v chunks.

With ``virtual_stages`` v the model is cut into K v chunks and the rank at pipeline
position s runs chunks s, s + K, ..., s + (v - 1) K (``partitioner.schedule.virtual``),
one ``Stage`` each. What the rest of tfsift asks of "this rank's stage" (its variables,
for ``model.trainable_variables``, checkpoints and the optimizer) is their union, in
chunk order, a layer that two of the chunks call listed once: it is one variable on the
rank, and its gradient is the sum of both chunks' (``combine``), as a process computes it
for a layer called twice. With v = 1 it is the one stage's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfsift.pipeline.stage import Stage
from tfsift.planning.autodiff import add_gradient
from tfsift.planning.graph import StageGraph


class Chunks:
    """This rank's stages, in chunk order, and their union.

    Args:
        stages: one ``Stage`` per chunk this rank runs (chunk indices s, s + K, ...).

    Attributes:
        index: s, the rank's position in the pipeline (its first chunk).
        graph: every chunk's nodes as one ``StageGraph`` (for its variables and layers;
            it does not run).
        variables: the trainable variables of every chunk, each once (chunk order).
        state_variables: the other variables (BatchNorm statistics, seed states).
        recompute: whether the stages recompute their forward in their backward.
    """

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = tuple(stages)
        first = self.stages[0]
        self.index, self.recompute = first.index, first.recompute
        nodes = [gn for stage in self.stages for gn in stage.graph.nodes]
        self.graph = StageGraph(nodes, first.graph.inputs, self.stages[-1].graph.outputs)
        self.variables = self.graph.trainable_variables()
        trainable = {id(v) for v in self.variables}
        self.state_variables = [v for v in self.graph.variables() if id(v) not in trainable]
        where = {id(v): i for i, v in enumerate(self.variables)}
        self._positions = {
            stage.index: tuple(where[id(v)] for v in stage.variables) for stage in self.stages
        }

    def positions(self, chunk: int) -> tuple[int, ...]:
        """Where the variables of ``chunk`` sit in ``variables``."""
        return self._positions[chunk]

    def combine(self, sums: dict[int, list[tf.Tensor] | None]) -> list[tf.Tensor] | None:
        """The gradients of ``variables`` from each chunk's gradient sum (by chunk index),
        added in chunk order where two chunks call the same layer; None if no chunk has
        a sum (no backward ran)."""
        if len(self.stages) == 1:
            return sums.get(self.index)
        if all(sums.get(stage.index) is None for stage in self.stages):
            return None
        total: list[Any] = [None] * len(self.variables)
        for stage in self.stages:
            grads = sums.get(stage.index)
            if grads is None:  # a chunk without weights, whose sum is empty
                continue
            for i, grad in zip(self.positions(stage.index), grads, strict=True):
                total[i] = grad if total[i] is None else add_gradient(total[i], grad)
        return [
            tf.zeros(tuple(var.shape), var.dtype) if grad is None else grad
            for var, grad in zip(self.variables, total, strict=True)
        ]
