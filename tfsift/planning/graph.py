"""A model's ``call`` traced into an ordered chain of nodes, cut into stages.

Letters: L nodes in topological order ``0 .. L-1``; a cut ``c`` lies between node
``c-1`` and node ``c`` (cut 0 is the model input, cut L the model output). A
tensor is live across cut ``c`` when it is produced before ``c`` and read at or
after ``c`` (or is a model output), so a skip connection that jumps over a cut is
sent across it too.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
from keras import tree

from tfsift.planning import keras_internals

_MODEL_INPUT = -1


@dataclasses.dataclass(frozen=True)
class GraphNode:
    """One call of one operation (a layer or a ``keras.ops`` function) in the traced graph."""

    name: str
    node: Any  # keras.src.ops.node.Node
    inputs: tuple[int, ...]  # ids of the KerasTensors it reads
    outputs: tuple[int, ...]  # ids of the KerasTensors it writes

    @property
    def operation(self) -> Any:
        return self.node.operation


class Graph:
    """The traced graph of a model: ordered nodes and the tensors live across every cut."""

    def __init__(
        self,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        structure: Any = None,
        arguments: Any = None,
        created: Sequence[Any] = (),
    ) -> None:
        self.structure = outputs if structure is None else structure  # the call's output nesting
        # the call's positional arguments, of the inputs (a dict input keeps its keys)
        self.arguments = list(inputs) if arguments is None else arguments
        self.inputs = [id(x) for x in inputs]
        self.outputs = [id(x) for x in outputs]
        self.tensors: dict[int, Any] = {id(x): x for x in inputs}
        self.nodes = _order(outputs, set(self.inputs), created)
        for gn in self.nodes:
            self.tensors.update({id(x): x for x in gn.node.outputs})
        self._producer = {t: _MODEL_INPUT for t in self.inputs}
        self._last_use = {t: len(self.nodes) if t in self.outputs else -1 for t in self.tensors}
        for i, gn in enumerate(self.nodes):
            self._producer.update({t: i for t in gn.outputs})
            for t in gn.inputs:
                self._last_use[t] = max(self._last_use[t], i)
        missing = [t for t in self.outputs if t not in self._producer]
        if missing:
            raise ValueError("the model output does not depend on the model input")
        # Which tensors carry a Keras mask when a node reads them, by node, once
        # ``find_masks`` has run the model (empty: none does)
        self.masked_reads: list[frozenset[int]] = [frozenset()] * len(self.nodes)

    def find_masks(self, example: Sequence[Any]) -> None:
        """Runs the nodes once, in one process, on ``example`` (the inputs ``trace`` took,
        one microbatch: a call written for its batch size runs as traced) and notes
        which tensors carry a Keras mask when each node reads them: where a run of its
        own starts a stage (or a node, split into B and W), the tensors it receives
        carry none, and it attaches those (``StageGraph.run``). The symbolic trace
        cannot tell: a ``MultiHeadAttention`` deletes its inputs' masks when it runs,
        not when it is traced, so after it a one-process run carries fewer masks than
        the trace. Nothing runs for a model whose trace has no mask."""
        if not any(keras_internals.mask(x) is not None for x in self.tensors.values()):
            return
        values = dict(zip(self.inputs, tree.flatten(list(example)), strict=True))
        for i, gn in enumerate(self.nodes):
            reads = dict.fromkeys(gn.inputs)
            self.masked_reads[i] = frozenset(
                t for t in reads if keras_internals.mask(values[t]) is not None
            )
            outputs = keras_internals.call_node(gn.node, values, training=False)
            values.update(zip(gn.outputs, outputs, strict=True))

    def mask_pairs(
        self, reads: Sequence[int], masked: frozenset[int]
    ) -> tuple[tuple[int, int], ...]:
        """(tensor, its mask) for each of ``reads`` that carries one (``masked``), where
        the trace's mask of it is among ``reads`` too (its value, received alike)."""
        pairs = []
        for t in reads:
            if t not in masked:  # every read of a model without masks: no lookup
                continue
            m = keras_internals.mask(self.tensors[t])
            if m is not None and id(m) in reads:
                pairs.append((t, id(m)))
        return tuple(pairs)

    def __len__(self) -> int:
        return len(self.nodes)

    def live(self, cut: int) -> tuple[int, ...]:
        """Ids of the tensors crossing ``cut`` (0 <= cut <= L), in a rank-independent order."""
        if cut == 0:
            return tuple(self.inputs)
        if cut == len(self.nodes):
            return tuple(self.outputs)
        keys = [t for t, p in self._producer.items() if p < cut <= self._last_use[t]]
        return tuple(sorted(keys, key=self._position))

    def sample_bytes(self, ids: Sequence[int]) -> int:
        """Bytes per sample of the tensors ``ids`` (their batch dimension divided out)."""
        return sum(_bytes_per_sample(self.tensors[t]) for t in ids)

    def stage(self, start: int, end: int) -> StageGraph:
        """The sub-graph of nodes ``[start, end)`` with its live inputs and outputs."""
        inputs = self.live(start)
        # what the first node to read each input finds on it
        first: dict[int, frozenset[int]] = {}
        for i in range(start, end):
            for t in self.nodes[i].inputs:
                first.setdefault(t, self.masked_reads[i])
        masked = frozenset(t for t in inputs if t in first.get(t, frozenset()))
        nodes = [self.mask_pairs(gn.inputs, self.masked_reads[start + i]) for i, gn in
                 enumerate(self.nodes[start:end])]  # fmt: skip
        return StageGraph(
            self.nodes[start:end],
            inputs,
            self.live(end),
            self.mask_pairs(inputs, masked),
            tuple(nodes),
        )

    def _position(self, tensor: int) -> tuple[int, int]:
        producer = self._producer[tensor]
        if producer == _MODEL_INPUT:
            return (producer, self.inputs.index(tensor))
        return (producer, self.nodes[producer].outputs.index(tensor))


