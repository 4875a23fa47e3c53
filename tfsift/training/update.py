"""The optimizer's update as one compiled call, for ``fit`` and the custom loop."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

from tfsift.model import DistributedModel
from tfsift.pipeline.compiled import Compiled
from tfsift.training import reductions


def compiled_update(
    optimizer: keras.optimizers.Optimizer, model: keras.Model
) -> Callable[[Sequence[Any]], None]:
    """``optimizer``'s update of ``model``'s trainable variables, one compiled call a step.

    ``update = tfsift.compiled_update(optimizer, model)`` once, then ``update(grads)`` in
    place of ``optimizer.apply_gradients(zip(grads, model.trainable_variables))``: the same
    update. Eagerly, a Keras 3 optimizer updates each variable in Python, which on a small
    model costs more than the step itself; a ``tf.function`` of it canonicalises its
    arguments at every call, which this one skips (docs/benchmarks-log.md, Fixed cost per
    call). ``fit`` updates through it.

    The variables are read at each call, so on a pipeline they are this rank's stage's
    (``tfsift.allreduce``'s gradients are in that order); a stage without trainable
    variables gets no gradients, and ``update([])`` does nothing. The optimizer's slots
    are made eagerly at the first call, as ``apply_gradients`` makes them.

    What the optimizer computes over all gradients spans the pipeline's stages, so that
    the update equals one process's: ``global_clipnorm`` clips by the norm of every
    stage's gradients (a weight tied across stages counted once), and a
    ``keras.mixed_precision.LossScaleOptimizer`` skips the step, and lowers its scale, on
    every stage when any stage's gradients are not finite. Every rank of a pipeline must
    therefore call ``update`` at each step, a stage without variables too.

    Example:
        >>> update = tfsift.compiled_update(optimizer, model)
        >>> grads = tfsift.allreduce(grads)                  # doctest: +SKIP
        >>> update(grads)                                    # doctest: +SKIP

    Raises:
        TypeError: not a Keras optimizer, or not a Keras model.
        ValueError: (at the first update) a gradient not of its variable's shape; on a
            pipeline, an optimizer subclass with clipping, a loss-scale check or an
            ``apply_gradients`` or ``apply`` of its own, which tfsift cannot make span the
            stages (one process and replicas run them as Keras does).
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "compiled_update(optimizer, model) expects a keras.optimizers.Optimizer. "
            f"Received: {type(optimizer).__name__}"
        )
    if not isinstance(model, keras.Model):
        raise TypeError(
            "compiled_update(optimizer, model) expects a keras.Model (a "
            f"tfsift.DistributedModel). Received: {type(model).__name__}"
        )

    if isinstance(model, DistributedModel):
        # Before a step is traced: a LossScaleOptimizer's scale_loss reads its scale variable
        # once built, and bakes in its initial scale if not
        model.when_partitioned(lambda: _build(optimizer, model.trainable_variables))

    def apply_all(grads: list[Any]) -> None:
        with reductions.spanning(optimizer, model):  # a global norm over every stage's
            # as Keras' fit calls it: a subclass's own apply_gradients runs too
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    # Keras' code only: nothing for AutoGraph to convert
    apply = Compiled(apply_all, "the optimizer's update", autograph=False)
    checked: list[reductions.Bystander] = []

    def update(grads: Sequence[Any]) -> None:
        variables = model.trainable_variables
        if len(grads) != len(variables):
            raise ValueError(
                f"update(grads) expects one gradient per trainable variable of this rank's "
                f"stage of {model.name!r}, in their order ({len(variables)}). Received: "
                f"{len(grads)} gradients"
            )
        if not checked:  # the first call: the shapes stay those of the variables
            _check_shapes(grads, variables, model)
            reductions.check(optimizer)
            checked.append(reductions.Bystander(optimizer))
        if not variables:
            checked[0].update()  # the other stages' global norm adds this stage's 0
            return
        _build(optimizer, variables)  # its slots made eagerly, not inside the trace
        apply(list(grads))

    return update


def _build(optimizer: keras.optimizers.Optimizer, variables: Sequence[Any]) -> None:
    if not optimizer.built:
        optimizer.build(list(variables))


def _check_shapes(grads: Sequence[Any], variables: Sequence[Any], model: keras.Model) -> None:
    """Refuses a gradient not of its variable's shape, naming both, before Keras' own error,
    which names an operation of the optimizer."""
    for grad, var in zip(grads, variables, strict=True):
        slices = isinstance(grad, tf.IndexedSlices)
        got = tuple(grad.dense_shape.numpy()) if slices else getattr(grad, "shape", None)
        if got is not None and tuple(got) != tuple(var.shape):
            raise ValueError(
                "update(grads) expects each gradient in the shape of its variable, in the "
                f"order of the trainable variables of this rank's stage of {model.name!r}. "
                f"Received: a gradient of shape {tuple(got)} for {var.path!r} of shape "
                f"{tuple(var.shape)}"
            )
