"""A stage's backward split in two: B (its input gradients), then W (its weight gradients).

A zero-bubble schedule (``partitioner.schedule.zero_bubble``) sends a stage's input
gradients upstream as soon as they exist, and computes its weight gradients later, in
what would have been a bubble. One tape around the whole stage cannot do that:
TensorFlow's gradient of a function call computes the gradient of every input of the
call, so asking it for the inputs, then for the weights, walks the stage twice; and W
alone needs the gradient at each layer's output, which only B's walk produces. So the
split goes node by node (a layer or a ``keras.ops`` call each, as ``StageGraph.run``):

- F runs each node through TensorFlow's own forward function for it, which returns
  the intermediates the node's gradient reads as well (``keras_internals.
  forward_backward``, the pair a tape uses around a function call); F keeps them.
- B walks the nodes backwards through their backward functions, keeping only the
  gradients of each node's inputs, and keeps the output gradient of every node with
  weights.
- W runs those nodes' backward functions again from the kept output gradients, keeping
  only the weights' gradients, and adds them to the running sum.

Each is one compiled call per microbatch. Inside it TensorFlow inlines the nodes'
functions and prunes every output nobody reads, so B runs no weight-gradient kernel
and W no input-gradient kernel (``tests/tfsift/pipeline/test_split.py`` lists the
kernels that run). What both compute is the cheap elementwise start of a node's
backward (an activation's gradient). The gradients equal a tape's around the stage.

Between B and W a microbatch holds the intermediates of its nodes with weights and
their output gradients; ``partitioner.simulator`` charges both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any

import tensorflow as tf

from tfsift.pipeline.compiled import Compiled, signature
from tfsift.pipeline.stage import Stage
from tfsift.planning import keras_internals
from tfsift.planning.autodiff import add, add_gradient, as_gradient, is_float
from tfsift.planning.graph import GraphNode


@dataclasses.dataclass(frozen=True)
class _Node:
    """One node's forward and backward functions and how to feed the backward."""

    forward: Any  # AtomicFunction: (inputs, captured) -> outputs, then intermediates
    backward: Any  # ConcreteFunction: (float output gradients; captures) -> input grads
    captured: tuple[Any, ...]  # the node function's captured inputs (weights' handles)
    inputs: tuple[int, ...]  # ids of the distinct symbolic tensors it reads
    float_outputs: tuple[int, ...]  # positions of the outputs gradients flow through
    kept: tuple[int, ...]  # positions among the forward's outputs the backward reads
    captures: tuple[int | tuple[Any], ...]  # per backward capture: a position in kept,
    # or (value,) for a value of its own
    input_grads: tuple[int, ...]  # positions among ``inputs`` that get a gradient
    weights: tuple[tuple[int, int], ...]  # (backward output, stage variable index)
    outputs: tuple[tf.TensorSpec, ...]  # the node's own outputs

    def run(self, values: Sequence[tf.Tensor]) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
        """(outputs, the intermediates to keep) of the node on ``values``."""
        outputs = list(self.forward.call_flat(*values, *self.captured))
        return outputs[: len(self.outputs)], [outputs[i] for i in self.kept]

    def gradients(self, kept: Sequence[tf.Tensor], output_grads: list[tf.Tensor]) -> list[Any]:
        """Every input's gradient (None where none flows); the caller's compiled call
        prunes those it does not read."""
        captures = [kept[c] if isinstance(c, int) else c[0] for c in self.captures]
        return keras_internals.call_backward(self.backward, output_grads, captures)


def _make_node(
    gn: GraphNode,
    values: Sequence[tf.Tensor],
    training: bool,
    variables: dict[int, int],
    masks: Sequence[tuple[int, int]] = (),
) -> _Node:
    """Traces one node on ``values``' specs (``variables``: a stage variable's index by
    the id of its handle; ``masks``: its inputs' Keras masks, which arguments lose)."""
    ids = tuple(dict.fromkeys(gn.inputs))

    def call(*xs: tf.Tensor) -> list[Any]:
        values = dict(zip(ids, xs, strict=True))
        for t, m in masks:
            keras_internals.attach_mask(values[t], values[m])
        return keras_internals.call_node(gn.node, values, training)

    specs = [tf.TensorSpec(x.shape, x.dtype) for x in values]
    concrete = tf.function(call, autograph=False).get_concrete_function(*specs)
    count = len(concrete.outputs)  # before forward_backward adds the intermediates
    forward, backward = keras_internals.forward_backward(concrete)
    position = {id(t): i for i, t in enumerate(concrete.graph.outputs)}
    kept = tuple(sorted({position[id(c)] for c in backward.captured_inputs if id(c) in position}))
    at = {p: i for i, p in enumerate(kept)}
    captures = tuple(
        at[position[id(c)]] if id(c) in position else (c,) for c in backward.captured_inputs
    )
    grads = list(backward.structured_outputs)
    first = len(concrete.graph.inputs) - len(concrete.captured_inputs)
    weights = tuple(
        (first + j, variables[id(c)])
        for j, c in enumerate(concrete.captured_inputs)
        if id(c) in variables and grads[first + j] is not None
    )
    own = concrete.outputs[:count]
    return _Node(
        forward=forward,
        backward=backward,
        captured=tuple(concrete.captured_inputs),
        inputs=ids,
        float_outputs=tuple(i for i, y in enumerate(own) if is_float(y)),
        kept=kept,
        captures=captures,
        input_grads=tuple(k for k in range(len(ids)) if grads[k] is not None),
        weights=weights,
        outputs=tuple(tf.TensorSpec(y.shape, y.dtype) for y in own),
    )


