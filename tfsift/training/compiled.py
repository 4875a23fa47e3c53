"""Compiled: what ``model.compile`` set up, turned into pipelined ``@tfsift.step`` functions."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from tfsift.parallel import runtime
from tfsift.pipeline.compiled import Compiled as Traced
from tfsift.pipeline.context import gradients
from tfsift.pipeline.step import step
from tfsift.planning import autodiff, keras_internals
from tfsift.training import regularizers
from tfsift.training.losses import ModelLoss
from tfsift.training.update import compiled_update

if TYPE_CHECKING:
    from tfsift.model import DistributedModel

_ATTRIBUTE = "_tfsift_compiled"
_PREDICT = "_tfsift_predict_step"  # a never-compiled model's, made at its first predict


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A compiled model's loss, metrics and steps; made once by ``compile``.

    ``train_step(x, y[, sample_weight])`` returns ``(grads, losses, y_pred)``,
    ``eval_step`` returns ``(losses, y_pred)`` and ``predict_step(x)`` returns ``y_pred``,
    each as ``StepOutput``s valid on every rank of the pipeline; ``losses`` is
    ``ModelLoss``'s dict, ``"loss"`` and, with several losses, each one's. ``update(grads)`` applies
    the averaged gradients of the stage's variables with the optimizer.
    """

    loss: ModelLoss  # the batch mean, and each output's with several
    per_sample_loss: Callable[..., Any]  # one loss per sample, for tfsift.sift
    metrics: Any  # Keras' CompileMetrics (built at the first update), or None
    train_step: Callable[..., Any]
    eval_step: Callable[..., Any]
    predict_step: Callable[..., Any]
    update: Callable[[list[Any]], None]
    whole_batch: Callable[[list[Any]], list[Any]]  # the averaged gradients, as one process's
    penalties: regularizers.Penalties  # the regularized weights' penalties, as Keras adds


def compile_model(model: DistributedModel, **kwargs: Any) -> None:
    """Keras' ``compile`` (optimizer, loss, metrics), then the pipelined steps for ``fit``.

    Keras keeps ``model.optimizer`` (resolved) and ``model.loss`` (as given) and builds a
    ``CompileMetrics`` of ``metrics`` and ``weighted_metrics``; tfsift reuses all three.
    XLA stays off: the steps are compiled per stage by ``@tfsift.step``.
    """
    kwargs.setdefault("jit_compile", False)
    regularizers.check(model)
    # before Keras compiles: a refused compile leaves nothing behind
    loss = ModelLoss(kwargs.get("loss"), kwargs.get("loss_weights"), _output_names(model))
    keras.Model.compile(model, **kwargs)
    compiled = Compiled(
        loss=loss,
        per_sample_loss=loss.per_sample,
        metrics=getattr(model, "_compile_metrics", None),
        train_step=_train_step(model, loss),
        eval_step=_eval_step(model, loss),
        predict_step=_predict_step(model),
        # Eagerly the update costs more than a small model's step (bench_small.py's MLP:
        # 1.6x to 1.8x a step with it compiled), as in Keras' own train step
        update=compiled_update(model.optimizer, model),
        whole_batch=_whole_batch(model),
        penalties=regularizers.Penalties(model, model.optimizer),
    )
    object.__setattr__(model, _ATTRIBUTE, compiled)


# Keras' hooks its own fit, evaluate and predict call, which tfsift's pipelined steps do not
# get_metrics_result: Keras' fit and evaluate build their logs with it
TRAIN_HOOKS = ("train_step", "test_step", "compute_loss", "compute_metrics", "get_metrics_result")
TEST_HOOKS = ("test_step", "compute_loss", "compute_metrics", "get_metrics_result")
PREDICT_HOOKS = ("predict_step",)


def check_hooks(model: DistributedModel, what: str, hooks: tuple[str, ...]) -> None:
    """Refuses a model whose class overrides Keras' ``hooks``, before ``what`` runs a step:
    Keras' ``fit`` calls a ``train_step`` or ``compute_loss`` of the user's ("Customizing
    what happens in fit()"); tfsift's runs its own pipelined step, which would train as if
    they were not there.

    Raises:
        ValueError: the model's class defines one of ``hooks``.
    """
    cls = type(model)
    mine = [name for name in hooks if getattr(cls, name) is not getattr(keras.Model, name)]
    if mine:
        names = ", ".join(mine)
        raise ValueError(
            f"tfsift's {what} runs its own pipelined step, which does not call {names} as "
            f"Keras' {what} does: write the step as a @tfsift.step function in a loop of your "
            f"own (README), or leave {names} to Keras. Received: {cls.__name__} overrides "
            f"{names}"
        )


