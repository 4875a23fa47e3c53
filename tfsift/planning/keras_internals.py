"""The only module that touches Keras 3's (and TensorFlow's) private APIs (keras==3.15.*).

tfsift needs thirteen things Keras and TensorFlow do not expose publicly: the node that
produced a symbolic tensor (to walk a traced ``call``), the padding mask Keras attaches
to a tensor (which a layer may read from its input rather than take as an argument), the
weights a model's ``call`` reads outside any layer's call (``weights_read_outside``), the
seed ``keras.utils.set_random_seed`` set (``random_seed``),
tracing through the Keras models a model calls (``models_inlined``), forgetting the
nodes of a trace made only to compare it with another (``calls_forgotten``), re-running
one node on concrete values with its recorded arguments, the seed generators a layer
owns (to replay dropout masks when recomputing), freeing a variable's buffer (so a rank
holds only its stage), which variables code assigns inside a ``keras.StatelessScope``
(the metrics a step function updates), an optimizer's global-norm clipping and
loss-scale finite check with a norm and a verdict computed over every stage
(``global_reductions``), and a ``tf.function``'s forward and backward halves, called
apart to split a backward (``forward_backward``), and the input signature of a
functional model, which Keras' ONNX export refuses to compute for one never called
(``input_signature``).
Keeping them here means a Keras upgrade is checked in one file;
``tests/tfsift/planning/test_keras_internals.py`` pins each one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
import numpy as np
from keras import tree


def producer(tensor: Any) -> Any:
    """The ``keras.src.ops.node.Node`` whose call produced the symbolic ``tensor``."""
    operation, node_index, _ = tensor._keras_history
    return operation._inbound_nodes[node_index]


@contextlib.contextmanager
def models_inlined(model: Any) -> Iterator[None]:
    """Within it, a functional Keras model or a ``keras.Sequential`` that ``model``'s
    layers include (a ``keras.applications`` or KerasHub backbone, a block) runs its own
    ``call`` when called, so a symbolic call of it records its layers' nodes, not one node
    of its own: a trace then reaches every layer, and a cut can fall between them. Each
    keeps its class after. A subclassed model stays one node: its ``call`` may use weights
    of its own (``build``, ``add_weight``) that no layer of the graph would own.

    The class of each such model is swapped for a subclass whose ``__call__`` is its
    ``call`` (Python looks ``__call__`` up on the class, not the instance)."""
    from keras.src.models.functional import Functional

    swapped = []
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, Functional | keras.Sequential):
            cls = layer.__class__
            layer.__class__ = type(cls.__name__, (cls,), {"__call__": _own_call})
            swapped.append((layer, cls))
    try:
        yield
    finally:
        for layer, cls in swapped:
            layer.__class__ = cls


@contextlib.contextmanager
def nodes_created() -> Iterator[list[Any]]:
    """Within it, every symbolic Keras node made (a layer's or an op's symbolic call), in
    the order made: the model's call order."""
    from keras.src.ops.node import Node

    made: list[Any] = []
    original = Node.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    Node.__init__ = init
    try:
        yield made
    finally:
        Node.__init__ = original


def _own_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    if not self.built:  # built as its own __call__ builds it (a subclass's build()), once
        with calls_forgotten(self, include_self=True):
            super(type(self), self).__call__(*args, **kwargs)
    return self.call(*args, **kwargs)


@contextlib.contextmanager
def calls_forgotten(model: Any, include_self: bool = False) -> Iterator[None]:
    """Symbolic calls of ``model``'s layers (and of ``model`` itself with
    ``include_self``) made within are forgotten after it: each keeps the inbound and
    outbound nodes it had (a trace made only for a comparison, or to build a model, would
    otherwise leave layers called twice, whose ``layer.output`` Keras refuses to name)."""
    layers = list(model._flatten_layers(include_self=include_self))
    kept = [(layer, len(layer._inbound_nodes), len(layer._outbound_nodes)) for layer in layers]
    try:
        yield
    finally:
        for layer, inbound, outbound in kept:
            del layer._inbound_nodes[inbound:]
            del layer._outbound_nodes[outbound:]