@dataclasses.dataclass
class Kept:
    """What F keeps for B: each node's intermediates."""

    layout: Layout
    saved: list[list[tf.Tensor]]


@dataclasses.dataclass
class Pending:
    """What B leaves for W: the intermediates and output gradients of the nodes with
    weights that gradients reached."""

    layout: Layout
    saved: list[list[tf.Tensor]]
    grads: list[list[tf.Tensor]]


class Layout:
    """The split stage for one input signature: its nodes, traced by F's first call.

    ``forward`` and ``backward_input`` may also be called inside another compiled call
    (the last stage's head runs both in its own); their traces there may see the batch
    dimension relaxed to None.
    """

    def __init__(self, split: SplitBackward, training: bool) -> None:
        self.split, self.training = split, training
        self.nodes: list[_Node] = []
        self.float_inputs: list[tuple[int, tf.TensorSpec]] = []
        self.float_outputs: list[int] = []
        self.reached: tuple[int, ...] = ()  # nodes whose backward B runs, last first
        self.weighted: tuple[int, ...] = ()  # reached nodes with weight gradients
        index = split.stage.index
        self.forward = Compiled(self._forward, f"stage {index}'s split forward", autograph=False)
        self.backward_input = Compiled(
            self._backward_input, f"stage {index}'s input gradients (B)", autograph=False
        )
        self.backward_weights = Compiled(
            self._backward_weights, f"stage {index}'s weight gradients (W)", autograph=False
        )

    def _forward(self, inputs: list[tf.Tensor]) -> tuple[list[tf.Tensor], list[list[tf.Tensor]]]:
        graph = self.split.stage.graph
        values = dict(zip(graph.inputs, inputs, strict=True))
        build = not self.nodes
        saved = []
        for i, gn in enumerate(graph.nodes):
            if build:
                node_inputs = [values[t] for t in dict.fromkeys(gn.inputs)]
                masks = graph.node_masks[i] if graph.node_masks else ()
                self.nodes.append(
                    _make_node(gn, node_inputs, self.training, self.split.variables, masks)
                )
            node = self.nodes[i]
            outputs, kept = node.run([values[t] for t in node.inputs])
            values.update(zip(gn.outputs, outputs, strict=True))
            saved.append(kept)
        outputs = [values[t] for t in graph.outputs]
        if build:
            self._plan(inputs, outputs)
        return outputs, saved

    def _plan(self, inputs: Sequence[tf.Tensor], outputs: Sequence[tf.Tensor]) -> None:
        """Which nodes B's walk reaches, known once the nodes are traced."""
        graph = self.split.stage.graph
        self.float_inputs = [
            (t, tf.TensorSpec(x.shape, x.dtype))
            for t, x in zip(graph.inputs, inputs, strict=True)
            if is_float(x)
        ]
        self.float_outputs = [t for t, y in zip(graph.outputs, outputs, strict=True) if is_float(y)]
        flowing = set(self.float_outputs)
        reached = []
        for i in reversed(range(len(graph.nodes))):
            node, gn = self.nodes[i], graph.nodes[i]
            if any(gn.outputs[p] in flowing for p in node.float_outputs):
                reached.append(i)
                flowing.update(node.inputs[k] for k in node.input_grads)
        self.reached = tuple(reached)
        self.weighted = tuple(i for i in sorted(reached) if self.nodes[i].weights)

    def pending(self, saved: Sequence[Sequence[tf.Tensor]], grads: Sequence[Any]) -> Pending:
        """What W reads: the weighted nodes' intermediates (of all the nodes' ``saved``)
        and the output gradients B returned for them."""
        return Pending(self, [list(saved[i]) for i in self.weighted], [list(g) for g in grads])

    def _output_grads(
        self, i: int, grads: dict[int, tf.Tensor], batch: tf.Tensor
    ) -> list[tf.Tensor]:
        """Node i's float output gradients from what its consumers sent (zeros if none)."""
        node, gn = self.nodes[i], self.split.stage.graph.nodes[i]
        result = []
        for p in node.float_outputs:
            grad = grads.get(gn.outputs[p])
            result.append(_zeros(node.outputs[p], batch) if grad is None else grad)
        return result

    def _backward_input(
        self, saved: list[list[tf.Tensor]], out_grads: list[tf.Tensor]
    ) -> tuple[list[tf.Tensor], list[list[tf.Tensor]]]:
        grads: dict[int, tf.Tensor] = {}
        for t, g in zip(self.float_outputs, out_grads, strict=True):
            _add(grads, t, g)
        batch = tf.shape(out_grads[0])[0] if out_grads else tf.constant(0)
        kept: dict[int, list[tf.Tensor]] = {}
        for i in self.reached:
            node = self.nodes[i]
            output_grads = self._output_grads(i, grads, batch)
            if node.weights:
                kept[i] = output_grads
            if node.input_grads:
                result = node.gradients(saved[i], output_grads)
                for k in node.input_grads:
                    _add(grads, node.inputs[k], tf.convert_to_tensor(result[k]))
        in_grads = [grads[t] if t in grads else _zeros(s, batch) for t, s in self.float_inputs]
        return in_grads, [kept[i] for i in self.weighted]

    def _backward_weights(
        self,
        saved: list[list[tf.Tensor]],
        output_grads: list[list[tf.Tensor]],
        total: list[tf.Tensor] | None,
    ) -> list[tf.Tensor]:
        variables = self.split.stage.variables
        sums: list[tf.Tensor | None] = [None] * len(variables)
        for i, kept, grads in zip(self.weighted, saved, output_grads, strict=True):
            node = self.nodes[i]
            result = node.gradients(kept, grads)
            for position, v in node.weights:
                g = as_gradient(result[position])  # a lookup's slices stay slices
                sums[v] = g if sums[v] is None else add_gradient(sums[v], g)
        found = [
            tf.zeros(tuple(v.shape), v.dtype) if g is None else g
            for v, g in zip(variables, sums, strict=True)
        ]
        return found if total is None else add(total, found)


