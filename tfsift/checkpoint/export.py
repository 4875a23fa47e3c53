"""``tfsift.save_model`` and ``tfsift.load_weights``: a partitioned model to and from one file.

The exported file holds a functional ``keras.Model`` with the traced graph of the
model's ``call`` (the graph tfsift partitions) and fresh copies of its layers, so
``keras.saving.load_model`` needs Keras and the classes of any custom layers, but not
tfsift, MPI, Horovod or the ``DistributedModel`` subclass (which refuses to run outside
a ``@tfsift.step``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any

import keras
from keras import tree
from keras.src.saving import serialization_lib

from tfsift.checkpoint import collective, weights
from tfsift.checkpoint import optimizer as optimizer_lib
from tfsift.checkpoint.files import CheckpointError
from tfsift.checkpoint.paths import variable_keys
from tfsift.checkpoint.store import Checkpoint, latest_valid
from tfsift.model import DistributedModel, Partitioned
from tfsift.parallel import runtime
from tfsift.planning import keras_internals
from tfsift.planning.graph import Graph

WEIGHTS_SUFFIX = ".weights.h5"  # Keras 3's weights files
# what a rank sends rank 0 to write a file: its stage's weights, optimizer slots and other
# optimizer variables (iteration, learning rate), each by key
Gathered = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]


def save_model(model: DistributedModel, filepath: str | Path) -> Path:
    """Gathers every stage's weights and writes one ordinary Keras 3 ``.keras`` file on rank 0.

    Collective: call it on every rank. The file is written to a temporary name and renamed.
    A compiled model's file holds its compile config (optimizer, loss, metrics) and its
    optimizer's state, every stage's slots and ``iterations``, as Keras writes a model's:
    ``keras.saving.load_model`` returns a compiled model whose ``fit`` goes on where this
    one stopped.

    Example:
        >>> tfsift.save_model(model, "model.keras")          # on every rank
        >>> restored = keras.saving.load_model("model.keras")  # anywhere: plain Keras
        >>> restored.predict(x)

    Args:
        model: a partitioned ``tfsift.DistributedModel`` (one that has run a step).
        filepath: the file to write; its name must end in ``.keras``.

    Returns:
        The path written.

    Raises:
        ValueError: ``filepath`` does not end in ``.keras``, no step has run yet, or Keras
            cannot rebuild the model's compile config (a custom loss or metric that is not
            registered), as ``load_model`` would have to.
        CheckpointError: the file could not be written.
    """
    model = weights.check_model(model, "tfsift.save_model")
    path = Path(filepath)
    if path.suffix != ".keras":
        raise ValueError(
            f"tfsift.save_model writes a .keras file. Received: filepath={str(path)!r}"
        )
    _write_whole(model, "tfsift.save_model", path, keras.saving.save_model, compiled=True)
    return path


def save_weights(model: DistributedModel, filepath: str | Path) -> Path:
    """Gathers every stage's weights and writes one Keras ``.weights.h5`` file on rank 0.

    Collective: call it on every rank (``model.save_weights`` on a partitioned model, as
    ``ModelCheckpoint(save_weights_only=True)`` does). The file holds the weights of the
    functional model ``save_model`` writes; ``model.load_weights`` reads it back.

    Raises:
        ValueError: ``filepath`` does not end in ``.weights.h5``, or no step has run yet.
        CheckpointError: the file could not be written.
    """
    model = weights.check_model(model, "save_weights")
    path = Path(filepath)
    if not path.name.endswith(WEIGHTS_SUFFIX):
        raise ValueError(
            f"save_weights writes a Keras weights file, whose name must end in "
            f"{WEIGHTS_SUFFIX}. Received: filepath={str(filepath)!r}"
        )
    _write_whole(model, "save_weights", path, lambda clone, to: clone.save_weights(to))
    return path


def export_model(model: DistributedModel, filepath: str | Path, **kwargs: Any) -> Path:
    """``model.export`` of a partitioned model: Keras' export (a TensorFlow SavedModel for
    serving by default) of the whole model, written by rank 0.

    Collective: call it on every rank. The stages' weights are gathered into the
    functional model ``save_model`` writes, whose ``export(filepath, **kwargs)`` rank 0
    runs into a temporary directory, renamed to ``filepath`` when complete.

    Raises:
        ValueError: no step has run yet.
        CheckpointError: the export could not be written.
    """
    model = weights.check_model(model, "model.export")
    path = Path(filepath)

    def write(clone: keras.Model, to: Path) -> None:
        given = dict(kwargs)
        if given.get("format") == "onnx" and given.get("input_signature") is None:
            # Keras' ONNX export refuses a model never called, and the clone is not: the
            # signature it would compute, given, skips that check alone
            given["input_signature"] = keras_internals.input_signature(clone)
        clone.export(str(to), **given)

    _write_whole(model, "model.export", path, write)
    return path


def _write_whole(
    model: DistributedModel, caller: str, path: Path, write: Any, compiled: bool = False
) -> None:
    """Gathers the stages' weights (replica 0's) on rank 0, which calls ``write(clone,
    file)`` with the whole model's functional clone and a temporary name in ``path``'s
    directory, then renames it to ``path`` (a reader never sees half a file).

    ``compiled``: the clone is compiled as the model was and its optimizer holds every
    stage's optimizer state (``save_model``). A weights file leaves them out: Keras loads
    a weights file's optimizer variables by their index into a model's own optimizer, whose
    order follows that model's variables (a subclass's order of attributes, not the
    clone's order of calls)."""
    rt = runtime.get()
    part = weights.partitioned(model, None, caller)
    optimizer = _built_optimizer(model) if compiled else None

    def own() -> Gathered:
        if rt.replica != 0:
            return {}, {}, {}
        stage = weights.values(weights.owned(weights.keyed(model, part), part))
        if optimizer is None:
            return stage, {}, {}
        trainable = weights.owned(weights.trainable(model, part), part)
        slots, others = optimizer_lib.slots(optimizer, trainable)
        return stage, weights.values(list(slots.items())), weights.values(list(others.items()))

    mine = collective.together(rt.world, own)
    gathered = [mine]
    if rt.world.Get_size() > 1:
        with collective.bounded():
            gathered = rt.world.gather(mine, root=0)
    collective.on_root(
        rt.world, lambda: _export(model, part, gathered, path, write, compiled, optimizer)
    )


