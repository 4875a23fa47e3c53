"""Losses: a compiled ``loss`` as the batch loss a step trains on and as a per-sample loss."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras

if TYPE_CHECKING:
    from tfsift.model import DistributedModel


class PerSampleMean(keras.losses.Loss):  # type: ignore[misc]
    """A function returning one loss per sample, reduced as Keras reduces it (the mean).

    Example:
        >>> loss = PerSampleMean(keras.losses.sparse_categorical_crossentropy)
    """

    def __init__(self, fn: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(name=getattr(fn, "__name__", "loss"), **kwargs)
        self.fn = fn

    def call(self, y_true: Any, y_pred: Any) -> Any:
        return self.fn(y_true, y_pred)


def batch_loss(loss: Any) -> keras.losses.Loss:
    """The loss ``compile(loss=...)`` names, as a ``keras.losses.Loss`` returning the batch mean.

    Raises:
        ValueError: no loss, or one that Keras does not know.
    """
    if loss is None:
        raise ValueError(
            "fit and evaluate need a loss: call model.compile(loss=...). Received: None"
        )
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if isinstance(loss, keras.losses.Loss):
        return loss
    if callable(loss):
        return PerSampleMean(loss)
    several = " (fit trains one loss, on a model with one output)" if _nested(loss) else ""
    raise ValueError(
        f"loss must be a keras.losses.Loss, a name or a function{several}. Received: {loss!r}"
    )


def check_one_output(y_pred: Any) -> None:
    """Refuses a model with several outputs in ``fit`` and ``evaluate``, which train one
    loss: Keras applies its loss to each output (or one of a list or dict of losses) and
    adds them up, where one loss called on the outputs together failed in TensorFlow.

    Raises:
        ValueError: ``y_pred`` holds more than one tensor.
    """
    outputs = keras.tree.flatten(y_pred)
    if len(outputs) > 1:
        shapes = ", ".join(str(tuple(o.shape)) for o in outputs)
        raise ValueError(
            "tfsift's fit and evaluate train one loss on a model with one output; this model "
            f"returns {len(outputs)} (Keras would add up a loss for each). Return one output "
            "(or their loss as the output), or compute each output's loss in a @tfsift.step "
            f"loop. Received: outputs of a microbatch shaped {shapes}"
        )


def _nested(loss: Any) -> bool:
    return isinstance(loss, list | tuple | dict)


MEAN = "sum_over_batch_size"  # Keras' default reduction, the one fit reduces exactly


def check_reduction(loss: keras.losses.Loss) -> None:
    """Refuses a loss that ``fit`` and ``evaluate`` cannot reduce as Keras does.

    They average each microbatch's loss over the microbatches and the replicas. With
    Keras' default reduction, ``"sum_over_batch_size"``, that is the loss of the whole
    batch (the microbatches are the same size); ``"sum"`` would give the batch's sum
    divided by M and the replicas (gradients too: 1/M of Keras' in one process), ``None``
    likewise (Keras' ``fit`` sums the per-sample values for the gradients), and
    ``"mean_with_sample_weight"`` divides each microbatch by its own weights' sum.

    Raises:
        ValueError: a reduction other than ``"sum_over_batch_size"``.
    """
    reduction = getattr(loss, "reduction", MEAN)
    if reduction != MEAN:
        raise ValueError(
            "tfsift's fit and evaluate average each microbatch's loss over the microbatches "
            "and replicas, which is Keras' loss of the whole batch only with "
            f"reduction={MEAN!r} (Keras' default): pass the loss with that reduction (and "
            "scale it yourself for a sum). Received: "
            f"{type(loss).__name__}(reduction={reduction!r})"
        )


def check_output_mask(model: DistributedModel) -> None:
    """Refuses, on every rank, a partitioned model whose output carries a Keras mask.

    Keras' losses weigh each position by the mask on the model's output (padding from an
    ``Embedding(mask_zero=True)`` or a ``Masking`` layer that reaches it) and average
    over the unmasked ones; the outputs of tfsift's stages carry no mask, so ``fit``'s
    loss would count the padding (an embedding model's weights were 0.05 from Keras'
    after two epochs, equal to those of Keras without the mask). Every rank traced the
    same model, so each raises alike.

    Raises:
        ValueError: an output of the traced model has a mask (``Partitioned.masked_outputs``,
            found once when it was partitioned).
    """
    masked = model.partitioned.masked_outputs if model.partitioned is not None else ()
    if masked:
        raise ValueError(
            "tfsift's fit and evaluate do not weigh the loss by a mask on the model's "
            "output, as Keras' losses do (padding from Embedding(mask_zero=True) or Masking "
            "that reaches the output): the loss would count the masked positions. Stop the "
            "mask before the output and pass the padding as sample_weight, or weigh the "
            "loss yourself in a @tfsift.step loop. Received: a mask on output "
            f"{', '.join(map(str, masked))} of model {model.name!r}"
        )


def per_sample_loss(loss: keras.losses.Loss) -> Callable[..., Any]:
    """``loss`` with ``reduction=None`` (one value per sample), for ``tfsift.sift``."""
    if isinstance(loss, PerSampleMean):
        fn: Callable[..., Any] = loss.fn
        return fn
    try:
        unreduced: Callable[..., Any] = type(loss).from_config(
            {**loss.get_config(), "reduction": None}
        )
        return unreduced
    except (TypeError, ValueError):  # a subclass whose __init__ does not take its config
        return Unreduced(loss)


class Unreduced(keras.losses.Loss):  # type: ignore[misc]
    """Another loss's per-sample values (its ``call``), with ``reduction=None``."""

    def __init__(self, loss: keras.losses.Loss) -> None:
        super().__init__(name=loss.name, reduction=None)
        self.loss = loss

    def call(self, y_true: Any, y_pred: Any) -> Any:
        return self.loss.call(y_true, y_pred)
