"""DistributedModel: a Keras 3 model that tfsift splits into pipeline stages."""

from __future__ import annotations

import bisect
import dataclasses
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import tree

from tfsift import hooks
from tfsift.config import Config
from tfsift.parallel import runtime, watchdog
from tfsift.parallel.collectives import broadcast_variables
from tfsift.parallel.comm import allgather_object
from tfsift.pipeline import context
from tfsift.pipeline.chunks import Chunks
from tfsift.pipeline.stage import Stage, microbatch_seconds
from tfsift.pipeline.tied import TiedWeights, tie_stages
from tfsift.planning import keras_internals, placement
from tfsift.planning.bounds import plan_bounds
from tfsift.planning.graph import Graph, check_training_branches, ties, trace

log = logging.getLogger("tfsift")
Spec = tuple[tuple[int, ...], Any]


@dataclasses.dataclass
class Partitioned:
    """This rank's share of a partitioned model.

    ``bounds`` cut the model into K stages, or with v virtual stages into K v chunks, of
    which ``stage`` holds this rank's (s, s + K, ...: ``Chunks``); ``in_specs`` and
    ``out_specs`` are its first chunk's.
    """

    graph: Graph
    bounds: tuple[int, ...]
    stage: Chunks
    in_specs: list[Spec]
    out_specs: list[Spec]
    output_structure: Any
    config: Config  # what it was partitioned under
    tied: TiedWeights = dataclasses.field(default_factory=TiedWeights)  # weights on 2+ stages
    pipeline: str = ""  # the schedule it was planned for (what pipeline="auto" chose)
    virtual_stages: int = 1  # the chunks each rank runs (what pipeline="auto" chose)
    deferred: tuple[int, ...] | None = None  # zero_bubble's W's deferred per stage (the plan's)
    # every variable of the traced model, and the ids of those trainable when it was
    # partitioned: each stage computes the gradients of those (``check_trainable``)
    watched: tuple[Any, ...] = ()
    trainable_then: frozenset[int] = frozenset()
    # the indices of the traced model's outputs that carry a Keras mask (padding), which
    # no stage's output carries on (``tfsift.training.losses.check_output_mask``)
    masked_outputs: tuple[int, ...] = ()

    def check_trainable(self) -> None:
        """Refuses a step after a layer was frozen or unfrozen (``layer.trainable``) since
        the model was partitioned: the stages compute the gradients of the weights that
        were trainable then, which the optimizer would pair with others (fine-tuning with
        a layer frozen after the first epoch trained it on, and moved the others by its
        gradients). Every rank holds every layer's flags, so each raises alike.

        Raises:
            ValueError: a variable's ``trainable`` differs from when the model was
                partitioned.
        """
        changed = [v for v in self.watched if v.trainable != (id(v) in self.trainable_then)]
        if changed:
            now = ", ".join(f"{v.path} (trainable={v.trainable})" for v in changed)
            raise ValueError(
                "a layer's trainable flag changed after the model was partitioned; tfsift "
                "fixes each stage's trainable weights when it partitions the model (its first "
                "step). Set trainable before the first step: for fine-tuning, save the weights "
                "(model.save_weights or a CheckpointManager) and load them into a new model "
                f"with the layers frozen. Received: {now}"
            )


# The trainable variables of this process's stages of pipelines (K > 1), by id: an optimizer
# given only these holds one stage's gradients (`_refuse_one_stage` refuses an update of
# them that would take its global norm or finite check over that stage alone).
_STAGE_VARIABLES: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def _on_a_pipeline(variables: Sequence[Any]) -> bool:
    """Whether any of ``variables`` is a trainable variable of a stage of a pipeline."""
    return any(_STAGE_VARIABLES.get(id(v)) is v for v in variables)


def _refuse_one_stage(optimizer: Any, variables: Sequence[Any]) -> None:
    """Keras' ``apply`` of a pipeline stage's variables outside ``compiled_update``: refused
    where its global norm or finite check would see this stage's gradients alone.

    Raises:
        ValueError: saying what would differ from one process and what to call instead.
    """
    if not variables or not _on_a_pipeline(variables):
        return
    clips, finite = keras_internals.spans_stages(optimizer)
    if clips and finite:
        return
    name = type(optimizer).__name__
    if not finite:
        inner = type(optimizer.inner_optimizer).__name__
        raise ValueError(
            "on a pipeline, a LossScaleOptimizer's own apply (apply_gradients) would skip a "
            "step on the stages whose gradients are not finite and take it on the others. "
            "Update with update = tfsift.compiled_update(optimizer, model), or fit, which "
            "skip it on every stage when any stage's gradients are not finite. Received: "
            f"{name}({inner}) updating a stage's variables"
        )
    raise ValueError(
        "on a pipeline, an optimizer's own apply (apply_gradients) with global_clipnorm "
        "would clip this stage's gradients by their own norm, not the whole model's. Update "
        "with update = tfsift.compiled_update(optimizer, model), or fit, which clip by the "
        "norm over every stage, or clip with tfsift.clip_by_global_norm(grads, clip_norm, "
        f"model) and pass an optimizer without global_clipnorm. Received: {name}("
        f"global_clipnorm={optimizer.global_clipnorm}) updating a stage's variables"
    )