def compiled_of(model: DistributedModel) -> Compiled:
    """The model's ``Compiled``; raises if ``compile`` was not called."""
    compiled = getattr(model, _ATTRIBUTE, None)
    if compiled is None:
        raise RuntimeError(
            f"DistributedModel {model.name!r} must be compiled before fit, evaluate or "
            "predict: call model.compile(optimizer=..., loss=..., metrics=[...])"
        )
    return compiled  # type: ignore[no-any-return]


def predict_step_of(model: DistributedModel) -> Callable[..., Any]:
    """The compiled model's predict step, or one made once for a model never compiled
    (Keras predicts without ``compile``)."""
    compiled = getattr(model, _ATTRIBUTE, None)
    if compiled is not None:
        return compiled.predict_step  # type: ignore[no-any-return]
    made = getattr(model, _PREDICT, None)
    if made is None:
        made = _predict_step(model)
        object.__setattr__(model, _PREDICT, made)
    return made


def _output_names(model: DistributedModel) -> Any:
    """What Keras' compile passes its ``CompileLoss`` as the output names (a functional
    model's; None for a subclassed one, whose losses Keras names by their own names)."""
    return getattr(model, "output_names", None)


def _train_step(model: DistributedModel, loss: ModelLoss) -> Callable[..., Any]:
    def train_step(x: Any, y: Any, *sample_weight: Any) -> Any:
        y_pred = model(x, training=True)
        losses = loss(y, y_pred, sample_weight[0] if sample_weight else None)
        # as Keras' train step: a LossScaleOptimizer's scale (or a loss_scale_factor) on the
        # loss whose gradients are taken; the update divides it out. Its part's share too
        scaled = model.optimizer.scale_loss(losses["loss"] / parts_of(model))
        return gradients(scaled, model.trainable_variables), losses, y_pred

    return _with_or_without_weights(train_step)


def parts_of(model: DistributedModel) -> int:
    """What ``fit``'s step divides a microbatch's loss by before its gradients (and its
    update multiplies their average by): under a ``LossScaleOptimizer`` the batch's parts,
    microbatches times replicas, else 1.

    A microbatch's loss is the mean over its samples, so the float16 gradients inside
    the stages were the parts' count times one process's, and overflowed where its do
    not: the loss scale then skipped steps and halved where one process's did not (0.23
    apart after 32 steps on 2 replicas). Divided, each sample's are one process's; the
    factor is exact for a power of two.
    """
    if not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer):
        return 1
    rt = runtime.get()
    return rt.config.microbatches * rt.topology.replicas


def _whole_batch(model: DistributedModel) -> Callable[[list[Any]], list[Any]]:
    """The averaged gradients of ``fit``'s step as one process's of the whole batch:
    multiplied back by ``parts_of(model)``, and those of the variables read as float16
    rounded to it, as one process's sum over the batch is (a sum past float16's range
    overflows there, and its loss scale skips the step: every part's sum could stay in).
    One compiled call, made at the first step that needs it."""
    made: list[Traced] = []

    def whole_batch(grads: list[Any]) -> list[Any]:
        parts = parts_of(model)
        if parts == 1:
            return grads
        if not made:
            halves = keras_internals.read_as(model, "float16")
            flags = [id(v) in halves for v in model.trainable_variables]

            def rounded(g: Any) -> Any:
                return tf.cast(tf.cast(g, tf.float16), g.dtype)

            def combine(grads: list[Any]) -> list[Any]:
                scaled = [autodiff.scale(g, parts) for g in grads]
                return [autodiff.elementwise(g, rounded) if half else g
                        for g, half in zip(scaled, flags, strict=True)]  # fmt: skip

            made.append(Traced(combine, "the gradients of the whole batch", autograph=False))
        return made[0](list(grads))  # type: ignore[no-any-return]

    return whole_batch


def _eval_step(model: DistributedModel, loss: ModelLoss) -> Callable[..., Any]:
    def eval_step(x: Any, y: Any, *sample_weight: Any) -> Any:
        y_pred = model(x, training=False)
        return loss(y, y_pred, sample_weight[0] if sample_weight else None), y_pred

    return _with_or_without_weights(eval_step)


def _with_or_without_weights(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as two ``@tfsift.step`` functions, called with ``(x, y)`` or ``(x, y,
    sample_weight)``: a step is planned for one structure of arguments, and Keras takes
    batches with and without weights on the same model (``fit`` with them, ``evaluate``
    without). Each is planned at its first call."""
    steps = {False: step(fn), True: step(fn)}

    def run(x: Any, y: Any, *sample_weight: Any) -> Any:
        return steps[bool(sample_weight)](x, y, *sample_weight)

    return run


def _predict_step(model: DistributedModel) -> Callable[..., Any]:
    @step
    def predict_step(x: Any) -> Any:
        return model(x, training=False)

    return predict_step
