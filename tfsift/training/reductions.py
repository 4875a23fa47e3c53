"""What an optimizer reduces over all of a model's gradients, computed over every stage.

Keras' ``global_clipnorm`` clips by the norm of the gradients ``apply`` is given, and a
``LossScaleOptimizer`` skips the step when any of them is not finite. On a pipeline a
rank gives its optimizer its stage's gradients only: left alone, each stage would clip
by its own norm and decide its own skip, and the run would part from one process's
without a word. ``compiled_update`` traces the update with both taken over the
pipeline instead (the sum of every stage's squares; whether every stage's gradients are
finite), so the optimizer clips and skips as it does in one process. A weight tied
across stages counts once, on its owner. Replicas need nothing more: after
``tfsift.allreduce`` they hold the same averaged gradients.

The two pipeline sums run inside the compiled update (``tf.py_function``), where Keras
asks for them: the clipping of accumulated gradients (``gradient_accumulation_steps``)
happens only on the steps that update, in a branch of the graph, and a skipped step
(non-finite gradients anywhere) clips nothing, on every stage alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfsift.model import DistributedModel
from tfsift.parallel import runtime
from tfsift.parallel.collectives import as_tensors, pipeline_sum
from tfsift.planning import autodiff, keras_internals


def check(optimizer: keras.optimizers.Optimizer) -> None:
    """Refuses, on a pipeline, an optimizer whose reductions over all gradients tfsift
    cannot make span the stages (a subclass with clipping, a finite check or an update of
    its own that sees every gradient at once: ``keras_internals.WHOLE_UPDATE``).

    Raises:
        ValueError: naming the optimizer and what it overrides.
    """
    if runtime.get().topology.partitions == 1:
        return
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    clipping = optimizer.inner_optimizer if scaled else optimizer
    if keras_internals.clips_by_global_norm(clipping) and not keras_internals.keras_clipping(
        clipping
    ):
        raise ValueError(
            "on a pipeline, global_clipnorm must clip by the norm over every stage's "
            f"gradients, which tfsift computes for Keras' own clipping only; "
            f"{type(clipping).__name__} overrides _clip_gradients. Clip in the loop with "
            "tfsift.clip_by_global_norm(grads, clip_norm, model) and pass an optimizer "
            f"without global_clipnorm. Received: {type(clipping).__name__}("
            f"global_clipnorm={clipping.global_clipnorm})"
        )
    if scaled and not keras_internals.keras_finite_check(optimizer):
        raise ValueError(
            "on a pipeline, a LossScaleOptimizer must skip a step when any stage's "
            "gradients are not finite, which tfsift decides for Keras' own "
            f"LossScaleOptimizer only. Received: {type(optimizer).__name__}, which overrides "
            "check_finite or apply"
        )
    overridden = keras_internals.own_overrides(optimizer)
    if scaled:
        overridden += keras_internals.own_overrides(clipping)
    if overridden:
        raise ValueError(
            "on a pipeline each stage's optimizer is given that stage's gradients only, so "
            "an override of apply_gradients, apply or _clip_gradients, which may compute over "
            "all of them (a norm, a finite check), would compute over one stage's. Move what "
            "treats each variable alone into update_step, and clip over every stage's "
            "gradients in the loop with tfsift.clip_by_global_norm(grads, clip_norm, model). "
            f"Received: {type(optimizer).__name__}, which overrides {', '.join(overridden)}"
        )


@contextlib.contextmanager
def spanning(optimizer: keras.optimizers.Optimizer, model: keras.Model) -> Iterator[None]:
    """While ``optimizer.apply`` is traced inside the block, its global norm and its
    loss scale's finite check span the pipeline (nothing changes with one stage)."""
    if runtime.get().topology.partitions == 1:
        yield
        return
    counted = counted_variables(model)
    with keras_internals.global_reductions(optimizer, _norm(counted), _finite):
        yield


class Bystander:
    """Takes a stage without trainable variables through the pipeline sums its optimizer's
    update would make, so that the other stages' update never waits for it.

    Such a stage applies nothing (Keras' ``apply`` of no gradients returns at once), but
    the other stages' loss-scale check and global norm are sums over every stage: it adds
    "finite" and a norm of 0 where Keras would ask, counting updates as the optimizer
    counts its iterations for ``gradient_accumulation_steps``.
    """

    def __init__(self, optimizer: keras.optimizers.Optimizer) -> None:
        self.scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        self.clipping = optimizer.inner_optimizer if self.scaled else optimizer
        self.applied = 0  # the clipping optimizer's iterations, had it variables

    def update(self) -> None:
        """One step's part in the pipeline sums (call it where ``update`` would apply)."""
        if runtime.get().topology.partitions == 1:
            return
        if self.scaled and not bool(_finite([])):
            return  # every stage skips the step: the inner optimizer is not called
        if keras_internals.clips_by_global_norm(self.clipping):
            steps = self.clipping.gradient_accumulation_steps
            if not steps or (self.applied + 1) % steps == 0:
                _norm(())([])
        self.applied += 1