@dataclasses.dataclass(frozen=True)
class StageGraph:
    """The nodes of one stage; ``run`` maps live-in values to live-out values."""

    nodes: Sequence[GraphNode]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    # (input, its mask): live inputs that carry a Keras mask in one process, and per node
    # its inputs' (``Graph.find_masks``)
    masks: tuple[tuple[int, int], ...] = ()
    node_masks: tuple[tuple[tuple[int, int], ...], ...] = ()

    def run(self, values: Sequence[Any], training: bool) -> list[Any]:
        """Executes the stage's nodes in order on concrete tensors."""
        tensors = dict(zip(self.inputs, values, strict=True))
        for t, m in self.masks:  # a tensor received from the stage before carries none
            keras_internals.attach_mask(tensors[t], tensors[m])
        for gn in self.nodes:
            outputs = keras_internals.call_node(gn.node, tensors, training)
            tensors.update(zip(gn.outputs, outputs, strict=True))
        return [tensors[t] for t in self.outputs]

    def layers(self) -> list[Any]:
        """The distinct operations of this stage, in node order."""
        seen: dict[int, Any] = {}
        for gn in self.nodes:
            seen.setdefault(id(gn.operation), gn.operation)
        return list(seen.values())

    def trainable_variables(self) -> list[Any]:
        """The stage's trainable variables, deduplicated, in node order."""
        return _dedupe(
            v for layer in self.layers() for v in getattr(layer, "trainable_variables", [])
        )

    def variables(self) -> list[Any]:
        """All the stage's variables (trainable, non-trainable, seed states), deduplicated."""
        return _dedupe(v for layer in self.layers() for v in getattr(layer, "variables", []))

    def seed_states(self) -> list[Any]:
        """The state variables of every random seed generator the stage's layers own."""
        found = []
        for layer in self.layers():
            if isinstance(layer, keras.layers.Layer):
                found += keras_internals.seed_states(layer)
        return _dedupe(found)


@dataclasses.dataclass(frozen=True)
class Tie:
    """A layer with weights called on more than one stage (a token embedding reused as the
    output head, say): each stage in ``stages`` holds a copy, the first one owns it."""

    layer: Any
    calls: tuple[tuple[str, int], ...]  # (node name, stage), in node order

    @property
    def stages(self) -> tuple[int, ...]:
        return tuple(sorted({s for _, s in self.calls}))

    @property
    def owner(self) -> int:
        """The stage that counts the weights once (a global norm) and saves them."""
        return self.stages[0]