def load_weights(model: DistributedModel, path: str | Path, example: Any = None) -> int | None:
    """Loads weights into a partitioned model from a ``.keras`` file, a ``.weights.h5``
    file (``model.save_weights``) or a checkpoint.

    Collective: call it on every rank. A checkpoint is a ``ckpt-<step>`` directory or the
    directory of a ``CheckpointManager`` (its newest complete checkpoint); only the model's
    variables are loaded (no optimizer, sifting or random state). A ``.keras`` file is matched
    to the model by the structure of the traced ``call``, layer by layer.

    Args:
        model: the ``tfsift.DistributedModel``.
        path: a ``.keras`` file written by ``tfsift.save_model`` (or by Keras for a model of
            the same structure), a ``.weights.h5`` file written by ``model.save_weights``
            (or by Keras' for a model with the same layers), or a checkpoint directory.
        example: a batch of model inputs (a tensor or a list), needed to partition a model
            that has not run a step, except for a checkpoint (whose manifest has them).

    Returns:
        The checkpoint's step, or None for a ``.keras`` file.

    Raises:
        ValueError: the file does not fit the model, or it must be partitioned and no
            ``example`` was given.
        CheckpointError: no complete checkpoint at ``path``, or a file could not be read.
    """
    model = weights.check_model(model, "tfsift.load_weights")
    rt = runtime.get()
    inputs = None if example is None else weights.example_inputs(example, rt.config.microbatches)
    path = Path(path)
    if path.suffix == ".keras" or path.name.endswith(WEIGHTS_SUFFIX):
        part = collective.together(
            rt.world, lambda: weights.partitioned(model, inputs, "tfsift.load_weights", True)
        )
        collective.together(rt.world, lambda: _load_keras_file(model, part, path))
        return None
    found = collective.on_root(rt.world, lambda: _as_text(latest_valid(path)))
    if found is None:
        raise CheckpointError(f"no complete checkpoint at {path}")
    with collective.together(rt.world, lambda: Checkpoint(Path(found))) as ckpt:
        specs = inputs or ckpt.manifest.inputs
        part = collective.together(
            rt.world, lambda: weights.partitioned(model, specs, "tfsift.load_weights")
        )

        def assign() -> None:
            keyed = weights.keyed(model, part)
            weights.assign(keyed, ckpt.values("weights-"), found)

        collective.together(rt.world, assign)
        return ckpt.manifest.step


