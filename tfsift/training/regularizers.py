"""Keras' weight regularizers (``kernel_regularizer=``, ``bias_regularizer=``, ...) in ``fit``.

Keras' train and test steps add ``model.losses`` to the loss: each regularized variable's
penalty, ``regularizer(variable)``. On a pipeline a rank holds its stage's variables only,
so each stage adds the gradient of its own variables' penalties to their gradients (under
a loss scale, scaled as the loss is), and the penalties' value, summed over the stages, to
the loss it reports; a weight tied across stages gets the gradient on every stage that
holds it (the step gave each the same sum) and counts once in the value. Penalties on
activations (``activity_regularizer``, ``add_loss``) depend on a microbatch's activations
on its stage: ``compile`` refuses a layer with an ``activity_regularizer``, the first step
of ``fit`` or ``evaluate`` a layer that called ``add_loss``. A ``@tfsift.step`` loop adds
them with ``add_weight_penalties`` after ``tfsift.allreduce``, where a Keras loop adds
``sum(model.losses)`` to its loss.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfsift.parallel import runtime
from tfsift.parallel.collectives import pipeline_sum
from tfsift.parallel.comm import allgather_object
from tfsift.pipeline.compiled import Compiled
from tfsift.training.reductions import counted_variables, stage_gradients


def check(model: keras.Model) -> None:
    """Refuses a model with a penalty ``fit`` cannot add as Keras does.

    Raises:
        ValueError: a layer with an ``activity_regularizer``, named.
    """
    for layer in model._flatten_layers(include_self=False):
        regularizer = getattr(layer, "activity_regularizer", None)
        if regularizer is not None:
            raise ValueError(
                "tfsift's fit adds the penalties of regularized weights (kernel_regularizer, "
                "bias_regularizer, ...) to the loss as Keras does, but not an "
                "activity_regularizer, which depends on each microbatch's activations on "
                "its stage. Add the penalty to the loss in a @tfsift.step loop, or "
                f"regularize the weights. Received: layer {layer.name!r} with "
                f"activity_regularizer={type(regularizer).__name__}"
            )


class Penalties:
    """This rank's stage's weight penalties, for ``fit``'s steps (made at ``compile``;
    the variables are read at the first call, after the first step partitioned the
    model)."""

    def __init__(self, model: keras.Model, optimizer: Any = None) -> None:
        self.model = model
        self.optimizer = optimizer  # its loss scale scales the penalties (None: none)
        self._add: Any = None  # the compiled (gradients, value) of the penalties
        self._indices: list[int] = []
        self._counted: list[bool] = []
        self._anywhere = False  # a regularized variable on some stage: values to sum

    def _build(self) -> None:
        """After the first step (the model partitioned, its layers called); collective."""
        variables = self.model.trainable_variables
        owned = counted_variables(self.model)
        self._indices = [i for i, v in enumerate(variables) if v.regularizer is not None]
        self._counted = [owned[i] for i in self._indices]
        chosen = [variables[i] for i in self._indices]
        scale = self.optimizer.scale_loss if self.optimizer is not None else (lambda x: x)
        # Keras' add_loss outside its own steps keeps the losses on the layer; only the
        # stage that ran it knows, so the stages tell each other (and whether any of them
        # has a penalty, else no step sums them)
        adds = [layer.name for layer in self.model._flatten_layers() if layer._losses]
        told = allgather_object(runtime.get().pipe_comm, (adds, len(chosen)))
        adds = sorted({name for names, _ in told for name in names})
        if adds:
            raise ValueError(
                "tfsift's fit adds the penalties of regularized weights to the loss as "
                "Keras does, but not the losses a layer adds in call (add_loss), which "
                "depend on each microbatch's activations on its stage. Add them to the "
                "loss in a @tfsift.step loop, or regularize the weights. Received: "
                f"add_loss in layer {', '.join(map(repr, adds))}"
            )
        self._anywhere = any(count for _, count in told)

        def penalties() -> tuple[list[tf.Tensor], tf.Tensor]:
            with tf.GradientTape() as tape:
                terms = [tf.cast(v.regularizer(v), tf.float32) for v in chosen]
                scaled = scale(tf.add_n(terms))  # as the loss is scaled
            value = tf.add_n(
                [t for t, mine in zip(terms, self._counted, strict=True) if mine] or [tf.zeros(())]
            )
            return tape.gradient(scaled, chosen), value

        self._add = Compiled(penalties, "the weights' penalties", autograph=False)

    def apply(self, grads: Sequence[Any]) -> tuple[list[Any], float]:
        """``grads`` (this stage's, averaged) with the penalties' gradients added, and the
        penalties' value over every stage of the pipeline (every stage calls it)."""
        if self._add is None:
            self._build()
        grads = list(grads)
        local = 0.0
        if self._indices:
            extra, value = self._add()
            for i, g in zip(self._indices, extra, strict=True):
                # a lookup's slices and the penalty's dense gradient sum dense, as a tape sums
                grads[i] = tf.convert_to_tensor(grads[i]) + tf.cast(g, grads[i].dtype)
            local = float(value)
        return grads, self.value(local)

    def value(self, local: float | None = None) -> float:
        """The penalties' value summed over every stage (every stage calls it)."""
        if self._add is None:
            self._build()
        if not self._anywhere:
            return 0.0
        if local is None:
            local = float(self._add()[1]) if self._indices else 0.0
        return float(pipeline_sum(np.array([local]), "add up their weights' penalties")[0])


_LOOPS: weakref.WeakKeyDictionary[keras.Model, dict[int, Penalties]] = weakref.WeakKeyDictionary()


def add_weight_penalties(
    grads: Sequence[Any], model: keras.Model, optimizer: Any = None
) -> tuple[list[tf.Tensor], float]:
    """``grads`` with the gradients of the penalties of ``model``'s regularized weights
    (``kernel_regularizer=``, ...) added, and the penalties' value: what adding
    ``sum(model.losses)`` to the loss does in a Keras loop, for a ``@tfsift.step`` loop.

    On a pipeline each rank holds its stage's weights, so the penalties cannot join the
    loss inside the step; each stage adds its own weights' after ``tfsift.allreduce``
    and before any clipping (``tfsift.clip_by_global_norm``: Keras clips the gradients of
    the whole loss); ``fit`` does this itself. Every rank of a pipeline calls it; the
    value is summed over the stages (a weight tied across stages counted once), the same
    on every rank.

    Example:
        >>> grads = tfsift.allreduce(grads)                                   # doctest: +SKIP
        >>> grads, penalty = tfsift.add_weight_penalties(grads, model, optimizer)  # doctest: +SKIP
        >>> update(grads)                                                     # doctest: +SKIP

    Args:
        grads: this rank's stage's gradients, in the order of ``model.trainable_variables``
            (tensors, or the ``StepOutput`` gradients of a step).
        model: the ``tfsift.DistributedModel`` they are the gradients of.
        optimizer: the optimizer that will apply them, when its ``scale_loss`` scaled the
            step's loss (a ``LossScaleOptimizer``): the penalties are scaled alike.

    Raises:
        ValueError: not one gradient per trainable variable.
    """
    tensors = stage_gradients(grads, model, "add_weight_penalties(grads, model)")
    made = _LOOPS.setdefault(model, {})
    key = id(optimizer)
    if key not in made:
        made[key] = Penalties(model, optimizer)
    return made[key].apply(tensors)