def ties(graph: Graph, bounds: Sequence[int], ranks: int | None = None) -> list[Tie]:
    """The layers with weights called on more than one stage, in the order of their first call.

    Each such stage holds a copy; the copies stay equal because their gradients are summed
    over those stages before every update (``tfsift.pipeline.tied``). A copy of a variable
    that a call updates (BatchNorm statistics, a dropout seed) would change on each stage
    apart, so a layer with such variables is refused. With ``ranks`` K (virtual stages:
    ``bounds`` cut K v chunks, chunk c on stage c mod K) a call's stage is its chunk's: a
    stage that runs two chunks calling a layer holds one copy (its gradients add up within
    the stage, as in one process).

    Raises:
        ValueError: a layer with non-trainable variables called on two stages, named with
            its calls and their stages.
    """
    calls: dict[int, list[tuple[str, int]]] = {}
    layers: dict[int, Any] = {}
    for c in range(len(bounds) - 1):
        for gn in graph.nodes[bounds[c] : bounds[c + 1]]:
            if getattr(gn.operation, "variables", None):
                s = c if ranks is None else c % ranks
                calls.setdefault(id(gn.operation), []).append((gn.name, s))
                layers[id(gn.operation)] = gn.operation
    _refuse_shared_weights(calls, layers)
    found = []
    for key, where in calls.items():
        if len({s for _, s in where}) < 2:
            continue
        layer = layers[key]
        state = [v.path for v in getattr(layer, "non_trainable_variables", [])]
        if state:
            on = ", ".join(f"{name!r} on stage {s}" for name, s in where)
            raise ValueError(
                "a layer called on several stages may hold only trainable weights: each "
                "stage keeps a copy, and variables its calls update (BatchNorm statistics, "
                "random seeds) would change on each copy apart. Keep its calls on one stage "
                "(auto_partition=False and tfsift.partition), or use separate layers. "
                f"Received: calls {on}; non-trainable variables {state}"
            )
        found.append(Tie(layer, tuple(where)))
    return found


def _refuse_shared_weights(calls: dict[int, list[tuple[str, int]]], layers: dict[int, Any]) -> None:
    """Refuses a weight that two layers hold (a head layer that keeps the embedding layer
    and multiplies by its weights, say) where they run on different stages: each stage
    would keep a copy trained by its own uses alone, without a word. A layer called on two
    stages is a tie (``ties``); two layers that share a weight are not."""
    holders: dict[int, list[int]] = {}  # a variable's id: the layers holding it
    for key, layer in layers.items():
        for var in layer.variables:
            holders.setdefault(id(var), []).append(key)
    for var_id, keys in holders.items():
        where = {key: sorted({s for _, s in calls[key]}) for key in keys}
        if len(keys) < 2 or len({s for stages in where.values() for s in stages}) < 2:
            continue
        var = next(v for v in layers[keys[0]].variables if id(v) == var_id)
        on = ", ".join(
            f"{layers[key].name!r} on stage{'s' if len(stages) > 1 else ''} "
            + ", ".join(map(str, stages))
            for key, stages in where.items()
        )
        raise ValueError(
            f"the weight {var.path!r} belongs to more than one layer, and they run on different "
            "stages: each stage would keep a copy, trained by its own layer's uses alone. "
            "Tie it by calling one layer on every stage that uses it (a head tied to the "
            "embedding: keras.layers.ReversibleEmbedding, called with reverse=True), or keep "
            "those layers on one stage (auto_partition=False and tfsift.partition). "
            f"Received: {on}"
        )


def trace(model: Any, example: Sequence[Any], **training: bool) -> Graph:
    """Traces ``model.call`` on symbolic inputs shaped like ``example`` (batch dimension kept).

    ``example`` holds the call's positional arguments, each a tensor or a nest of them (a
    list, tuple or dict input stays one argument); the graph's inputs are their leaves in
    ``tree.flatten`` order, which is how every stage passes them around. ``training``
    (``training=True`` or ``False``) is passed to the call where given; the layers in the
    graph take the step's own at run time. The Keras models ``call`` calls are traced
    through (``keras_internals.models_inlined``): their layers are nodes of the graph.
    """

    def symbolic_input(x: Any, name: str | None = None) -> Any:
        dtype = keras.backend.standardize_dtype(x.dtype)
        return keras.Input(batch_shape=tuple(x.shape), dtype=dtype, name=name)

    # a dict input's tensors named by their keys, as a saved model's inputs are then named
    symbolic = [
        {k: symbolic_input(v, _named(k)) for k, v in a.items()}
        if isinstance(a, dict) and all(not isinstance(v, (dict, list, tuple)) for v in a.values())
        else tree.map_structure(symbolic_input, a)
        for a in example
    ]
    with (
        keras_internals.models_inlined(model),
        keras_internals.weights_read_outside() as reads,
        keras_internals.nodes_created() as created,
    ):
        out = model.call(*symbolic, **training)
    if reads:
        raise ValueError(
            f"{type(model).__name__}.call reads a layer's weights outside that layer's call, "
            "where tfsift's trace of it holds their value when traced, a constant: they "
            "would get no gradient from that use and it would never see their updates. Use "
            "them through a call of their layer (a head tied to an embedding: "
            "keras.layers.ReversibleEmbedding, called with reverse=True), or move the use "
            "into a layer of your own. Received: a read of "
            + ", ".join(repr(v.path) for v in reads)
        )
    return Graph(tree.flatten(symbolic), tree.flatten(out), out, symbolic, created)