def standalone(part: Partitioned, name: str) -> keras.Model:
    """A functional ``keras.Model`` of the traced graph with new layers (unpartitioned,
    freshly initialised) and inputs of any batch size, as the model's call takes them (a
    dict input by its keys)."""
    graph = part.graph
    traced = [graph.tensors[t] for t in graph.inputs]
    arguments = graph.arguments[0] if len(graph.arguments) == 1 else graph.arguments
    functional = keras.Model(tree.pack_sequence_as(arguments, traced), graph.structure, name=name)
    # a dict's by its keys, the others as Keras' own export names them: the same names at
    # every save (a traced tensor's is numbered by those the process made before)
    keyed = [isinstance(a, dict) for a in graph.arguments for _ in tree.flatten(a)]
    fresh = [
        keras.Input(shape=tuple(t.shape[1:]), dtype=t.dtype, name=t.name if by_key else f"args_{i}")
        for i, (t, by_key) in enumerate(zip(traced, keyed, strict=True))
    ]
    # the user's own layers, a Lambda's function too: nothing here comes from a file
    with serialization_lib.SafeModeScope(False):
        return keras.models.clone_model(
            functional, input_tensors=tree.pack_sequence_as(arguments, fresh)
        )


def copy_state(layers: list[Any], twins: dict[str, Any]) -> None:
    """Gives each twin (by name) of ``layers`` without variables what Keras' saving keeps of
    them beside variables, which a clone made from their configs lacks: a lookup's
    vocabulary (an adapted ``TextVectorization``'s, ``StringLookup``'s) and its IDF
    weights, in the order Keras' loading gives them."""
    for layer in {id(layer): layer for layer in layers}.values():
        keeps_state = isinstance(layer, keras.layers.Layer) and hasattr(layer, "save_assets")
        if not keeps_state or layer.variables:  # tfsift gathers and assigns the variables
            continue
        twin, store = twins[layer.name], dict[str, Any]()
        layer.save_own_variables(store)
        twin.load_own_variables(store)
        with tempfile.TemporaryDirectory() as folder:
            layer.save_assets(folder)
            twin.load_assets(folder)