# here, where the stages' variables are listed: a loop that never imports tfsift.training
# (no fit, no compiled_update) is checked too
keras_internals.check_before_apply(_refuse_one_stage)


@dataclasses.dataclass
class _ModelState:
    placements: dict[int, int] = dataclasses.field(default_factory=dict)
    partitioned: Partitioned | None = None
    # run once, on every rank, right after the model is partitioned (when_partitioned)
    on_partitioned: list[Callable[[], None]] = dataclasses.field(default_factory=list)


class DistributedModel(keras.Model):  # type: ignore[misc]
    """A Keras 3 model whose layers tfsift spreads over ``partitions`` pipeline stages.

    Subclass it like ``keras.Model`` (define layers in ``__init__``, the forward in
    ``call``) and call it only inside a ``@tfsift.step`` function. At the first
    step the model is traced, profiled and partitioned; each rank then keeps only
    its stage, and ``trainable_variables`` lists only that stage's variables.

    Example:
        >>> class Net(DistributedModel):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.dense = keras.layers.Dense(10)
        ...     def call(self, x):
        ...         return self.dense(x)

    A functional model (``keras.Model(inputs, outputs)``) is cut layer by layer when a
    subclass holds it and calls it: ``self.net = keras.Model(inputs, outputs)`` in
    ``__init__``, ``return self.net(x)`` in ``call``.

    Raises:
        TypeError: ``DistributedModel(inputs, outputs)``, Keras' functional constructor.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) == 2 or {"inputs", "outputs"} <= set(kwargs) or (args and "outputs" in kwargs):
            # Keras would turn this class into a functional one, which the trace cannot cut
            raise TypeError(
                "tfsift.DistributedModel is subclassed (layers in __init__, the forward in "
                "call), not built from inputs and outputs: hold the functional model in a "
                "subclass, self.net = keras.Model(inputs, outputs), and return self.net(x) "
                "from call. Received: DistributedModel(inputs, outputs)"
            )
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "_tfsift", _ModelState())

    def __setattr__(self, name: str, value: Any) -> None:
        index = placement.current()
        state = self.__dict__.get("_tfsift")
        if index is not None and state is not None:
            for layer in tree.flatten(value) if isinstance(value, (list, tuple, dict)) else [value]:
                if isinstance(layer, keras.layers.Layer):
                    state.placements[id(layer)] = index
        super().__setattr__(name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ctx = context.current()
        if ctx is None:
            raise RuntimeError(
                f"DistributedModel {self.name!r} can only be called inside a @tfsift.step "
                "function (its layers run on the ranks of the pipeline); to compute its "
                "outputs for data, call model.predict(x) on every rank"
            )
        if not (tf.executing_eagerly() or ctx.compiled):
            raise RuntimeError(context.GRAPH_MODE_ERROR)
        return ctx.model_call(self, args, kwargs)

    def when_partitioned(self, callback: Callable[[], None]) -> None:
        """Calls ``callback()`` once the model is partitioned (at once if it is already), on
        every rank, after this rank's stage is built and before any step runs on it.

        What depends on this rank's share of the model goes here: ``compiled_update`` builds
        the optimizer for the stage's variables, so that a step traced afterwards reads a
        ``LossScaleOptimizer``'s scale variable rather than its initial value.

        Example:
            >>> model.when_partitioned(lambda: optimizer.build(model.trainable_variables))
        """
        if self.partitioned is not None:
            callback()
        else:
            self._tfsift.on_partitioned.append(callback)

    @property
    def losses(self) -> list[Any]:
        """Keras' ``losses``, of the weights this rank holds: once the model is cut into
        stages, its own stage's penalties only (``tfsift.add_weight_penalties`` gives every
        stage's sum). Refused inside a ``@tfsift.step`` function, where a stage holds its
        own weights only (``tfsift.add_weight_penalties`` adds their penalties after the
        step)."""
        if context.current() is not None:
            raise ValueError(
                "model.losses cannot join the loss inside a @tfsift.step function: on a "
                "pipeline each stage holds only its own weights. Leave the penalties out "
                "of the loss and add them after tfsift.allreduce with grads, penalty = "
                "tfsift.add_weight_penalties(grads, model, optimizer) (fit adds them "
                f"itself). Received: {self.name}.losses read inside a step function"
            )
        return super().losses  # type: ignore[no-any-return]

    @property
    def partitioned(self) -> Partitioned | None:
        """This rank's stage once the model has been partitioned, else None."""
        return self._tfsift.partitioned  # type: ignore[no-any-return]

    @property
    def trainable_variables(self) -> list[Any]:
        """Once partitioned, the trainable variables of this rank's stage only (the
        order ``tfsift.gradients`` returns their gradients in); before, Keras' list."""
        part = self.partitioned
        return list(part.stage.variables) if part else list(super().trainable_variables)

    @property
    def trainable_weights(self) -> list[Any]:
        """The same list as ``trainable_variables``."""
        return self.trainable_variables

    @property
    def non_trainable_variables(self) -> list[Any]:
        """Once partitioned, the other variables of this rank's stage (BatchNorm
        statistics, random seed states); before, Keras' list."""
        part = self.partitioned
        if part is None:
            return list(super().non_trainable_variables)
        return list(part.stage.state_variables)

    @property
    def non_trainable_weights(self) -> list[Any]:
        """The same list as ``non_trainable_variables``."""
        return self.non_trainable_variables

    @property
    def variables(self) -> list[Any]:
        """Once partitioned, every variable of this rank's stage; before, Keras' list."""
        part = self.partitioned
        return list(part.stage.graph.variables()) if part else list(super().variables)

    @property
    def weights(self) -> list[Any]:
        """The same list as ``variables``."""
        return self.variables

    def partition_model(self, example: Sequence[tf.Tensor]) -> Partitioned:
        """Traces, plans and splits the model for inputs shaped like ``example`` (one microbatch):
        the model call's positional arguments, each a tensor or a nest of tensors.

        Called by the first step; every rank must call it (the plan is broadcast from rank 0).
        """
        rt = runtime.get()
        if self.partitioned is not None:
            _check_same_partitioning(self.partitioned.config, rt.config)
            self.partitioned.check_trainable()  # a new step function's first call
            return self.partitioned
        _refuse_own_weights(self)
        norms = _batch_norms(self)
        _refuse_synchronized_statistics(norms, rt.topology.replicas)
        if rt.rank == 0:
            _say_microbatch_statistics(norms, rt.config.microbatches, example)
            _say_microbatch_draws(self, rt.config.microbatches)
        graph = trace(self, example)
        check_training_branches(self, example)  # every rank, before the plan
        graph.find_masks(example)  # every rank, before it frees the other stages' weights
        masked = tuple(
            i
            for i, t in enumerate(tree.flatten(graph.structure))
            if getattr(t, "_keras_mask", None) is not None
        )
        if rt.rank == 0 and masked:  # fit refuses such a model (check_output_mask); a loop is told
            log.warning(
                "the output of %r carries a Keras mask (padding), which a Keras loss in one "
                "process weighs by; the outputs of a @tfsift.step carry none, so a loss there "
                "counts the masked positions: weigh it by the padding yourself",
                self.name,
            )
        flat = [tf.convert_to_tensor(x) for x in tree.flatten(list(example))]
        layout = plan_bounds(
            graph,
            self._tfsift.placements,
            flat,
            rt,
            reservation=hooks.stage0_reservation(self),  # room for work of a feature's
            stage_call=microbatch_seconds,
        )
        bounds, recompute, v = layout.bounds, layout.recompute, layout.virtual_stages
        K, s = rt.topology.partitions, rt.stage
        shared = ties(graph, bounds, K if v > 1 else None)
        chunks = range(s, len(bounds) - 1, K)  # s alone, or s, s + K, ... (virtual stages)
        stage = Chunks(
            [Stage(graph.stage(bounds[c], bounds[c + 1]), c, recompute=recompute) for c in chunks]
        )
        tied = tie_stages(shared, stage.variables, rt.pipe_comm, s, rt.config.timeout)
        _release_other_stages(graph, stage.graph, bounds, K, f"rank {rt.rank} (stage {s})")
        # Replicas must start equal; the optimizer's slots are created equal (zeros) later.
        broadcast_variables(stage.graph.variables())
        first = stage.stages[0].graph
        whole = graph.stage(0, len(graph))  # every stage's layers (this rank keeps only its own)
        part = Partitioned(
            graph,
            bounds,
            stage,
            _specs(graph, first.inputs),
            _specs(graph, first.outputs),
            graph.structure,
            rt.config,
            tied,
            layout.pipeline,
            v,
            layout.deferred,
            tuple(whole.variables()),
            frozenset(id(var) for var in whole.trainable_variables()),
            masked,
        )
        self._tfsift.partitioned = part
        if K > 1:
            _STAGE_VARIABLES.update((id(v), v) for v in part.stage.variables)
        held = ", ".join(f"{bounds[c]}..{bounds[c + 1] - 1}" for c in chunks)
        log.info("rank %d holds stage %d: nodes %s", rt.rank, s, held)
        callbacks, self._tfsift.on_partitioned = self._tfsift.on_partitioned, []
        for callback in callbacks:
            callback()
        return part

    # ---- Keras' save paths on a partitioned model (issues 14, 33) -----------------------------
    # After partitioning a rank holds only its stage's weights (the others are freed), so
    # save, save_weights and load_weights become collectives that gather the stages
    # (tfsift.training.saving): every rank calls them, as Keras callbacks do.
    # count_params and summary describe every stage from the traced graph.

    def save(self, filepath: Any, overwrite: bool = True, **kwargs: Any) -> Any:
        """Keras' ``save``. Partitioned: collective (every rank calls it, as
        ``ModelCheckpoint`` does), it writes one ordinary ``.keras`` file of the whole model
        on rank 0 (``tfsift.save_model``)."""
        if self.partitioned is None:
            return super().save(filepath, overwrite=overwrite, **kwargs)
        from tfsift import training

        training.save(self, filepath, overwrite)
        return None

    def save_weights(self, filepath: Any, overwrite: bool = True, **kwargs: Any) -> Any:
        """Keras' ``save_weights``. Partitioned: collective, it writes one ``.weights.h5``
        file of the whole model's weights on rank 0; ``load_weights`` reads it back."""
        if self.partitioned is None:
            return super().save_weights(filepath, overwrite=overwrite, **kwargs)
        from tfsift import training

        training.save_weights(self, filepath, overwrite)
        return None

    def load_weights(self, filepath: Any, *args: Any, **kwargs: Any) -> Any:
        """Keras' ``load_weights``, collective: a ``.keras`` or ``.weights.h5`` file (tfsift's,
        or one Keras saved of a model with these layers, its class registered or not), or a
        tfsift checkpoint directory, into a model that has run a step (``fit``,
        ``predict`` or a ``@tfsift.step`` call); before that, ``tfsift.load_weights(model,
        path, example=...)`` partitions it first."""
        from tfsift import training

        training.load_weights(self, filepath)

    def get_weights(self) -> list[np.ndarray]:
        """Keras' ``get_weights``: the whole model's weights as NumPy arrays, in Keras' order
        (``model.weights`` before partitioning), on every rank.

        Partitioned: collective over the pipeline (every rank of it calls it, or the job
        ends after ``timeout``): each stage contributes its variables (a weight tied
        across stages once, from its owner). It holds every stage's weights at once; for a
        model too big for that, save with ``tfsift.save_model`` or a checkpoint instead.
        """
        part = self.partitioned
        if part is None:
            return list(super().get_weights())
        every = list(keras.Model.weights.fget(self))  # every stage's, freed or not
        held = {id(v) for v in part.stage.graph.variables()}
        mine = {i: np.asarray(v.numpy()) for i, v in enumerate(every) if id(v) in held}
        rt = runtime.get()

        def late() -> str:
            return "the other stages of its pipeline to call get_weights (a collective)"

        with watchdog.guard(rt.config.timeout, late):
            found: dict[int, np.ndarray] = {}
            for values in allgather_object(rt.pipe_comm, mine):
                found.update(values)
        return [found[i] if i in found else np.asarray(v.numpy()) for i, v in enumerate(every)]

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Keras' ``set_weights``: ``weights`` for the whole model, in Keras' order (as
        ``get_weights`` returns them). Partitioned, each rank assigns its stage's share, so
        every rank must pass the same list; nothing is sent between ranks.

        Raises:
            ValueError: not one array per weight of the whole model, or a shape differs
                (checked for all before any is assigned); before the first step, arrays
                for weights the layers have not made yet (they are built when the model
                is traced, at its first step).
        """
        if self.partitioned is None:
            built = list(keras.Model.weights.fget(self))
            if len(weights) != len(built):
                # the layers are built by the trace at the first step: before it Keras
                # counts only the weights of layers built by hand (none, usually)
                raise ValueError(
                    f"set_weights of the whole model needs DistributedModel {self.name!r} "
                    "partitioned, which happens at its first step (fit, predict or a "
                    "@tfsift.step call), when its layers make their weights: call it after a "
                    "step, or load a file with tfsift.load_weights(model, path, example=<a "
                    f"batch of inputs>). Received: {len(weights)} arrays for the {len(built)} "
                    "weights its layers have made so far"
                )
            super().set_weights(weights)
            return
        every = list(keras.Model.weights.fget(self))
        if len(weights) != len(every):
            raise ValueError(
                f"set_weights expects one array per weight of the whole model {self.name!r}, "
                f"every stage's, in Keras' order ({len(every)}). Received: {len(weights)} arrays"
            )
        for var, value in zip(every, weights, strict=True):
            if tuple(var.shape) != tuple(np.shape(value)):
                raise ValueError(
                    f"set_weights was given another shape for {var.path!r} than the model's. "
                    f"Received: {tuple(np.shape(value))}, model {tuple(var.shape)}"
                )
        for var, value in zip(every, weights, strict=True):
            if not keras_internals.is_freed(var):  # this stage's (the others' are freed)
                var.assign(value)

    def export(self, filepath: Any, format: str = "tf_saved_model", **kwargs: Any) -> Any:
        """Keras' ``export`` (a TensorFlow SavedModel for serving, by default).
        Partitioned: collective, rank 0 exports the whole model, gathered from the stages
        (the functional model ``tfsift.save_model`` writes)."""
        if self.partitioned is None:
            return super().export(filepath, format=format, **kwargs)
        from tfsift import training

        training.export_model(self, filepath, format=format, **kwargs)
        return None

    def count_params(self) -> int:
        """The number of weights of the whole model, every stage's (as Keras counts them)."""
        part = self.partitioned
        if part is None:
            return int(super().count_params())
        return sum(self._tfsift_params(node.operation) for node in self._tfsift_first_uses())

    def summary(self, *args: Any, print_fn: Any = None, **kwargs: Any) -> None:
        """Keras' summary; a partitioned model lists its nodes by stage and says which
        layers each stage (and this rank) holds."""
        part = self.partitioned
        if part is None:
            super().summary(*args, print_fn=print_fn, **kwargs)
            return
        for line in self._tfsift_summary(part):
            (print_fn or print)(line)

    def _tfsift_first_uses(self) -> list[Any]:
        """The traced nodes that first call each operation (a shared layer counts once)."""
        part = self.partitioned
        seen: set[int] = set()
        first = []
        for node in part.graph.nodes if part else []:
            if id(node.operation) not in seen:
                seen.add(id(node.operation))
                first.append(node)
        return first

    @staticmethod
    def _tfsift_params(operation: Any) -> int:
        total = 0
        for weight in getattr(operation, "weights", []):
            size = 1
            for dim in weight.shape:
                size *= int(dim)
            total += size
        return total

    def _tfsift_summary(self, part: Partitioned) -> list[str]:
        first = {id(node) for node in self._tfsift_first_uses()}
        v = part.virtual_stages
        word = "stage" if v == 1 else "chunk"  # with virtual stages, rows of chunks
        rows, held = [(word, "node", "layer", "output shape", "params")], []
        mine_ = {stage.index for stage in part.stage.stages}  # one, or this rank's chunks
        for s in range(len(part.bounds) - 1):
            nodes = part.graph.nodes[part.bounds[s] : part.bounds[s + 1]]
            params = 0
            for node in nodes:
                n = self._tfsift_params(node.operation) if id(node) in first else 0
                params += n
                shapes = [(None, *part.graph.tensors[t].shape[1:]) for t in node.outputs]
                shape = str(shapes[0] if len(shapes) == 1 else shapes)
                rows.append((str(s), node.name, type(node.operation).__name__, shape, f"{n:,}"))
            mine = "  <- this rank" if s in mine_ else ""
            names = ", ".join(node.name for node in nodes)
            held.append(f"{word} {s}: {names} ({params:,} params){mine}")
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        table = [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
        ]
        chunks = f" (virtual_stages={v}: chunks {', '.join(map(str, sorted(mine_)))})"
        title = (
            f'Model "{self.name}": partitions={(len(part.bounds) - 1) // v}; this rank holds '
            f"stage {part.stage.index}{chunks if v > 1 else ''}"
        )
        total = f"Total params: {self.count_params():,} (all stages)"
        return [title, *table, *held, total]

    # ---- end of Keras' save paths -------------------------------------------------------------

    # ---- Keras' training API: compile, fit, evaluate, predict (issue 15) ----------------------
    # Thin: tfsift.training (a higher layer) holds the loops; it is imported here lazily,
    # so that the model module does not depend on it at import time.

    def compile(self, optimizer: Any = "rmsprop", loss: Any = None, **kwargs: Any) -> None:
        """Keras' ``compile``; also builds the pipelined steps that ``fit`` runs.

        As in Keras, ``fit`` and ``evaluate`` add the penalties of regularized weights
        (``kernel_regularizer``, ``bias_regularizer``, ...) to the loss, each stage its
        own weights'; an ``activity_regularizer`` is refused here and a layer's
        ``add_loss`` at the first step (each would need every microbatch's activations on
        its stage).

        Example:
            >>> model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
            ...               metrics=["accuracy"])

        A model of several outputs (a list, a tuple or a dict of them, on any stages)
        takes what Keras takes: one loss for every output, or a list or dict of losses,
        with ``loss_weights`` and metrics per output; ``fit`` and ``evaluate`` log the
        total ``loss`` and each loss as Keras names it (``{output}_loss``), and ``y`` holds
        a target per output. A loss that ignores a class
        (``SparseCategoricalCrossentropy(ignore_class=...)``), which Keras divides by the
        targets it does not ignore, is divided by their count over the whole batch, every
        replica's, as in one process.

        Raises:
            ValueError: a layer with an ``activity_regularizer``; a loss that ignores a
                class among several outputs' losses, where the batch is split into
                microbatches or replicas; a loss whose
                ``reduction`` is not Keras' default ``"sum_over_batch_size"`` (``fit``
                averages the microbatches' losses, which is the batch's loss only then);
                at ``fit``'s first step, a loss function that returns one value for the
                whole batch instead of one per sample, where the batch is split into
                microbatches or replicas (a sum, or a loss over pairs of samples, would
                train otherwise than in one process); at the first batch of ``fit`` or
                ``evaluate``, before any update, a loss whose value for a sample depends
                on the batch's other samples (in-batch negatives), where it is split.
        """
        from tfsift import training

        training.compile_model(self, optimizer=optimizer, loss=loss, **kwargs)

    def fit(self, x: Any = None, y: Any = None, **kwargs: Any) -> Any:
        """Keras' ``fit``, pipelined and data-parallel.

        Every rank runs it; the ``History`` is the same on every rank (the loss averaged
        over the replicas, the metrics computed over every replica's samples, as Keras'
        distribution strategies combine their states) and the progress bar shows on rank
        0 only.

        Example:
            >>> model.fit(tfsift.shard(ds).batch(32, drop_remainder=True), epochs=3)

        Args:
            x: a dataset of ``(x, y)`` or ``(x, y, sample_weight)`` batches, its batch
                size divisible by ``microbatches``; or input arrays, read as
                ``tfsift.from_arrays`` does (permuted each epoch unless ``shuffle=False``,
                seeded by ``keras.utils.set_random_seed``'s seed on rank 0, else 0;
                dealt to the replicas, ``n // R`` each, batches of ``batch_size``, default
                32, gathered by row; as Keras', an epoch ends with a partial batch of the
                rest; with ``sift``, the rest is left out). A last, smaller batch that does
                not split into the microbatches is padded with copies of its last sample
                weighed 0 (its own samples' weights scaled so that the loss and gradients
                are their mean). ``batch_size`` is each replica's,
                as in Horovod and ``tfsift.shard(ds).batch(B)``: a step over R replicas
                takes R times it (Keras' distribution strategies take it as the step's
                whole batch). A ``keras.utils.PyDataset`` or a
                generator, which Keras also reads, is refused: make it a ``tf.data.Dataset``.
            y: the targets, with input arrays.
            **kwargs: Keras' ``fit`` arguments, all of them: ``batch_size``, ``shuffle``,
                ``sample_weight`` and ``validation_split`` (the last samples, with arrays),
                ``class_weight``, ``epochs``, ``verbose``, ``callbacks`` (Keras' own work:
                see ``tfsift.callbacks``), ``validation_data``, ``initial_epoch``,
                ``steps_per_epoch``, ``validation_steps``, ``validation_batch_size``,
                ``validation_freq``; and ``sift`` (a ``tfsift.SiftConfig``: train on the
                batches ``tfsift.sift`` keeps, scored with the compiled loss per sample, a
                sequence's averaged over the tokens its sample weights count;
                ``sift=tfsift.SiftConfig(policy="infobatch")`` is InfoBatch over ``fit``'s
                ``epochs``). A sifted epoch's progress bar counts the batches it trained,
                and ``History`` gets its kept fraction, ``sift_kept``.

        Returns:
            A ``keras.callbacks.History``.

        Raises:
            ValueError: a training dataset whose batches do not split into
                ``microbatches`` (validation's may); targets
                that do not match a model's outputs (at the first step); a model class
                that overrides Keras' ``train_step``, ``test_step``, ``compute_loss``,
                ``compute_metrics`` or ``get_metrics_result`` (tfsift runs its own step);
                a ``validation_freq`` neither an int >= 1 nor a list of epochs;
                ``validation_split`` with a dataset; ``class_weight`` with ``sift``;
                ``sift`` with ``policy="infobatch"`` and other ``epochs`` than ``fit``'s;
                callbacks that differ between ranks (other than those that show or write
                on rank 0 alone: a callback that stops training on one rank stops every
                rank, at the same batch or epoch), or a model compiled with another
                optimizer configuration or loss on some ranks.
            TypeError: ``keras.callbacks.BackupAndRestore`` (use tfsift's).
            RuntimeError: the model was not compiled.
        """
        from tfsift import training

        with training.quiet_elsewhere():  # Keras' own messages: once
            return training.fit(self, x, y, **kwargs)

    def evaluate(self, x: Any = None, y: Any = None, **kwargs: Any) -> Any:
        """Keras' ``evaluate`` (``batch_size``, ``sample_weight``, ``verbose``, ``steps``,
        ``callbacks``, ``return_dict``): the loss averaged over the replicas, the metrics
        over every replica's samples. Every sample is taken, as Keras takes them, in batches
        of any size: a batch that does not split into ``microbatches`` (a dataset's last,
        the rows of arrays that whole batches leave, or fewer than a batch) is padded with
        copies of its last sample weighed 0, its own samples' weights scaled so that the
        loss is their mean. Arrays are dealt to the
        replicas, ``n // R`` each: rank 0 warns of the few that leaves out. ``fit``'s
        validation is taken alike."""
        from tfsift import training

        with training.quiet_elsewhere():  # Keras' own messages: once
            return training.evaluate(self, x, y, **kwargs)

    def predict(self, x: Any = None, **kwargs: Any) -> Any:
        """Keras' ``predict`` (``batch_size``, ``verbose``, ``steps``, ``callbacks``): NumPy
        predictions, on every rank of the pipeline, one per sample whatever the batch sizes
        (a batch that does not split into ``microbatches`` is padded with copies of its
        last sample, whose predictions are dropped). Needs no ``compile``."""
        from tfsift import training

        with training.quiet_elsewhere():  # Keras' own messages: once
            return training.predict(self, x, **kwargs)

    def train_on_batch(
        self,
        x: Any,
        y: Any = None,
        sample_weight: Any = None,
        class_weight: Any = None,
        return_dict: bool = False,
    ) -> Any:
        """Keras' ``train_on_batch``: one optimizer step on this replica's batch (every
        rank of a pipeline passes the same one). Returns the batch's loss and metrics,
        combined over the replicas as ``fit``'s; unlike Keras, the metrics restart at each
        call."""
        from tfsift import training

        return training.train_on_batch(self, x, y, sample_weight, class_weight, return_dict)

    def test_on_batch(
        self, x: Any, y: Any = None, sample_weight: Any = None, return_dict: bool = False
    ) -> Any:
        """Keras' ``test_on_batch``: the batch's loss and metrics, combined over the replicas
        as ``evaluate``'s."""
        from tfsift import training

        return training.test_on_batch(self, x, y, sample_weight, return_dict)

    def predict_on_batch(self, x: Any) -> Any:
        """Keras' ``predict_on_batch``: NumPy predictions of one batch, of any size (padded
        as ``predict`` pads). Needs no ``compile``."""
        from tfsift import training

        return training.predict_on_batch(self, x)

    # ---- end of Keras' training API -----------------------------------------------------------