def _add(grads: dict[int, tf.Tensor], t: int, g: tf.Tensor) -> None:
    grads[t] = g if t not in grads else grads[t] + g


def _zeros(spec: tf.TensorSpec, batch: tf.Tensor) -> tf.Tensor:
    """Zeros shaped as ``spec``; an unknown dimension (a relaxed trace's) is ``batch``."""
    if spec.shape.is_fully_defined():
        return tf.zeros(spec.shape, spec.dtype)
    dims = [batch if d is None else d for d in spec.shape.as_list()]
    return tf.zeros(tf.stack(dims), spec.dtype)


class SplitBackward:
    """Stage ``stage``'s forward, then its backward as B and W (not recomputing).

    Example:
        >>> split = SplitBackward(stage)  # doctest: +SKIP
        >>> outputs, kept = split.forward(inputs, training=True)  # doctest: +SKIP
        >>> in_grads, pending = split.backward_input(kept, out_grads)  # doctest: +SKIP
        >>> total = split.backward_weights(pending, total)  # doctest: +SKIP
    """

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        # a stage variable's index by the id of its handle, which a function captures
        self.variables = {id(v.handle): i for i, v in enumerate(stage.variables)}
        self._layouts: dict[Hashable, Layout] = {}

    def layout(self, inputs: Sequence[tf.Tensor], training: bool) -> Layout:
        """The split stage for these inputs' signature (made at its first use)."""
        key = (signature(list(inputs)), training)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = Layout(self, training)
        return layout

    def forward(self, inputs: Sequence[tf.Tensor], training: bool) -> tuple[list[tf.Tensor], Kept]:
        """F: the stage's outputs, and what B and W will read."""
        layout = self.layout(inputs, training)
        outputs, saved = layout.forward(list(inputs))
        return list(outputs), Kept(layout, [list(s) for s in saved])

    def backward_input(
        self, kept: Kept, out_grads: Sequence[tf.Tensor]
    ) -> tuple[list[tf.Tensor], Pending]:
        """B: the gradients of the stage's float inputs, and what W will read."""
        layout = kept.layout
        in_grads, grads = layout.backward_input(kept.saved, list(out_grads))
        return list(in_grads), layout.pending(kept.saved, grads)

    def backward_weights(self, pending: Pending, total: list[tf.Tensor] | None) -> list[tf.Tensor]:
        """W: the stage's variable gradients, added to ``total`` if given."""
        return list(pending.layout.backward_weights(pending.saved, pending.grads, total))