def _export(
    model: DistributedModel,
    part: Partitioned,
    gathered: list[Gathered],
    path: Path,
    write: Any,
    compiled: bool,
    optimizer: Any,
) -> None:
    stored: dict[str, Any] = {}
    slots: dict[str, Any] = {}
    for values, stage_slots, _ in gathered:
        stored.update(values)
        slots.update(stage_slots)
    clone = standalone(part, model.name)
    twins = {layer.name: layer for layer in clone.layers}
    operations = [gn.operation for gn in part.graph.nodes]
    copy_state(operations, twins)
    keys = variable_keys(model, operations)
    twin_keys: dict[int, str] = {}
    for layer in _layers(part.graph):
        twin = twins[layer.name]
        pairs = list(zip(layer.variables, twin.variables, strict=True))
        twin_keys.update((id(w), keys[id(v)]) for v, w in pairs)
        weights.assign([(keys[id(v)], w) for v, w in pairs], stored, "the gathered stages")
    if compiled and model.compiled:
        # rank 0 holds stage 0, whose iteration and learning rate every stage shares
        _compile_clone(model, clone, twin_keys, optimizer, slots, gathered[0][2])
    # the same suffix (Keras checks it); the process's own, so that two jobs writing to one
    # path each replace it whole rather than delete each other's partial file
    partial = path.with_name(f".partial-{os.getpid()}-{path.name}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove(partial)
        write(clone, partial)
        _put_in_place(partial, path)
    except OSError as err:
        _remove(partial)
        raise CheckpointError(f"writing {path} failed: {err}") from err


def _put_in_place(partial: Path, path: Path) -> None:
    """Renames the written ``partial`` to ``path``: a file replaces the old one at once; an
    export (a SavedModel directory) removes it first, and again where another job's export
    took its place in between (three tries)."""
    if not partial.is_dir():
        os.replace(partial, path)
        return
    for attempt in range(3):
        _remove(path)
        try:
            os.replace(partial, path)
            return
        except OSError:
            if attempt == 2:
                raise


def _built_optimizer(model: DistributedModel) -> Any:
    """The compiled model's optimizer once built (``compiled_update`` builds it for the
    stage when the model is partitioned), else None: a fresh one has no state to keep."""
    optimizer = getattr(model, "optimizer", None) if model.compiled else None
    return optimizer if optimizer is not None and optimizer.built else None


def _compile_clone(
    model: DistributedModel,
    clone: keras.Model,
    twin_keys: dict[int, str],
    optimizer: Any,
    slots: dict[str, Any],
    others: dict[str, Any],
) -> None:
    """Compiles ``clone`` from the model's compile config as ``keras.saving.load_model``
    will (``compile_from_config``, which builds a new optimizer of the same config for the
    clone's variables), then gives that optimizer every stage's slots (by layer path) and
    the iteration and learning rate: the file resumes as a Keras model's does."""
    try:
        clone.compile_from_config(model.get_compile_config())
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"the .keras file of {model.name!r} holds its compile config, which "
            "keras.saving.load_model compiles the loaded model with, and Keras could not "
            "compile a model from it: register the custom losses, metrics or optimizer "
            "with @keras.saving.register_keras_serializable, as for any Keras file. "
            f"Received: {type(err).__name__}: {err}"
        ) from err
    if optimizer is None:  # never built: the new optimizer's initial state is its state
        return
    trainable = [(twin_keys[id(var)], var) for var in clone.trainable_variables]
    optimizer_lib.load(clone.optimizer, trainable, slots, others)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _load_keras_file(model: DistributedModel, part: Partitioned, path: Path) -> None:
    if path.suffix == ".keras":
        try:
            loaded = keras.saving.load_model(path, compile=False)
        except (TypeError, ValueError) as err:
            # Keras' save of a model of this class, whose weights Keras' own load_weights
            # reads by attribute without the class (registered for load_model or not); it
            # skips the optimizer in a weights file only, which the archive holds
            with tempfile.TemporaryDirectory() as folder, zipfile.ZipFile(path) as archive:
                inner = archive.extract("model.weights.h5", folder)
                _load_by_attribute(model, part, path, err, read=Path(inner))
            return
    else:  # a weights file of the functional model save_weights writes
        loaded = standalone(part, model.name)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                loaded.load_weights(path)
            except ValueError as err:
                # Keras' own save_weights of a model of this class stores its layers by
                # attribute (d1/vars), where the functional model's are in layers/<name>;
                # what Keras warned of on the way is about the layout this file lacks
                _load_by_attribute(model, part, path, err)
                return
        for warning in said:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    twins = align(part.graph, loaded, path)
    for layer in part.stage.graph.layers():
        if isinstance(layer, keras.layers.Layer) and layer.variables:
            twin = twins[id(layer)]
            pairs = [(f"{layer.name}/{i}", v) for i, v in enumerate(layer.variables)]
            stored = {f"{layer.name}/{i}": w.numpy() for i, w in enumerate(twin.variables)}
            weights.assign(pairs, stored, str(path))