def _release_other_stages(graph: Graph, sub: Any, bounds: Sequence[int], K: int, here: str) -> None:
    """Frees the weights of layers this rank does not run, so a rank holds only its stage;
    reading one says which stage holds it."""
    keep = {id(v) for v in sub.variables()}
    for i, gn in enumerate(graph.nodes):
        holder = (bisect.bisect_right(bounds, i) - 1) % K  # chunk c runs on stage c % K
        for var in getattr(gn.operation, "variables", []):
            if id(var) not in keep and not keras_internals.is_freed(var):
                keras_internals.free(
                    var,
                    f"{var.path} is a weight of stage {holder}, which {here} does not hold: "
                    "read the whole model's weights with model.get_weights() (on every "
                    f"rank), and read or assign this one on the ranks of stage {holder} "
                    f"(where tfsift.mp_rank() == {holder})",
                )


def _specs(graph: Graph, ids: Sequence[int]) -> list[Spec]:
    return [(tuple(graph.tensors[t].shape[1:]), graph.tensors[t].dtype) for t in ids]


_PARTITIONING = (
    "partitions",
    "virtual_stages",
    "optimize",
    "placement_strategy",
    "auto_partition",
    "default_partition",
)


def _check_same_partitioning(made: Config, now: Config) -> None:
    """A partitioned model cannot follow a tfsift.init that changed how it is cut."""
    changed = [k for k in _PARTITIONING if getattr(made, k) != getattr(now, k)]
    if changed:
        raise RuntimeError(
            "this DistributedModel was partitioned under "
            + ", ".join(f"{k}={getattr(made, k)!r}" for k in changed)
            + " and tfsift.init was called again since; create the model after the last "
            "tfsift.init. Received: " + ", ".join(f"{k}={getattr(now, k)!r}" for k in changed)
        )