def clip_by_global_norm(
    grads: Sequence[Any], clip_norm: float, model: keras.Model
) -> tuple[list[tf.Tensor], tf.Tensor]:
    """Scales ``grads`` by ``clip_norm / max(norm, clip_norm)``, ``norm`` the global norm of
    the whole model's gradients, every stage's: ``tf.clip_by_global_norm`` for a pipeline.

    For a custom loop that clips itself (``compiled_update`` and ``fit`` need nothing:
    they make an optimizer's ``global_clipnorm`` span the stages). Every rank of a
    pipeline must call it, after ``tfsift.allreduce``; each gets the same norm.

    Example:
        >>> grads = tfsift.allreduce(grads)                               # doctest: +SKIP
        >>> grads, norm = tfsift.clip_by_global_norm(grads, 1.0, model)   # doctest: +SKIP

    Args:
        grads: this rank's stage's gradients, in the order of ``model.trainable_variables``
            (tensors, or the ``StepOutput`` gradients of a step).
        clip_norm: the largest global norm kept, > 0.
        model: the ``tfsift.DistributedModel`` they are the gradients of (a weight tied
            across stages counts once).

    Returns:
        The clipped gradients and the global norm before clipping (NaN gradients and norm
        if any gradient is not finite, as ``tf.clip_by_global_norm`` gives).

    Raises:
        ValueError: ``clip_norm`` not > 0, or not one gradient per trainable variable.
    """
    if not isinstance(clip_norm, (int, float)) or not clip_norm > 0:
        raise ValueError(f"clip_norm must be a number > 0. Received: clip_norm={clip_norm!r}")
    tensors = stage_gradients(grads, model, "clip_by_global_norm(grads, clip_norm, model)")
    norm = _norm(counted_variables(model))(tensors)
    scale = clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm)
    scale = scale + (norm - norm)
    return [autodiff.scale(g, scale) for g in tensors], norm


def stage_gradients(grads: Sequence[Any], model: keras.Model, call: str) -> list[tf.Tensor]:
    """``grads`` as tensors, checked to be one per trainable variable of this rank's stage
    of ``model`` (what ``call``, a public function taking them, expects).

    Raises:
        ValueError: another number of gradients, naming ``call``.
        TypeError: one value in place of a list, naming ``call``.
    """
    tensors = as_tensors(grads, call)
    expected = len(model.trainable_variables)
    if len(tensors) != expected:
        raise ValueError(
            f"{call} expects one gradient per trainable variable of this rank's stage of "
            f"{model.name!r} ({expected}). Received: {len(tensors)} gradients"
        )
    return tensors


def counted_variables(model: keras.Model) -> tuple[bool, ...]:
    """Per trainable variable of this rank's stage, whether it counts in a global norm."""
    part = model.partitioned if isinstance(model, DistributedModel) else None
    if part is not None and part.tied.counted:
        return part.tied.counted
    return (True,) * len(model.trainable_variables)


def _norm(counted: Sequence[bool]) -> Callable[[list[Any]], Any]:
    def norm(grads: list[Any]) -> Any:
        if len(grads) != len(counted):
            raise ValueError(
                "the optimizer was given another number of gradients than the stage has "
                f"trainable variables, so tfsift cannot tell which to count in the global "
                f"norm. Received: {len(grads)} gradients, {len(counted)} variables"
            )
        squares = [
            tf.cast(tf.reduce_sum(tf.square(autodiff.values(g))), tf.float64)
            for g, mine in zip(grads, counted, strict=True)
            if mine and g is not None
        ]
        local = tf.add_n(squares) if squares else tf.zeros((), tf.float64)
        total = _over_stages(local, "add up their parts of the gradients' global norm")
        dtype = next((g.dtype for g in grads if g is not None), tf.float32)
        return tf.sqrt(tf.cast(total, dtype))

    return norm


def _finite(grads: list[Any]) -> Any:
    flags = [tf.reduce_all(tf.math.is_finite(autodiff.values(g))) for g in grads if g is not None]
    local = tf.cast(tf.reduce_all(tf.stack(flags)) if flags else True, tf.float64)
    total = _over_stages(local, "say whether their gradients are finite")
    return tf.equal(total, float(runtime.get().topology.partitions))


def _over_stages(local: tf.Tensor, what: str) -> tf.Tensor:
    """``local`` (a float64 scalar) summed over the pipeline's stages, inside a graph."""

    def add(value: tf.Tensor) -> np.float64:
        return np.float64(pipeline_sum(np.array([value.numpy()]), what)[0])

    total = tf.py_function(add, [local], tf.float64)
    total.set_shape(())
    return total
