"""Losses: a compiled ``loss`` as the batch loss a step trains on and as a per-sample loss."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import tensorflow as tf
from keras import tree
from keras.src.trainers.compile_utils import CompileLoss

from tfsift.state import STATE

if TYPE_CHECKING:
    from tfsift.model import DistributedModel


class PerSampleMean(keras.losses.Loss):  # type: ignore[misc]
    """A function returning one loss per sample, reduced as Keras reduces it (the mean).

    Example:
        >>> loss = PerSampleMean(keras.losses.sparse_categorical_crossentropy)
    """

    def __init__(self, fn: Callable[..., Any], **kwargs: Any) -> None:
        # a lambda's name, "<lambda>", is no name scope: the step fell back to running eagerly
        name = re.sub(r"[^A-Za-z0-9_.]", "", getattr(fn, "__name__", "")) or "loss"
        super().__init__(name=name, **kwargs)
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
    raise ValueError(f"loss must be a keras.losses.Loss, a name or a function. Received: {loss!r}")


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


def check_per_sample(loss: Any, name: str, y_true: Any, y_pred: Any) -> None:
    """Refuses a loss that returns one value for a whole batch where ``fit`` splits it.

    Keras' losses return one value per sample and reduce them to their mean; ``fit``
    averages each microbatch's loss over the microbatches and replicas, which is that mean
    over the batch. A function that reduces the batch itself could be a sum (or a sum
    divided by a batch size, tf.distribute's idiom), which would come out 1/M of Keras'
    (gradients too) without a word, or a loss over pairs of samples, which a microbatch
    cannot compute: nothing tells these from a mean, so only a lone microbatch on a lone
    replica, Keras' own batch, takes one. ``loss.call`` gives the values before Keras'
    reduction (of the inputs converted to the loss's dtype, as Keras' ``__call__`` does: a
    float64 target against a bfloat16 output failed); the check runs at trace time, where
    the unused values are pruned.

    Raises:
        ValueError: ``loss`` returns a scalar for batched ``y_pred``, on more than one
            microbatch or replica.
    """
    rt = STATE.runtime  # None: outside tfsift.init (a loss computed on its own)
    M, R = (rt.config.microbatches, rt.topology.replicas) if rt is not None else (1, 1)
    if M * R == 1 or len(y_pred.shape) == 0:
        return
    if isinstance(loss, keras.losses.Loss):  # converted as Loss.__call__ converts them
        y_true, y_pred = (
            tree.map_structure(lambda t: keras.ops.convert_to_tensor(t, dtype=loss.dtype), v)
            for v in (y_true, y_pred)
        )
        values = loss.call(y_true, y_pred)
    else:
        values = loss(y_true, y_pred)
    if len(tree.flatten(values)[0].shape) == 0:
        raise ValueError(
            f"the loss {name!r} returns one value for the whole batch, where Keras' losses "
            "return one per sample and average them. tfsift's fit splits each batch into "
            f"{M} microbatch(es) on {R} replica(s) and averages their losses, which equals "
            "the batch's loss only for a mean over samples; a sum (e.g. divided by a batch "
            "size, tf.distribute's idiom) would train at 1/M of it and a loss over pairs of "
            "samples differently, without a word. Return the per-sample losses and let "
            "Keras average them, or compute the loss in a @tfsift.step loop of your own. "
            f"Received: {name} returning shape ()"
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
    if isinstance(loss, PerSampleMean):  # a Loss still: it converts its inputs, as Keras'
        return PerSampleMean(loss.fn, reduction=None)
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


class ModelLoss:
    """``compile``'s ``loss`` and ``loss_weights`` on the model's output or outputs, as
    Keras' ``fit`` computes them: the batch loss, and with several losses each one's
    unweighted value, logged by Keras as ``{name}_loss``; and one loss per sample.

    One loss on one output is that loss (``batch_loss``). Otherwise Keras' own
    ``CompileLoss`` resolves which loss goes with which output, its weight and its name
    (a list or dict of losses, one loss for every output, a ``loss_weights``), so names
    and values follow Keras'; it is built at the first call, where the outputs' structure
    is first known (the model is traced inside a step). tfsift adds its terms itself:
    calling it would also update its own loss trackers inside the step, on one stage.

    Example:
        >>> loss = ModelLoss(["sparse_categorical_crossentropy", "mse"], [1.0, 0.5], None)
    """

    def __init__(self, loss: Any, loss_weights: Any, output_names: Any) -> None:
        if loss is None:
            raise ValueError(
                "fit and evaluate need a loss: call model.compile(loss=...). Received: None"
            )
        nested = _nested(loss) or loss_weights is not None
        self.single = None if nested else batch_loss(loss)
        for each in [self.single] if self.single is not None else tree.flatten(loss):
            if isinstance(each, keras.losses.Loss):  # names and functions reduce by the mean
                check_reduction(each)
        # a class whose targets the loss leaves out of its mean (and of its count), which
        # fit then weighs the microbatches by (data.counted_weights)
        self.ignore_class = getattr(self.single, "ignore_class", None)
        if self.single is None:
            _refuse_ignored_classes(loss)
        # the per-sample losses, made once: sifting asks for them at every step
        self._unreduced = None if self.single is None else per_sample_loss(self.single)
        self._user = (loss, loss_weights, output_names)
        self._keras: CompileLoss | None = None
        self._unreduced_terms: list[Callable[..., Any]] = []
        self._checked = False  # check_per_sample, at the first call
        self._alone = False  # check_alone, at the first batch

    def __call__(self, y: Any, y_pred: Any, sample_weight: Any = None) -> dict[str, Any]:
        """``{"loss": the weighted sum, "{name}_loss": each loss unweighted, ...}``, the
        names only where there are several losses, as Keras logs them (a later one of the
        same name replaces an earlier, as in Keras' logs)."""
        if self.single is not None and len(tree.flatten(y_pred)) == 1:
            if not self._checked:
                check_per_sample(self.single, self.single.name, y, tree.flatten(y_pred)[0])
                self._checked = True
            return {"loss": self.single(y, y_pred, sample_weight=sample_weight)}
        terms = self._each(y, y_pred, sample_weight)
        if not self._checked:
            for (_, fn, _, name), y_t, y_p, _ in terms:
                check_per_sample(fn, name, y_t, y_p)
            self._checked = True
        values: dict[str, Any] = {}
        total = None
        for (_, fn, weight, name), y_t, y_p, w in terms:
            value = tf.cast(fn(y_t, y_p, w), keras.backend.floatx())
            if len(terms) > 1:
                values[f"{name}_loss"] = value
            total = _plus(total, value, weight)
        return {"loss": total, **values}

    def check_alone(self, y: Any, y_pred: Any, parts: int) -> None:
        """Refuses, at the first batch, a loss whose value for a sample depends on the
        other samples of its batch (in-batch negatives, a batch statistic): ``fit`` and
        ``evaluate`` compute it on each microbatch, a part of the batch, where Keras
        computes it on the whole. ``y`` the batch's targets, ``y_pred`` its predictions
        (each output's ``StepOutput``, on every rank), ``parts`` the microbatches (a
        replica's batch is halved where M is 1: on R replicas it is a part too).

        Raises:
            ValueError: a sample's loss differs between its microbatch and the batch.
        """
        if self._alone or parts < 2:
            return
        self._alone = True
        whole = tree.map_structure(lambda o: o.concat(), y_pred)
        rows = int(tree.flatten(whole)[0].shape[0])
        size = -(-rows // parts)
        spans = [(start, min(start + size, rows)) for start in range(0, rows, size)]
        values = np.asarray(self.per_sample(y, whole))
        split = np.concatenate(
            [np.asarray(self.per_sample(*_rows((y, whole), a, b))) for a, b in spans]
        )
        # loose: only the same computation on fewer rows (kernels may round otherwise)
        if not np.allclose(values, split, rtol=1e-3, atol=1e-4):
            worst = int(np.argmax(np.abs(values - split)))
            raise ValueError(
                "the loss gives a sample another value in a part of the batch than in the "
                "whole batch: it reads the batch's other samples (in-batch negatives, a "
                f"batch statistic). tfsift's fit and evaluate compute it on each of the {parts} "
                "microbatches (or replicas' parts) of a batch, where Keras computes it on "
                "the whole batch: it would train otherwise, without a word. Compute such a "
                "loss in a @tfsift.step loop of your own, or use one microbatch on one "
                f"replica. Received: sample {worst}'s loss {values[worst]:.6g} in the batch "
                f"of {rows}, {split[worst]:.6g} in a part of {size}"
            )

    def per_sample(self, y: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        """One loss per sample (for ``tfsift.sift``): the weighted sum of every output's,
        each the mean of its values within the sample (a sequence model's over its tokens),
        as the batch loss is their mean over the batch; with per-token ``sample_weight``
        (padding weighed 0), the mean weighted by them, as the loss counts the tokens."""
        if self._unreduced is not None and len(tree.flatten(y_pred)) == 1:
            return _per_sample_mean(self._unreduced(y, y_pred), sample_weight)
        total = None
        terms = self._each(y, y_pred, sample_weight)
        for ((_, _, weight, _), y_t, y_p, w), fn in zip(terms, self._unreduced_terms, strict=True):
            total = _plus(total, _per_sample_mean(fn(y_t, y_p), w), weight)
        return total

    def _each(self, y: Any, y_pred: Any, sample_weight: Any) -> list[tuple[Any, Any, Any, Any]]:
        """Each of Keras' resolved losses (``_terms``) with its target, its output and its
        sample weight (one a target, matched to the outputs as ``y`` is, or one for all)."""
        outputs = y_pred
        terms, y, y_pred = self._terms(y, y_pred)
        if tree.is_nested(sample_weight):
            sample_weight = self._structured(sample_weight, outputs)
        return [
            (
                term,
                _at(term.path, y),
                _at(term.path, y_pred),
                _at(term.path, sample_weight) if tree.is_nested(sample_weight) else sample_weight,
            )
            for term in terms
        ]

    def _terms(self, y: Any, y_pred: Any) -> tuple[list[Any], Any, Any]:
        """Keras' resolved losses, (path, loss, weight, name) each, built once; and ``y``
        and ``y_pred`` in the structures they were built on, as Keras' call matches them."""
        loss, weights, names = self._user
        y = _aligned(y, y_pred, names)
        if self._keras is None:
            compile_loss = CompileLoss(loss, weights, output_names=names)
            with tf.init_scope():  # its trackers' variables, made outside the traced step
                compile_loss.build(y, y_pred)
            for term in compile_loss._flat_losses:
                check_reduction(term.loss)
            self._unreduced_terms = [per_sample_loss(t.loss) for t in compile_loss._flat_losses]
            self._keras = compile_loss
        built = self._keras
        y = _repacked(built._y_true_build_structure, y)
        y_pred = _repacked(built._y_pred_build_structure, y_pred)
        return list(built._flat_losses), y, y_pred

    def _structured(self, targets: Any, y_pred: Any) -> Any:
        """``targets`` (or their sample weights) in the structure the losses were built on."""
        assert self._keras is not None  # built by _terms
        aligned = _aligned(targets, y_pred, self._user[2])
        return _repacked(self._keras._y_true_build_structure, aligned)


def _refuse_ignored_classes(losses: Any) -> None:
    """Refuses, where batches are split, an output's loss that ignores a class among
    several outputs' (one output's is taken exactly: ``data.counted_weights``)."""
    rt = STATE.runtime
    if rt is None or rt.config.microbatches * rt.topology.replicas == 1:
        return
    for each in tree.flatten(losses):
        ignored = getattr(each, "ignore_class", None)
        if ignored is not None:
            raise ValueError(
                "a loss that ignores a class divides by the targets it does not ignore, "
                "which tfsift's fit counts over the whole batch for a model of one output "
                "only; here each microbatch's would be divided by its own count. Weigh the "
                "ignored targets 0 with sample_weight instead, or use one microbatch on one "
                f"replica. Received: {type(each).__name__}(ignore_class={ignored}) among "
                "several losses"
            )


def _rows(structure: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of every tensor in ``structure``."""
    return tree.map_structure(lambda t: t[start:stop], structure)


def _plus(total: Any, value: Any, weight: Any) -> Any:
    """``total`` plus ``value`` times its loss weight (None: 1), or that alone first."""
    value = value if weight is None else value * weight
    return value if total is None else total + value


def _per_sample_mean(losses: Any, weight: Any = None) -> Any:
    """``losses`` averaged over every axis but the batch's: Keras' default reduction
    averages a batch's values over all of them, which is the mean of these means. Where
    ``weight`` varies within a sample (per token: padding weighed 0), the mean weighted
    by it (0 for a sample weighed 0 throughout); a weight per sample changes nothing."""
    rank = len(losses.shape)
    if rank <= 1:
        return losses
    axes = tuple(range(1, rank))
    if weight is None or all(d == 1 for d in tuple(weight.shape)[1:]):
        return keras.ops.mean(losses, axis=axes)
    w = tf.broadcast_to(
        tf.reshape(tf.cast(weight, losses.dtype), _padded(weight, rank)), tf.shape(losses)
    )
    return tf.math.divide_no_nan(tf.reduce_sum(w * losses, axes), tf.reduce_sum(w, axes))


def _padded(weight: Any, rank: int) -> list[int]:
    """``weight``'s shape with trailing 1s up to ``rank`` (a (B, T) weight on (B, T, U))."""
    shape = [-1 if d is None else int(d) for d in weight.shape]
    return shape + [1] * (rank - len(shape))


def _at(path: tuple[Any, ...], value: Any) -> Any:
    for key in path:
        value = value[key]
    return value


def _same_structure(a: Any, b: Any) -> bool:
    try:
        tree.assert_same_structure(a, b)
    except (ValueError, TypeError):
        return False
    return True


def _repacked(structure: Any, value: Any) -> Any:
    if _same_structure(structure, value):
        return value
    return tree.pack_sequence_as(structure, tree.flatten(value))


def _aligned(y: Any, y_pred: Any, output_names: Any) -> Any:
    """The targets ``y`` in the structure of the outputs ``y_pred``, as Keras matches them
    (a tuple for a list, a dict by output name, the same leaves in another nesting).

    Raises:
        ValueError: ``y`` holds another number of targets than there are outputs.
    """
    if _same_structure(y_pred, y):
        return y
    if isinstance(y, dict) and isinstance(y_pred, list | tuple) and output_names:
        if set(y) == set(output_names):
            y = [y[name] for name in output_names]
    targets, outputs = tree.flatten(y), tree.flatten(y_pred)
    if len(targets) != len(outputs):
        raise ValueError(
            f"the model returns {len(outputs)} outputs, and its loss needs a target for "
            f"each: y must hold {len(outputs)} (a list, a tuple or a dict by output, as the "
            f"outputs are). Received: {len(targets)} target(s), "
            f"y={tree.map_structure(lambda _: '*', y)}, outputs="
            f"{tree.map_structure(lambda _: '*', y_pred)}"
        )
    return tree.pack_sequence_as(y_pred, targets)