def _batch_norms(model: keras.Model) -> list[keras.layers.BatchNormalization]:
    """The model's BatchNormalization layers, which compute over the batch in training."""
    return [
        layer
        for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, keras.layers.BatchNormalization)
    ]


def _refuse_own_weights(model: DistributedModel) -> None:
    """A weight the model makes itself (``self.add_weight``), not one of its layers', is
    held by no node of the traced graph: no stage would have it, train it or update it
    (a probe's ran its steps with such a weight left as it was). Refused on every rank,
    before any step.

    Raises:
        ValueError: the model owns variables, or defines a ``build``, of its own.
    """
    own = [v.path for v in (*model._trainable_variables, *model._non_trainable_variables)]
    if type(model).build is not keras.Model.build:  # what a build of its own would make
        own.append(f"those {type(model).__name__}.build makes (tfsift never calls it)")
    if own:
        raise ValueError(
            f"{type(model).__name__} makes weights of its own (self.add_weight), which tfsift "
            "cannot place: a stage holds the weights of the layers its part of call runs, and "
            "these belong to no layer. Make them a layer's (a keras.layers.Layer that creates "
            "them in its build and uses them in its call) and call that layer. Received: "
            + ", ".join(own)
        )


def _say_microbatch_statistics(
    norms: Sequence[keras.layers.BatchNormalization], M: int, example: Sequence[Any]
) -> None:
    """Rank 0 says, once per model, that its BatchNormalization layers ``norms`` normalize
    by each microbatch's statistics in training: with M > 1 a step's batch reaches them M
    calls of its microbatches, as in GPipe and torch's pipelining, where one Keras process
    with the same batch normalizes by the whole batch's."""
    if M == 1 or not norms:
        return
    rows = tree.flatten(list(example))[0].shape[0]
    log.info(
        "BatchNormalization layers (%s) normalize by each microbatch's statistics in "
        "training (%s samples a call, microbatches=%d), not by the whole batch's",
        ", ".join(layer.name for layer in norms),
        rows,
        M,
    )