def _load_by_attribute(
    model: DistributedModel,
    part: Partitioned,
    path: Path,
    functional: Exception,
    read: Path | None = None,
) -> None:
    """Loads a ``.weights.h5`` file that Keras wrote for a model with this model's layers
    (``keras.Model.save_weights`` of the same class, or of a ``keras.Model`` with the same
    attributes), which stores each layer under its attribute path, or the weights of such
    a model's ``.keras`` file (``keras.Model.save``, read without its class: ``read``, the
    weights file extracted from it)

    Keras' own ``load_weights`` walks the model as its ``save_weights`` did, inside a
    stateless scope: nothing is assigned to the other stages' variables (their buffers are
    freed), and this stage's take the values Keras read for them. The file's optimizer
    variables are left out: Keras pairs them with an optimizer's by index, and this rank's
    optimizer holds its stage's slots only.
    """
    optimizer = getattr(model, "optimizer", None)
    held = list(part.stage.graph.variables())
    # Keras refuses a model that is not built, and tfsift never builds the model itself
    # (its layers are built by the trace): they are, which is all loading needs
    built, model.built = model.built, True
    with keras_internals.AssignmentRecorder() as recorder:
        try:
            keras.Model.load_weights(
                model, read or path, objects_to_skip=[] if optimizer is None else [optimizer]
            )
        except ValueError as err:
            raise ValueError(
                f"{path} holds neither the layers of {type(model).__name__} by attribute "
                f"(as Keras' save_weights writes a {type(model).__name__}) nor those of the "
                "functional model tfsift's save_weights writes: expected a weights file of "
                f"a model with the same layers. Received, by attribute: {err}; as the "
                f"functional model: {functional}"
            ) from err
        finally:
            model.built = built
    assigned = {id(var) for var in recorder.assigned}
    missing = [var.path for var in held if id(var) not in assigned]
    if missing:
        raise ValueError(
            f"{path} has no value for {len(missing)} weights of this rank's stage of "
            f"{model.name!r}: expected a weights file of a model with the same layers. "
            f"Received: nothing for {missing[:6]}"
        )
    for var in held:
        var.assign(recorder.get_current_value(var))


def align(graph: Graph, loaded: keras.Model, source: Path) -> dict[int, Any]:
    """``id(operation) -> loaded operation``, matching the two traced graphs node by node
    (``loaded`` is a functional model, as ``save_model`` writes)."""
    try:
        twin = Graph(tree.flatten(loaded.inputs), tree.flatten(loaded.outputs), loaded.outputs)
    except (AttributeError, ValueError) as err:
        raise ValueError(
            f"{source} must hold a functional Keras model, as tfsift.save_model writes. "
            f"Received: {type(loaded).__name__} ({err})"
        ) from err
    ours = [type(gn.operation).__name__ for gn in graph.nodes]
    theirs = [type(gn.operation).__name__ for gn in twin.nodes]
    if ours != theirs:
        raise ValueError(
            f"{source} holds a model of another structure than this one. "
            f"Received: {theirs}, this model: {ours}"
        )
    return {id(a.operation): b.operation for a, b in zip(graph.nodes, twin.nodes, strict=True)}


def _layers(graph: Graph) -> list[Any]:
    seen: dict[int, Any] = {}
    for gn in graph.nodes:
        if isinstance(gn.operation, keras.layers.Layer) and gn.operation.variables:
            seen.setdefault(id(gn.operation), gn.operation)
    return list(seen.values())


def _as_text(path: Path | None) -> str | None:
    return None if path is None else str(path)