def node_arguments(
    node: Any, values: dict[int, Any], training: bool | None = None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The node's recorded call arguments with its input tensors replaced by ``values``
    (keyed by the symbolic tensors' ids); ``training`` is passed where the layer takes it."""
    args, kwargs = node.arguments.fill_in(values)
    kwargs = {k: v for k, v in kwargs.items() if k not in _filled_masks(node)}
    if training is not None and takes_training(node.operation):
        kwargs["training"] = training
    return tuple(args), dict(kwargs)


def _filled_masks(node: Any) -> set[str]:
    """The mask arguments (``mask``, ``query_mask``, ...) the trace recorded because Keras'
    ``Layer.__call__`` filled them in from its inputs' masks: left out, the call fills them
    in again from the masks its inputs carry then, as a run in one process does (a
    ``MultiHeadAttention`` deletes its inputs' masks when it runs, so a layer after it
    finds fewer than the trace recorded)."""
    own = {id(m) for m in map(mask, node.input_tensors) if m is not None}
    filled = set()
    for name, value in node.arguments.kwargs.items():
        if name == "mask" or name.endswith("_mask"):
            leaves = tree.flatten(value)
            if leaves and all(id(leaf) in own for leaf in leaves):
                filled.add(name)
    return filled


def mask(tensor: Any) -> Any:
    """The Keras mask (padding) attached to ``tensor``, symbolic or concrete, or None."""
    from keras.src.backend.common.masking import get_keras_mask

    return get_keras_mask(tensor)


def attach_mask(tensor: Any, value: Any) -> None:
    """Attaches the mask ``value`` to the concrete ``tensor``, as a layer's call attaches
    its output's: ``MultiHeadAttention`` reads its query's mask there, never from an
    argument, so a tensor received from another stage or another compiled call needs it
    back."""
    from keras.src.backend.common.masking import set_keras_mask

    set_keras_mask(tensor, value)


def random_seed() -> int | None:
    """The seed ``keras.utils.set_random_seed`` set in this process, or None."""
    from keras.src.utils.rng_utils import get_random_seed

    seed = get_random_seed()
    return None if seed is None else int(seed)


@contextlib.contextmanager
def weights_read_outside() -> Iterator[list[Any]]:
    """Within it, the list it gives collects each variable whose value is read where no
    layer's call is running (Keras' call context): in a model's own ``call``, say
    ``ops.matmul(h, ops.transpose(self.embed.embeddings))``. Traced, such a read is the
    value at the trace, a constant, not the variable."""
    from keras.src.backend.common import global_state
    from keras.src.backend.common.variables import Variable

    reads: list[Any] = []
    value = Variable.value

    def watched(variable: Any) -> Any:
        outside = global_state.get_global_attribute("current_call_ctx") is None
        if outside and all(v is not variable for v in reads):
            reads.append(variable)
        return value.fget(variable)

    Variable.value = property(watched)
    try:
        yield reads
    finally:
        Variable.value = value


def call_node(node: Any, values: dict[int, Any], training: bool | None = None) -> list[Any]:
    """Runs one traced node on concrete ``values``; returns its flattened outputs."""
    args, kwargs = node_arguments(node, values, training)
    if _adds_a_column(node.operation, args, kwargs):
        x1, x2 = args
        args = (x1, keras.ops.broadcast_to(x2, np.broadcast_shapes(x1.shape, x2.shape)))
    return list(tree.flatten(node.operation(*args, **kwargs)))


def _adds_a_column(operation: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``operation`` is ``keras.ops.add`` of (B, ..., H) and a column (B, 1, ...,
    1), which Keras' TensorFlow ``add`` takes for a bias along H where the static B equals
    H (its ``bias_add`` special case: each sample's value added to another sample's
    units). A stage is traced with a microbatch's static size, so B / M samples met it
    where one process's B did not; the column broadcast first is added as it should be."""
    from keras.src.ops.numpy import Add

    if type(operation) is not Add or kwargs or len(args) != 2:
        return False
    shapes = [tuple(getattr(x, "shape", ())) for x in args]
    if min(map(len, shapes)) < 2 or None in shapes[0] + shapes[1]:
        return False
    (rows, *ones), first = shapes[1], shapes[0]
    return rows > 1 and all(d == 1 for d in ones) and rows in (first[1], first[-1])


def takes_training(operation: Any) -> bool:
    """Whether Keras passes a ``training`` flag to this operation: every layer (a layer
    whose ``call`` lacks the argument ignores it), no ``keras.ops`` function."""
    return "training" in getattr(operation, "_call_context_args", ())


def seed_states(layer: Any) -> list[Any]:
    """The state variables of every seed generator owned by ``layer`` or its sub-layers."""
    return [
        generator.state
        for sub in layer._flatten_layers(include_self=True)
        for generator in getattr(sub, "_seed_generators", [])
    ]


def read_as(model: Any, dtype: str) -> set[int]:
    """The ids of the variables of ``model``'s layers that are read (autocast) as ``dtype``
    in the model's call: its layer's compute dtype, that of the innermost layer that owns
    it (Keras keeps a layer's own in ``_trainable_variables``)."""
    found: dict[int, bool] = {}
    for layer in model._flatten_layers(include_self=False):  # an outer layer first
        for variable in getattr(layer, "_trainable_variables", []):
            autocast = getattr(variable, "_autocast", False)
            found[id(variable)] = autocast and layer.compute_dtype == dtype
    return {key for key, yes in found.items() if yes}


def free(variable: Any, why: str) -> None:
    """Drops a variable's buffer: reading or assigning it from now on raises
    ``ValueError(why)`` (Keras would fail calling its spent initializer)."""

    def unheld(*_: Any, **__: Any) -> Any:
        raise ValueError(why)

    variable._value = None
    variable._initializer = unheld  # what Keras reads an uninitialized variable with
    variable._direct_assign = unheld  # an instance's own: Keras' assign calls it


def is_freed(variable: Any) -> bool:
    """Whether ``free`` dropped this variable's buffer."""
    return variable._value is None


def tape_recording() -> bool:
    """Whether a ``tf.GradientTape`` is recording on this thread (TensorFlow has no public
    query; a step uses it to refuse a user's tape around the model call)."""
    from tensorflow.python.eager import record

    return bool(record.could_possibly_record())


class AssignmentRecorder(keras.StatelessScope):  # type: ignore[misc]
    """A ``keras.StatelessScope`` that also lists the variables assigned inside it.

    Nothing is applied (as in any stateless scope); ``assigned`` holds the variables in
    the order of their first assignment, which Keras' own ``state_mapping`` (keyed by
    ``id``) cannot give back.
    """

    def __init__(self) -> None:
        super().__init__()
        self.assigned: list[Any] = []

    def add_update(self, update: tuple[Any, Any]) -> None:
        # Keras' Variable.assign (and assign_add/sub) calls this inside a stateless scope.
        if id(update[0]) not in self.state_mapping:
            self.assigned.append(update[0])
        super().add_update(update)


@contextlib.contextmanager
def stateful() -> Iterator[None]:
    """Leaves the current ``keras.StatelessScope`` for the block: variables created or
    assigned inside are real (a model partitioned inside a probe keeps its weights)."""
    from keras.src.backend.common import global_state

    scope = global_state.get_global_attribute("stateless_scope")
    global_state.set_global_attribute("stateless_scope", None)
    try:
        yield
    finally:
        global_state.set_global_attribute("stateless_scope", scope)


def clips_by_global_norm(optimizer: Any) -> bool:
    """Whether ``optimizer`` clips its gradients by their global norm (``global_clipnorm``)."""
    return bool(optimizer.global_clipnorm and optimizer.global_clipnorm > 0)


def keras_clipping(optimizer: Any) -> bool:
    """Whether ``optimizer`` clips with Keras' own ``_clip_gradients`` (not a subclass's)."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    return type(optimizer)._clip_gradients is BaseOptimizer._clip_gradients


# Optimizer methods that see every gradient ``apply`` is given at once: an override of one
# may compute over all of them (a norm, a finite check), which tfsift cannot tell from a
# computation on each variable alone (``update_step``, ``_apply_weight_decay``).
WHOLE_UPDATE = ("apply_gradients", "apply", "_clip_gradients")


def own_overrides(optimizer: Any, names: Sequence[str] = WHOLE_UPDATE) -> list[str]:
    """The methods of ``names`` that a class of ``optimizer``'s own (outside Keras)
    defines, as ``Class.method``, in the order of ``names``."""
    found = []
    for name in names:
        owner = next(cls for cls in type(optimizer).__mro__ if name in vars(cls))
        if not owner.__module__.startswith("keras."):
            found.append(f"{owner.__name__}.{name}")
    return found


def keras_finite_check(optimizer: Any) -> bool:
    """Whether a ``LossScaleOptimizer`` decides with Keras' own ``check_finite`` and ``apply``."""
    cls = keras.optimizers.LossScaleOptimizer
    return type(optimizer).check_finite is cls.check_finite and type(optimizer).apply is cls.apply


def check_before_apply(check: Callable[[Any, Sequence[Any]], None]) -> None:
    """From now on Keras' ``apply`` (and so ``apply_gradients``), a ``LossScaleOptimizer``'s
    too, first calls ``check(optimizer, variables)``, the variables it is about to update
    (the optimizer's own where none are given). Once per process."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    for cls in (BaseOptimizer, keras.optimizers.LossScaleOptimizer):
        original = cls.__dict__["apply"]
        if getattr(original, "_tfsift_checked", False):
            continue

        def apply(
            self: Any, grads: Any, trainable_variables: Any = None, *, _o: Any = original
        ) -> Any:
            listed = trainable_variables
            if listed is None:
                listed = getattr(self, "_trainable_variables", None) or []
            check(self, list(listed))
            return _o(self, grads, trainable_variables)

        apply._tfsift_checked = True  # type: ignore[attr-defined]
        apply.__doc__, apply.__name__ = original.__doc__, "apply"
        cls.apply = apply


def spans_stages(optimizer: Any) -> tuple[bool, bool]:
    """Whether ``global_reductions`` is in force on ``optimizer``: (its clipping, its finite
    check), each True where the optimizer has none to make."""
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    clipping = optimizer.inner_optimizer if scaled else optimizer
    clips = not clips_by_global_norm(clipping) or "_clip_gradients" in vars(clipping)
    finite = not scaled or "check_finite" in vars(optimizer)
    return clips, finite


@contextlib.contextmanager
def global_reductions(
    optimizer: Any,
    norm: Callable[[list[Any]], Any] | None,
    finite: Callable[[list[Any]], Any] | None,
) -> Iterator[None]:
    """While tracing ``optimizer.apply`` inside the block, its global-norm clipping uses
    ``norm(grads)`` (the norm over every stage's gradients) in Keras' own formula
    (``base_optimizer.clip_by_global_norm``), and a ``LossScaleOptimizer`` decides with
    ``finite(grads)`` (whether every stage's gradients are finite). ``optimizer`` is the
    one ``apply`` is called on; the clipping is its inner optimizer's under loss scaling.
    """
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    clipping = optimizer.inner_optimizer if scaled else optimizer
    overrides: list[tuple[Any, str, Any]] = []
    if norm is not None and clips_by_global_norm(clipping):

        def clip(grads: list[Any]) -> list[Any]:
            use_norm = norm(grads)
            limit = clipping.global_clipnorm
            scale = limit * keras.ops.minimum(1.0 / use_norm, 1.0 / limit)
            scale = scale + (use_norm - use_norm)  # NaN for a non-finite norm, as in Keras
            return [g if g is None else g * keras.ops.cast(scale, g.dtype) for g in grads]

        overrides.append((clipping, "_clip_gradients", clip))
    if finite is not None and scaled:
        overrides.append((optimizer, "check_finite", finite))
    for obj, name, value in overrides:  # instance attributes shadow the class's methods
        object.__setattr__(obj, name, value)
    try:
        yield
    finally:
        for obj, name, _ in overrides:
            object.__delattr__(obj, name)


def forward_backward(concrete: Any) -> tuple[Any, Any]:
    """TensorFlow's own (forward, backward) pair for a ``tf.function``'s concrete function.

    The forward (an ``AtomicFunction``) takes the concrete function's inputs then its
    ``captured_inputs`` and returns its outputs followed by the intermediate tensors its
    gradient reads; the backward (a ``ConcreteFunction``) takes the gradients of the float
    outputs and, as captures, those intermediates (each one of ``concrete.graph.outputs``)
    and returns the gradient of every input of ``concrete.graph`` (None where none flows).
    This is the pair a ``GradientTape`` uses around a function call; tfsift calls the two
    halves at different times to split a backward (``tfsift.pipeline.split``).
    """
    return concrete._delayed_rewrite_functions.forward_backward()  # type: ignore[no-any-return]


def call_backward(backward: Any, output_grads: list[Any], captures: list[Any]) -> list[Any]:
    """Calls the backward of ``forward_backward`` with its captures given explicitly."""
    return list(backward._call_flat(output_grads, captures))


def input_signature(model: Any) -> Any:
    """The input signature Keras' exports compute for a built functional ``model`` (a list
    holding its inputs' ``InputSpec``s, nested as its inputs are).

    Keras' ONNX export computes it too, but then refuses a model that was never called
    (``model._called``), which a functional model built from its inputs never is; the
    clone tfsift exports is one. Passed as ``input_signature``, it skips that check only.
    """
    from keras.src.export.export_utils import get_input_signature

    return get_input_signature(model)