def _named(key: Any) -> str | None:
    """A dict input's key as its Input's name, where Keras takes it (no ``/``)."""
    return key if isinstance(key, str) and key and "/" not in key else None


def check_training_branches(model: Any, example: Sequence[Any]) -> None:
    """Refuses a model whose ``call`` takes other layers or ops with ``training=True`` than
    with ``training=False`` (a Python branch on ``training``): the stages run the one
    graph traced for every step, training or not, so one of the two would run the other's
    layers. A layer's own branches are its call's, run with the step's ``training``.

    Raises:
        ValueError: the two traces differ.
    """
    if "training" not in inspect.signature(model.call).parameters:
        return
    with keras_internals.calls_forgotten(model):
        graphs = {flag: trace(model, example, training=flag) for flag in (True, False)}
    nodes = {flag: _structure(graph) for flag, graph in graphs.items()}
    if nodes[True] != nodes[False]:
        kinds = [{kind for kind, _ in nodes[flag]} for flag in (True, False)]
        differ = sorted(map(str, kinds[0] ^ kinds[1])) or ["their order"]
        raise ValueError(
            f"tfsift traces {type(model).__name__}.call once into a graph of its layers and "
            "runs that graph in every step, training or not; this call takes other layers or "
            "ops with training=True than with training=False (a Python branch on training), "
            "so one of them would run the other's. Move the branch into a layer whose call "
            "takes training (Keras passes the step's on to it), such as keras.layers.Dropout "
            f"or a layer of your own. Received: {len(nodes[True])} nodes with training=True, "
            f"{len(nodes[False])} with training=False, differing in {', '.join(differ)}"
        )


def _structure(graph: Graph) -> list[tuple[str, tuple[int, ...]]]:
    """Each node's layer (by name: the same object in every trace) or op (by kind: a new one
    each trace, numbered anew) and the nodes that feed it: what two traces compare by."""
    return [
        (
            gn.node.operation.name
            if isinstance(gn.node.operation, keras.layers.Layer)
            else type(gn.node.operation).__name__,
            tuple(graph._producer[t] for t in gn.inputs),
        )
        for gn in graph.nodes
    ]


def _order(
    outputs: Sequence[Any], inputs: set[int], created: Sequence[Any] = ()
) -> list[GraphNode]:
    """The nodes the outputs need, in the order the call made them (``created``, which a
    node's inputs precede), else depth-first post-order from the outputs (deterministic,
    following argument order): a dict output's keys, flattened sorted, would put a node
    the call made first after one it made later."""
    order: list[Any] = []
    done: set[int] = set()
    stack: list[tuple[Any, bool]] = [(x, False) for x in reversed(list(outputs))]
    while stack:
        tensor, expanded = stack.pop()
        if id(tensor) in inputs:
            continue
        node = keras_internals.producer(tensor)
        if id(node) in done or node.is_input:
            continue
        if expanded:
            done.add(id(node))
            order.append(node)
            continue
        stack.append((tensor, True))
        stack += [(x, False) for x in reversed(node_reads(node))]
    made = {id(node): i for i, node in enumerate(created)}
    if created and all(id(node) in made for node in order):
        order.sort(key=lambda node: made[id(node)])
    names: dict[str, int] = {}
    return [_graph_node(node, names) for node in order]


def node_reads(node: Any) -> list[Any]:
    """The symbolic tensors a node reads: its inputs, and the mask attached to any of them
    (a layer may read its input's mask instead of an argument, ``MultiHeadAttention``
    its query's: where the input crosses a cut, the mask must cross with it)."""
    found = {id(x): x for x in node.input_tensors}
    for x in node.input_tensors:
        m = keras_internals.mask(x)
        if m is not None and hasattr(m, "_keras_history"):
            found.setdefault(id(m), m)
    return list(found.values())


def _graph_node(node: Any, names: dict[str, int]) -> GraphNode:
    base = node.operation.name
    uses = names.get(base, 0)
    names[base] = uses + 1
    name = base if uses == 0 else f"{base}#{uses}"
    return GraphNode(
        name, node, tuple(id(x) for x in node_reads(node)), tuple(id(x) for x in node.outputs)
    )


def _bytes_per_sample(tensor: Any) -> int:
    shape = tuple(tensor.shape)
    itemsize = np.dtype(keras.backend.standardize_dtype(tensor.dtype)).itemsize
    batch = shape[0] if shape and shape[0] else 1
    return int(math.prod(d or 1 for d in shape) * itemsize // batch)


def _dedupe(items: Any) -> list[Any]:
    seen: dict[int, Any] = {}
    for item in items:
        seen.setdefault(id(item), item)
    return list(seen.values())