def _say_microbatch_draws(model: DistributedModel, M: int) -> None:
    """Rank 0 says, once per model, that its random layers (``Dropout``, ``GaussianNoise``,
    ...) draw a microbatch's values at a time: with M > 1 they are other draws than one
    Keras process makes for the same batch (alike in distribution), so training differs
    from it by the draws. Recomputation repeats a microbatch's own draws exactly."""
    drawing = [
        layer.name
        for layer in model._flatten_layers(include_self=False)
        if not layer._flatten_layers(include_self=False)  # its own draws: a leaf's
        and keras_internals.seed_states(layer)
        and getattr(layer, "rate", 1) != 0  # an attention's dropout of 0 draws nothing
        # an LSTM's or GRU's cell without dropout draws nothing either
        and (getattr(layer, "dropout", 1), getattr(layer, "recurrent_dropout", 1)) != (0, 0)
    ]
    if M == 1 or not drawing:
        return
    log.info(
        "random layers (%s) draw their values for each microbatch (microbatches=%d): other "
        "draws than one process makes for the whole batch, alike in distribution",
        ", ".join(drawing),
        M,
    )


def _refuse_synchronized_statistics(
    norms: Sequence[keras.layers.BatchNormalization], replicas: int
) -> None:
    """Keras' ``BatchNormalization(synchronized=True)`` asks for the statistics of every
    replica's batch, which tfsift's replicas do not share: refused rather than run as
    ``synchronized=False`` without a word (every rank raises, before any training)."""
    if replicas == 1:
        return
    for layer in norms:
        if layer.synchronized:
            raise ValueError(
                "BatchNormalization(synchronized=True) normalizes by the statistics of every "
                "replica's batch, which tfsift's data-parallel replicas do not share (each "
                "normalizes by its own microbatches, as with synchronized=False). Pass "
                "synchronized=False, or train on one replica. Received: layer "
                f"{layer.name!r} with synchronized=True on {replicas} replicas"
            )
