"""Datasets for ``fit``: checked to split into whole microbatches, elements unpacked."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import tensorflow as tf
from keras import tree

from tfsift.parallel import collectives, runtime
from tfsift.parallel.arrays import ArrayDataset, RowDataset, numbers_as_arrays
from tfsift.parallel.shard import prompt_end
from tfsift.planning import keras_internals

if TYPE_CHECKING:
    from tfsift.model import DistributedModel

log = logging.getLogger("tfsift")

DEFAULT_BATCH = 32  # Keras' default batch size
# Transformations whose elements are all of their input's, every epoch: the batches seen
# through them are the batching's own. tf.data has no public way to read how a dataset was
# batched; Keras reads the same private ``_batch_size`` (keras.src.utils.dataset_utils).
_SAME_ELEMENTS = frozenset(
    {
        "_MapDataset",
        "_ParallelMapDataset",
        "_PrefetchDataset",
        "CacheDataset",
        "_CacheDataset",
        "_ShuffleDataset",
        "_RepeatDataset",
        "_OptionsDataset",
        "_AssertCardinalityDataset",
    }
)


def training_data(
    x: Any,
    y: Any,
    sample_weight: Any,
    batch_size: int | None,
    M: int,
    what: str,
    shuffle: bool,
    *,
    ranks: Sequence[int] = (),
    pads: str | None = None,
) -> tf.data.Dataset:
    """A dataset as it is (checked), or arrays made into this replica's shard of batches.

    Arrays become ``tfsift.from_arrays``: each batch one NumPy gather per array (through
    tf.data's shuffle and batch, sample by sample, the input cost a small model as much
    as a third of its step: ``scripts/bench_sifting_epochs.py``), and InfoBatch never
    reads a pruned row. ``ranks`` are the model's ``input_ranks``, for ``checked``.
    ``pads``, what batches need not split into the microbatches, which the step pads
    (``padded_batch``): ``"last"`` (``fit`` unsifted: a last, smaller batch; a batch size
    that does not split would pad every step, and is refused) or ``"any"`` (an
    evaluation). With ``pads``, each replica's rows after its whole batches of arrays are
    a last batch, so that an epoch takes every sample as Keras' does, and rank 0 warns of
    any that dealing left out; without (a sifted ``fit``), batches are whole, and up to a
    batch per replica is left out of an epoch.
    """
    if isinstance(x, tf.data.Dataset):
        if y is not None or sample_weight is not None:
            raise ValueError(
                f"{what}: y and sample_weight come from the dataset. Received: y, x a dataset"
            )
        return checked(x, 1 if pads == "any" else M, what, ranks, pad_last=pads == "last")
    refuse_unread(x, what)
    if y is None:
        raise ValueError(f"{what} needs targets: pass y with array inputs. Received: y=None")
    elements = (x, y) if sample_weight is None else (x, y, sample_weight)
    partial, any_size = pads is not None, pads == "any"
    B = batch_size or DEFAULT_BATCH
    seed = shuffle_seed() if shuffle else 0
    arrays = ArrayDataset(elements, B, shuffle, seed, what, partial, any_size)
    if partial:
        _warn_left_out(arrays, what, arrays.rest)
    return checked(arrays, 1 if any_size else M, what)


def shuffle_seed() -> int:
    """The seed of ``fit``'s permutations of arrays: the one ``keras.utils.set_random_seed``
    set (Keras' shuffle follows it too: another seed, another order), else 0; rank 0's on
    every rank, since every stage of a replica must read the same rows (a script that
    seeds each rank apart, for its dropout, say, would otherwise feed them others)."""
    rt = runtime.get()
    seed = np.array([keras_internals.random_seed() or 0], np.int64)
    if rt.topology.size > 1:
        collectives.control_wait(
            rt.control_comm.Ibcast(seed, root=0),
            "at the start of fit for rank 0's shuffle seed (every rank must call fit)",
        )
    return int(seed[0])


def _warn_left_out(arrays: ArrayDataset, what: str, rest: int) -> None:
    """Rank 0 warns of the samples ``what`` leaves out of arrays made into ``arrays``, whose
    replicas each take whole batches and ``rest`` rows more: those that dealing them to R
    replicas left (fewer than R); none where their count is a multiple of R."""
    R = arrays.replicas
    left = arrays.rows - R * (arrays.share // arrays.batch_size * arrays.batch_size + rest)
    if left and runtime.get().rank == 0:
        log.warning(
            "%s on arrays of %d samples leaves %d of them out: each of the %d replicas takes "
            "as many samples (Keras takes every one). Pass a number of samples that is a "
            "multiple of %d, the replicas, to take every one",
            what, arrays.rows, left, R, R,
        )  # fmt: skip


def padded_batch(x: Any, y: Any, weight: Any, M: int) -> tuple[Any, Any, Any, int]:
    """A batch of ``fit`` or an evaluation ready for its step: ``(x, y, sample_weight,
    rows)``, a batch
    that does not split into ``M`` microbatches padded to one that does (``padded``), its
    copies weighed 0 and its own rows ``(padded rows) / rows`` times their weight, so that
    the loss, the mean over the padded batch, is the mean over its own rows (Keras'
    default reduction divides by the batch's size), and so are its gradients; the batch as
    it is where it splits. Weights per output are padded and scaled each.
    """
    x_p, rows = padded(x, M)
    if x_p is x:
        return x, y, weight, rows
    total = int(tree.flatten(x_p)[0].shape[0])
    scale = tf.concat([tf.fill([rows], total / rows), tf.zeros([total - rows])], 0)
    y_p = padded(y, M)[0]
    w_p = None if weight is None else padded(weight, M)[0]
    return x_p, y_p, sifted_weights(y_p, w_p, scale), rows


def counted_weights(
    y_p: Any,
    weight: Any,
    rows: int,
    M: int,
    ignore_class: int,
    replica_sum: Callable[[float], tuple[float, int]],
) -> Any:
    """The sample weights of a padded batch (``padded_batch``'s ``y_p``, its own ``rows``)
    whose loss ignores a class (``SparseCategoricalCrossentropy(ignore_class=...)``).

    Keras divides such a loss by the number of targets not ignored, so each microbatch's
    loss is the mean over its own count, and their average over the microbatches and
    replicas is not the batch's mean. Weighing microbatch m by ``n_m * M * R / n`` (its
    count, including padded copies, which Keras counts in it; ``n`` the batch's own
    targets over every replica, ``replica_sum`` of this replica's, with R) makes the
    average the batch's loss, and its gradients the batch's; the copies weigh 0.
    """
    total = int(tree.flatten(y_p)[0].shape[0])
    counted = tf.cast(tf.not_equal(tf.cast(y_p, tf.float64), float(ignore_class)), tf.float64)
    per_row = tf.reduce_sum(tf.reshape(counted, [total, -1]), axis=1)
    overall, replicas = replica_sum(float(tf.reduce_sum(per_row[:rows])))
    per_microbatch = tf.reduce_sum(tf.reshape(per_row, [M, -1]), axis=1)
    factor = per_microbatch * (M * replicas / overall) if overall > 0 else per_microbatch * 0
    own = tf.concat([tf.ones([rows], tf.float64), tf.zeros([total - rows], tf.float64)], 0)
    w_p = None if weight is None else padded(weight, M)[0]
    return sifted_weights(y_p, w_p, tf.repeat(factor, total // M) * own)


def refuse_unread(x: Any, what: str) -> None:
    """Refuses the inputs Keras reads that tfsift does not: a ``keras.utils.PyDataset`` and
    a generator (or any other iterator). Each would be read whole on every rank, so that
    data-parallel replicas trained on the same batches, and an iterator once only: its
    batches go through ``tf.data`` instead, where ``tfsift.shard`` deals them out.

    Raises:
        TypeError: ``x`` is a ``PyDataset`` or an iterator.
    """
    if isinstance(x, keras.utils.PyDataset):
        kind = "keras.utils.PyDataset"
    elif isinstance(x, Iterator):
        kind = "generator" if inspect.isgenerator(x) else "iterator"
    else:
        return
    raise TypeError(
        f"{what} reads a tf.data.Dataset of batches, (x, y) or (x, y, sample_weight), or "
        f"arrays; a {kind} is not read: make it a tf.data.Dataset (e.g. "
        "tf.data.Dataset.from_generator) and, with data-parallel replicas, give each its "
        f"shard with tfsift.shard. Received: x={type(x).__name__}"
    )


def split(x: Any, y: Any, sample_weight: Any, fraction: float) -> tuple[tuple[Any, ...], Any]:
    """``validation_split``: the arrays' last ``fraction`` of samples, before any
    shuffling, as Keras takes them; returns the training ``(x, y, sample_weight)`` and the
    validation tuple.

    Raises:
        ValueError: ``fraction`` not in (0, 1), or ``x`` a dataset.
    """
    if isinstance(x, tf.data.Dataset):
        raise ValueError(
            "fit's validation_split needs array inputs (a dataset's size and order are "
            "unknown): pass validation_data=<a batched dataset> instead. Received: "
            f"validation_split={fraction}, x a tf.data.Dataset"
        )
    if not 0 < fraction < 1:
        raise ValueError(
            f"fit's validation_split must be between 0 and 1. Received: validation_split={fraction}"
        )
    n = len(tree.flatten(x)[0])
    cut = int(n * (1 - fraction))
    parts = (x, y, sample_weight)
    head = tuple(None if p is None else tree.map_structure(lambda a: a[:cut], p) for p in parts)
    tail = tuple(tree.map_structure(lambda a: a[cut:], p) for p in parts if p is not None)
    return head, tail


def with_class_weight(dataset: tf.data.Dataset, class_weight: dict[int, float]) -> tf.data.Dataset:
    """``class_weight``: each sample's weight times its class's (by ``y``, or its argmax
    when ``y`` is one-hot); classes not named weigh 1, as in Keras.

    Raises:
        ValueError: ``class_weight`` is not a dict of class indices to weights, the
            model has several outputs, or the elements have a ``sample_weight`` (Keras
            refuses the two together).
    """
    if not isinstance(class_weight, dict) or not all(
        isinstance(k, (int, np.integer)) and k >= 0 for k in class_weight
    ):
        raise ValueError(
            "class_weight must be a dict of class indices (ints >= 0) to weights. "
            f"Received: class_weight={class_weight!r}"
        )
    size = max(class_weight, default=0) + 1
    table = tf.constant([float(class_weight.get(c, 1.0)) for c in range(size)], tf.float32)

    def weigh(*element: Any) -> Any:
        x, y, weight = keras.utils.unpack_x_y_sample_weight(element)
        if len(tree.flatten(y)) != 1:
            raise ValueError(
                "class_weight needs a single output's targets; weigh several outputs with "
                f"sample_weight. Received: y={y}"
            )
        if weight is not None:  # traced when fit maps the dataset: before training
            raise ValueError(
                "class_weight and sample_weight cannot both weigh the samples, as in Keras: "
                "fold the class weights into sample_weight. Received: class_weight="
                f"{class_weight!r} and a sample_weight"
            )
        classes = _classes(y)
        # a class beyond the dict's largest index weighs 1
        w = tf.where(classes < size, tf.gather(table, tf.minimum(classes, size - 1)), 1.0)
        return x, y, w

    return dataset.map(weigh)


def _classes(y: Any) -> tf.Tensor:
    y = tf.convert_to_tensor(y)
    if y.shape.rank is not None and y.shape.rank >= 2 and y.shape[-1] != 1:
        return tf.argmax(y, axis=-1, output_type=tf.int64)  # one-hot
    return tf.cast(tf.round(tf.reshape(y, [-1])), tf.int64)


def validation(
    data: Any, batch_size: int | None, M: int, ranks: Sequence[int] = ()
) -> tf.data.Dataset:
    """``validation_data``: a dataset, or a tuple ``(x, y)`` or ``(x, y, sample_weight)``
    of arrays, batched as the training arrays (Keras' default ``validation_batch_size``);
    batches of any size (an evaluation pads them: ``padded_batch``)."""
    if isinstance(data, tf.data.Dataset):
        return checked(data, 1, "fit's validation_data", ranks)
    if isinstance(data, (tuple, list)) and len(data) in (2, 3):
        x, y, weight = (*data, None)[:3]
        what = "fit's validation_data"
        return training_data(x, y, weight, batch_size, M, what, False, pads="any")
    raise TypeError(
        "validation_data must be a batched tf.data.Dataset or a tuple (x, y) or "
        f"(x, y, sample_weight). Received: {type(data).__name__}"
    )


def prediction_data(x: Any, batch_size: int | None, ranks: Sequence[int] = ()) -> tf.data.Dataset:
    """``predict``'s batches: a batched dataset as it is, or arrays (not sharded: every rank
    predicts all of them) in batches of ``batch_size``. Any batch size: ``predict`` pads a
    batch that does not split into the microbatches (``padded``), as Keras takes any."""
    if isinstance(x, tf.data.Dataset):
        return checked(x, 1, "predict", ranks)
    refuse_unread(x, "predict")
    # (x,): arrays of several inputs are the one input of the model's call, as in Keras'
    # predict (a pair would be taken for inputs and targets); a list is a tuple, as there
    inputs = (tree.lists_to_tuples(numbers_as_arrays(x)),)
    return tf.data.Dataset.from_tensor_slices(inputs).batch(batch_size or DEFAULT_BATCH)


def padded(inputs: Any, M: int) -> tuple[Any, int]:
    """``inputs`` with their last row repeated up to a multiple of ``M`` rows, so that they
    split into ``M`` microbatches, and their own rows: ``predict`` drops the copies'
    predictions.

    Example:
        >>> padded(np.zeros((5, 3)), 4)[0].shape, padded(np.zeros((5, 3)), 4)[1]
        (TensorShape([8, 3]), 5)
    """
    rows = int(tree.flatten(inputs)[0].shape[0])
    extra = -rows % M
    if not extra:
        return inputs, rows
    return tree.map_structure(
        lambda t: tf.concat([t, tf.repeat(tf.convert_to_tensor(t)[-1:], extra, axis=0)], 0), inputs
    ), rows


def checked(
    dataset: Any, M: int, what: str, ranks: Sequence[int] = (), *, pad_last: bool = False
) -> tf.data.Dataset:
    """``dataset`` if it is a batched ``tf.data.Dataset`` whose batches split into ``M``
    (with ``pad_last``, whose batch size does: a last, smaller batch is padded).

    The one check of every dataset ``fit``, ``evaluate`` and ``predict`` take. Unbatched
    shows as a tensor without dimensions, tensors disagreeing on the batch axis' size or,
    once the model has been traced (``ranks``, from ``input_ranks``), inputs with one
    dimension fewer than the model's. A batch size that is not static (``.batch(B)``
    without ``drop_remainder``) passes if the dataset's size is known and every batch, the
    last one too, splits into ``M``: refused here rather than at the epoch's last step.

    Raises:
        TypeError: not a ``tf.data.Dataset``.
        ValueError: unbatched, or batches that do not all split into ``M``.
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"{what} takes a batched tf.data.Dataset of (x, y) or (x, y, sample_weight) "
            "(e.g. tfsift.shard(ds).batch(B, drop_remainder=True)). "
            f"Received: {type(dataset).__name__}"
        )
    why = _unbatched(dataset.element_spec, ranks)
    if why is not None:
        raise ValueError(
            f"{what} needs a batched dataset (call .batch(B, drop_remainder=True)){why}. "
            f"Received: element_spec={dataset.element_spec}"
        )
    if M > 1:
        _check_splits(dataset, M, what, pad_last)
    return dataset


def input_ranks(model: DistributedModel) -> tuple[int, ...]:
    """The dimensions of the model's traced inputs, batch axis included; () before the
    model is partitioned (its first step, or a restore)."""
    part = model.partitioned
    if part is None:
        return ()
    return tuple(len(part.graph.tensors[t].shape) for t in part.graph.inputs)


def batching(dataset: tf.data.Dataset) -> tuple[int, int] | None:
    """``(B, n)`` for a dataset made by ``.batch(B)`` of ``n`` elements (n < 0: endless),
    seen through transformations that keep every batch; None if that is not known."""
    node: Any = dataset
    while type(node).__name__ in _SAME_ELEMENTS:
        node = node._input_dataset
    size = getattr(node, "_batch_size", None)
    source = getattr(node, "_input_dataset", None)
    B = None if size is None else tf.get_static_value(size)
    if B is None or source is None:
        return None
    n = int(source.cardinality())
    return None if n == tf.data.UNKNOWN_CARDINALITY else (int(B), n)


def start_at(dataset: tf.data.Dataset, epoch: int) -> None:
    """Makes ``fit``'s training data, made or given, start at epoch ``epoch`` (0 the first)
    in the order an uninterrupted run would give it (a resumed run, or ``initial_epoch``).

    Arrays (``tfsift.from_arrays``) permute their rows by epoch, counted by the dataset
    from 0 in every process: they are set to that epoch's order, not the first epoch's
    again. A dataset that ``reshuffles`` cannot be set so: rank 0 warns that the resumed
    epochs take other orders than the uninterrupted run's.
    """
    if isinstance(dataset, RowDataset):
        dataset.epochs = epoch
    elif reshuffles(dataset) and runtime.get().rank == 0:
        log.warning(
            "fit starts at epoch %d of a dataset that reshuffles at each iteration "
            "(a .shuffle(), or tfsift.shard(shuffle_buffer=...)): tf.data orders its epochs "
            "by the iterations made in this process, so these epochs take the orders of "
            "epochs 1, 2, ... again and a resumed run does not repeat the uninterrupted one "
            "exactly. For an exact resume, pass arrays (fit(x, y)) or tfsift.from_arrays, "
            "whose order follows the epoch",
            epoch + 1,
        )


def reshuffles(dataset: tf.data.Dataset) -> bool:
    """Whether ``dataset`` holds a ``.shuffle`` that reshuffles at each iteration (seen
    through every transformation's inputs; ``tfsift.shard(shuffle_buffer=...)``'s too).
    Its epochs' orders then follow the iterations made in this process, from the first,
    whatever epoch a resumed run starts at. tf.data's datasets list their inputs in the
    private ``_inputs()``, as ``batching`` reads the private ``_batch_size``."""
    stack = [dataset]
    while stack:
        node = stack.pop()
        if type(node).__name__ == "_ShuffleDataset":
            if getattr(node, "_reshuffle_each_iteration", None) is not False:
                return True
        stack.extend(getattr(node, "_inputs", list)())
    return False


def _unbatched(spec: Any, ranks: Sequence[int]) -> str | None:
    """Why elements of ``spec`` are single samples ("" if no more can be said), or None."""
    leaves = tree.flatten(spec)
    if not leaves or any(len(leaf.shape) == 0 for leaf in leaves):
        return ""
    if len({leaf.shape[0] for leaf in leaves if leaf.shape[0] is not None}) > 1:
        return ": the tensors of a batch agree on its first axis, these do not"
    x = [len(leaf.shape) for leaf in tree.flatten(keras.utils.unpack_x_y_sample_weight(spec)[0])]
    if ranks and len(x) == len(ranks) and all(d == r - 1 for d, r in zip(x, ranks, strict=True)):
        return (
            f": the model's inputs have {_listed(ranks)} dimensions with the batch axis, "
            f"these elements {_listed(x)}"
        )
    return None


def _check_splits(dataset: tf.data.Dataset, M: int, what: str, pad_last: bool) -> None:
    """Refuses batches that do not all split into ``M`` microbatches (with ``pad_last``, a
    batch size that does not: the last batch may be smaller, and is padded)."""
    if isinstance(dataset, RowDataset):  # its batches, a partial last one too, were checked
        return
    batch = tree.flatten(dataset.element_spec)[0].shape[0]
    sizes = batching(dataset) if batch is None else None
    if pad_last:
        B = batch if sizes is None else sizes[0]
        if B is not None and B % M:
            raise ValueError(
                f"{what} needs a batch size that splits into microbatches={M} equal parts (a "
                "last, smaller batch is padded to split, as Keras trains it): batch the "
                f"dataset with .batch(B), B a multiple of {M}. Received: batch size {B}"
            )
        return
    if sizes is None:
        if batch is None or batch % M:
            raise ValueError(
                f"{what} needs every batch to split into microbatches={M} equal parts: batch "
                f"the dataset with .batch(B, drop_remainder=True), B a multiple of {M}. "
                f"Received: batch size {batch}"
            )
        return
    B, n = sizes
    last = (n % B or min(n, B)) if n >= 0 else B  # an endless source fills every batch
    if B % M or last % M:
        got = f"{n} samples in batches of {B} (last batch {last})" if n >= 0 else f"batches of {B}"
        fix = f"{B}, drop_remainder=True)"
        if B % M:
            fix = f"B, drop_remainder=True), B a multiple of {M}"
        raise ValueError(
            f"{what} needs every batch, the last one too, to split into microbatches={M} "
            f"equal parts. Received: {got}; use .batch({fix}"
        )


def _listed(dims: Sequence[int]) -> str:
    return ", ".join(str(d) for d in dims)


def batches(
    dataset: tf.data.Dataset, steps: int | None, sift_weights: bool = False
) -> Iterator[tuple[Any, Any, Any]]:
    """``(x, y, sample_weight)`` of each batch (``y``, ``sample_weight`` None if absent);
    the epoch ends without waiting for tf.data's autotuner (``shard.prompt_end``). With
    ``sift_weights``, each element's last part is the weights sifting adds (``rescale``),
    one a sample: they weigh it in the loss, times its ``sample_weight`` if it has one
    (``sifted_weights``)."""
    if steps is not None and steps < 1:
        return
    # ends after the last batch asked for, not at the next one: a sifted dataset counts a
    # batch it made as trained (sift_kept), and any dataset reads its samples
    for n, element in enumerate(prompt_end(dataset), start=1):
        if not sift_weights:
            yield keras.utils.unpack_x_y_sample_weight(element)
        else:
            *parts, sifted = element
            x, y, weight = keras.utils.unpack_x_y_sample_weight(tuple(parts))
            yield x, y, sifted_weights(y, weight, sifted)
        if steps is not None and n >= steps:
            return


class EpochBatches:
    """``fit``'s batches, an epoch at a time, as Keras' ``fit`` takes them: each epoch a
    pass over the dataset, or with ``steps_per_epoch`` that many batches from one iterator
    kept across epochs (an epoch goes on where the last one stopped), made anew after the
    batch that ends a dataset of known size and never after one of unknown size (the
    next epoch then has no batch, and ``fit`` stops). A sifted dataset plans each pass, so
    its epochs are passes, cut at ``steps_per_epoch``.

    Example:
        >>> epochs = EpochBatches(dataset, steps_per_epoch=3)
        >>> first, second = list(epochs.epoch()), list(epochs.epoch())   # batches 1-3, 4-6
    """

    def __init__(
        self, dataset: tf.data.Dataset, steps_per_epoch: int | None, sift_weights: bool = False
    ) -> None:
        self.dataset, self.steps, self.sift_weights = dataset, steps_per_epoch, sift_weights
        self.carried = steps_per_epoch is not None and not hasattr(dataset, "sifter")
        size = int(dataset.cardinality())
        self.size = size if size >= 0 else None
        self._batches: Iterator[tuple[Any, Any, Any]] | None = None
        self._taken = 0  # from the current iterator

    def epoch(self) -> Iterator[tuple[Any, Any, Any]]:
        """The next epoch's ``(x, y, sample_weight)`` batches."""
        if not self.carried:
            yield from batches(self.dataset, self.steps, self.sift_weights)
            return
        if self._batches is None:
            self._batches, self._taken = batches(self.dataset, None, self.sift_weights), 0
        assert self.steps is not None
        for _ in range(self.steps):
            batch = next(self._batches, None)
            if batch is None:
                break
            self._taken += 1
            yield batch
        if self.size is not None and self._taken >= self.size:
            self._batches = None


def sifted_weights(y: Any, weight: Any, sifted: Any) -> Any:
    """The sample weights of a sifted batch: sifting's, one a sample, shaped to weigh every
    position of the sample (a sequence's tokens: Keras broadcasts a weight of shape (B,)
    against losses of shape (B, T) along T, or fails), times ``weight`` where given, for
    each target of ``y``."""
    sifted = tf.cast(sifted, tf.float32)

    def per_sample(like: Any) -> tf.Tensor:
        return tf.reshape(sifted, [-1] + [1] * (len(like.shape) - 1))

    if weight is None:
        return tree.map_structure(per_sample, y)
    return tree.map_structure(lambda w: tf.cast(w, tf.float32) * per_sample(w), weight)


def step_count(dataset: tf.data.Dataset, steps: int | None) -> int | None:
    """Batches per epoch for the progress bar: ``steps``, else the cardinality if known."""
    if steps is not None:
        return steps
    n = int(dataset.cardinality())
    return n if n >= 0 else None
