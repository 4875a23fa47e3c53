"""The epoch and batch loops of ``fit``, ``evaluate`` and ``predict``, and their callbacks.

Every rank runs the same loop: the steps return the last stage's values on every rank
of a pipeline, the logs are combined over the replicas (``logs.replica_logs``), so every
callback sees the same logs everywhere and acts the same (``EarlyStopping`` stops every
rank at the same epoch). Only rank 0 shows Keras' progress bar.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import tensorflow as tf
from keras import tree

from tfsift.parallel import runtime
from tfsift.parallel.collectives import allreduce, replica_sum
from tfsift.sift.config import SiftConfig
from tfsift.sift.transform import sift as sift_transform
from tfsift.training import data
from tfsift.training.callbacks import (
    agree_to_stop,
    check_same_everywhere,
    check_tensorboard,
    check_writable,
    decides_at_batches,
    for_rank,
)
from tfsift.training.compiled import (
    PREDICT_HOOKS,
    TEST_HOOKS,
    TRAIN_HOOKS,
    Compiled,
    check_hooks,
    compiled_of,
    predict_step_of,
)
from tfsift.training.logs import replica_logs, replica_mean
from tfsift.training.losses import check_output_mask
from tfsift.training.progress import SiftedProgbar

if TYPE_CHECKING:
    from tfsift.model import DistributedModel

Logs = dict[str, float]
Trackers = dict[str, keras.metrics.Mean]  # by loss name: "loss", and each output's
log = logging.getLogger("tfsift")


# hands a step's labels, predictions and sample weights back to a sifted dataset
# (scores="training")
Record = Callable[[Any, Any, Any], None]


def fit(
    model: DistributedModel,
    x: Any,
    y: Any = None,
    *,
    batch_size: int | None = None,
    epochs: int = 1,
    verbose: Any = "auto",
    callbacks: list[keras.callbacks.Callback] | None = None,
    validation_split: float = 0.0,
    validation_data: Any = None,
    shuffle: bool = True,
    class_weight: dict[int, float] | None = None,
    sample_weight: Any = None,
    initial_epoch: int = 0,
    steps_per_epoch: int | None = None,
    validation_steps: int | None = None,
    validation_batch_size: int | None = None,
    validation_freq: int | list[int] = 1,
    sift: SiftConfig | None = None,
) -> keras.callbacks.History:
    """Keras' ``fit``, pipelined and data-parallel; see ``DistributedModel.fit``."""
    if isinstance(sift, SiftConfig) and sift.policy == "infobatch" and sift.epochs is None:
        sift = sift.replace(epochs=epochs)  # InfoBatch's schedule is fit's run
    if isinstance(sift, SiftConfig) and sift.policy == "infobatch" and sift.epochs != epochs:
        raise ValueError(
            "policy='infobatch' stops pruning for the last anneal fraction of its epochs, so "
            f"they must be the epochs fit trains. Received: fit(epochs={epochs}) with "
            f"SiftConfig(epochs={sift.epochs}); pass sift=config.replace(epochs={epochs})"
        )
    check_hooks(model, "fit", TRAIN_HOOKS)
    _check_validation_freq(validation_freq)
    compiled, M = compiled_of(model), runtime.get().config.microbatches
    ranks = data.input_ranks(model)
    if validation_split:
        if validation_data is not None:
            validation_split = 0.0  # Keras: validation_data takes precedence
        else:
            (x, y, sample_weight), validation_data = data.split(
                x, y, sample_weight, validation_split
            )
    train = data.training_data(
        x,
        y,
        sample_weight,
        batch_size,
        M,
        "fit",
        shuffle,
        ranks=ranks,
        pads="last" if sift is None else None,
    )
    source = train  # before class weights and sifting wrap it: what orders the epochs
    if class_weight is not None:
        if sift is not None:
            raise ValueError(
                "fit cannot take class_weight with sift (the sifted batches carry their own "
                "sample weights): weigh the classes in the loss instead. Received: "
                f"class_weight={class_weight}, sift={sift}"
            )
        train = data.with_class_weight(train, class_weight)
    if validation_data is not None:
        validation_data = data.validation(
            validation_data, validation_batch_size or batch_size, M, ranks
        )
    record, progbar = None, None
    weighs = sift is not None and sift.rescale is not None  # the batches carry sift's weights
    if sift is not None:
        train = train.apply(sift_transform(model, compiled.per_sample_loss, sift))
        record = _recorder(compiled, train) if sift.scores == "training" else None
        # a sifted epoch trains the batches its kept samples fill: the bar counts them
        progbar = SiftedProgbar(train.planned_batches, steps_per_epoch)
    steps = data.step_count(train, steps_per_epoch) if sift is None else steps_per_epoch
    given = list(getattr(callbacks, "callbacks", callbacks) or [])  # a CallbackList's too
    check_same_everywhere(model, given, steps)
    rt = runtime.get()
    check_tensorboard(given, rt.config.partitions, rt.topology.size)
    cbs = _callbacks(model, callbacks, verbose, progbar, epochs=epochs, steps=steps)
    check_writable(cbs.callbacks)
    at_batches = decides_at_batches(given)  # a stop decided at a batch is agreed there
    model.stop_training = False
    # the sifted dataset, for tfsift.callbacks.BackupAndRestore to save and restore its state
    # (object's setattr: Keras would track a dataset among the model's dependencies)
    object.__setattr__(model, "_fit_sifted", train if sift is not None else None)
    cbs.on_train_begin()
    # Keras' protocol for a callback that restored a run (BackupAndRestore): it sets the
    # epoch to start from during on_train_begin; read once, so a later fit starts afresh.
    restored, model._initial_epoch = model._initial_epoch, None
    initial_epoch = initial_epoch if restored is None else restored
    batches = data.EpochBatches(train, steps_per_epoch, weighs)
    if initial_epoch:
        data.start_at(source, initial_epoch)
        if sift is not None and restored is None:  # a fresh sifted dataset counts from here
            train.sifter.metrics.start_at(initial_epoch)
    epoch_logs: Logs = {}
    for epoch in range(initial_epoch, epochs):
        cbs.on_epoch_begin(epoch)
        epoch_logs = _train_epoch(model, compiled, batches.epoch(), cbs, record, at_batches)
        if not epoch_logs:  # no batch: the logs of a step are never empty
            _ran_dry(model, epoch, first=epoch == initial_epoch)
        if sift is not None:
            epoch_logs.update(_sift_logs(train))
        if validation_data is not None and _validates(epoch, validation_freq):
            val_batches = data.batches(validation_data, validation_steps)
            val = _test_loop(model, compiled, val_batches, cbs, "fit's validation_data")
            epoch_logs.update({f"val_{k}": v for k, v in val.items()})
        cbs.on_epoch_end(epoch, epoch_logs)
        agree_to_stop(model)  # a callback that stopped on one rank stops every rank
        if model.stop_training:
            break
    if isinstance(model.optimizer, keras.optimizers.Optimizer) and epochs > 0:
        # as Keras' fit ends: with use_ema, the weights become their moving averages (each
        # rank its stage's, whose averages its optimizer holds)
        model.optimizer.finalize_variable_values(model.trainable_weights)
    cbs.on_train_end(logs=epoch_logs)
    object.__setattr__(model, "_fit_sifted", None)
    return next(c for c in cbs.callbacks if isinstance(c, keras.callbacks.History))


def evaluate(
    model: DistributedModel,
    x: Any,
    y: Any = None,
    *,
    batch_size: int | None = None,
    sample_weight: Any = None,
    verbose: Any = "auto",
    steps: int | None = None,
    callbacks: list[keras.callbacks.Callback] | None = None,
    return_dict: bool = False,
) -> Any:
    """Keras' ``evaluate``: the loss and metrics, combined over the replicas."""
    check_hooks(model, "evaluate", TEST_HOOKS)
    compiled = compiled_of(model)
    M = runtime.get().config.microbatches
    dataset = data.training_data(
        x, y, sample_weight, batch_size, M, "evaluate", False, ranks=data.input_ranks(model),
        pads="any",
    )  # fmt: skip
    batches, count = data.batches(dataset, steps), data.step_count(dataset, steps)
    cbs = _callbacks(model, callbacks, verbose, epochs=1, steps=count)
    logs = _test_loop(model, compiled, batches, cbs, "evaluate")
    return logs if return_dict else _listed(logs, compiled)


def predict(
    model: DistributedModel,
    x: Any,
    *,
    batch_size: int | None = None,
    verbose: Any = "auto",
    steps: int | None = None,
    callbacks: list[keras.callbacks.Callback] | None = None,
) -> Any:
    """Keras' ``predict``: this rank's predictions for its batches, as NumPy arrays.

    Every rank of a pipeline returns the same predictions; with a dataset, each replica
    predicts its own batches; with arrays, every rank predicts all of them.
    """
    check_hooks(model, "predict", PREDICT_HOOKS)
    predict_step = predict_step_of(model)
    M, ranks = runtime.get().config.microbatches, data.input_ranks(model)
    dataset = data.prediction_data(x, batch_size, ranks)
    cbs = _callbacks(model, callbacks, verbose, epochs=1, steps=data.step_count(dataset, steps))
    cbs.on_predict_begin()
    outputs = []
    for n, (inputs, _, _) in enumerate(data.batches(dataset, steps)):
        cbs.on_predict_batch_begin(n)
        first = n == 0 and model.partitioned is None
        step = _tracing(model, predict_step, dataset) if first else predict_step
        inputs, rows = data.padded(inputs, M)  # a batch that does not split, as Keras takes
        out = tree.map_structure(lambda o, n=rows: o.concat().numpy()[:n], step(inputs))
        outputs.append(out)
        cbs.on_predict_batch_end(n, {"outputs": out})
    cbs.on_predict_end()
    if not outputs:
        raise ValueError("predict read no batch from the dataset. Received: an empty dataset")
    return tree.map_structure(lambda *parts: np.concatenate(parts), *outputs)


def _tracing(
    model: DistributedModel, step: Callable[[Any], Any], dataset: tf.data.Dataset
) -> Callable[[Any], Any]:
    """``step`` for the first batch of a model not traced yet: a batch the model cannot
    be traced on names ``.batch()``. Before the trace, an unbatched dataset of inputs alone
    cannot be told from a batch (a batch of token ids has one dimension too), so ``checked``
    lets it through, and the model's first layer would refuse it with no word of batching."""

    def first(inputs: Any) -> Any:
        try:
            return step(inputs)
        except ValueError as err:
            if model.partitioned is not None or _tfsifts(err):  # a refusal, not the data's
                raise
            raise ValueError(
                f"predict could not trace the model on the dataset's first element ({err}): "
                "predict needs a batched dataset; if this one is not, call .batch(B). "
                f"Received: element_spec={dataset.element_spec}"
            ) from err

    return first


def _tfsifts(err: BaseException) -> bool:
    """Whether tfsift's own code raised ``err`` (one of its refusals of the model)."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and Path(tb.tb_frame.f_code.co_filename).is_relative_to(_PACKAGE)


_PACKAGE = Path(__file__).resolve().parents[1]


def train_on_batch(
    model: DistributedModel,
    x: Any,
    y: Any = None,
    sample_weight: Any = None,
    class_weight: dict[int, float] | None = None,
    return_dict: bool = False,
) -> Any:
    """Keras' ``train_on_batch``: one step of ``fit`` on one batch; see the model's method."""
    check_hooks(model, "train_on_batch", TRAIN_HOOKS)
    compiled = compiled_of(model)
    batch = _one_batch(model, x, y, sample_weight, "train_on_batch", class_weight)
    logs = _train_batch(model, compiled, _reset(compiled), batch)
    return logs if return_dict else _listed(logs, compiled)


def test_on_batch(
    model: DistributedModel,
    x: Any,
    y: Any = None,
    sample_weight: Any = None,
    return_dict: bool = False,
) -> Any:
    """Keras' ``test_on_batch``: ``evaluate`` of one batch."""
    check_hooks(model, "test_on_batch", TEST_HOOKS)
    compiled = compiled_of(model)
    x, y, weight = _one_batch(model, x, y, sample_weight, "test_on_batch")
    M = runtime.get().config.microbatches
    x_p, y_p, w_p, rows = _padded(compiled, x, y, weight, M)
    losses, y_pred = compiled.eval_step(x_p, y_p, *_weights(w_p))
    penalty = compiled.penalties.value()
    logs = _update(compiled, _reset(compiled), losses, y_pred, y, weight, penalty, rows)
    return logs if return_dict else _listed(logs, compiled)


def predict_on_batch(model: DistributedModel, x: Any) -> Any:
    """Keras' ``predict_on_batch``: NumPy predictions of one batch."""
    check_hooks(model, "predict_on_batch", PREDICT_HOOKS)
    x, rows = data.padded(tree.lists_to_tuples(x), runtime.get().config.microbatches)
    x, _, _ = _one_batch(model, x, None, None, "predict_on_batch")
    return tree.map_structure(lambda o: o.concat().numpy()[:rows], predict_step_of(model)(x))


def _parts() -> int:
    """Into how many parts a step splits a replica's batch, for ``ModelLoss.check_alone``:
    its microbatches, or two halves where one microbatch is one of R replicas' parts."""
    rt = runtime.get()
    M = rt.config.microbatches
    return M if M > 1 else 2 if rt.topology.replicas > 1 else 1


def _padded(compiled: Compiled, x: Any, y: Any, weight: Any, M: int) -> tuple[Any, ...]:
    """``data.padded_batch``, its loss weighed by each microbatch's share of the batch's
    targets where the loss ignores a class (``data.counted_weights``); the metrics take
    ``weight`` as it is."""
    x_p, y_p, w_p, rows = data.padded_batch(x, y, weight, M)
    ignored = compiled.loss.ignore_class
    if ignored is not None and M * runtime.get().topology.replicas > 1:
        count = functools.partial(replica_sum, what="count the targets of the batch")
        w_p = data.counted_weights(y_p, weight, rows, M, ignored, count)
    return x_p, y_p, w_p, rows


def _one_batch(
    model: DistributedModel,
    x: Any,
    y: Any,
    weight: Any,
    what: str,
    class_weight: dict[int, float] | None = None,
) -> Any:
    """``(x, y, sample_weight)`` of one batch, of any size (its step pads it to split into
    the microbatches), checked as ``fit`` checks a dataset's and weighted by
    ``class_weight`` as ``fit`` weighs it."""
    # lists become tuples, as in fit's arrays (a list in tf.data is one tensor)
    element = tree.lists_to_tuples(tuple(part for part in (x, y, weight) if part is not None))
    dataset = tf.data.Dataset.from_tensors(element if len(element) > 1 else element[0])
    dataset = data.checked(dataset, 1, what, data.input_ranks(model))
    if class_weight is not None:
        dataset = data.with_class_weight(dataset, class_weight)
    return next(data.batches(dataset, 1))


def _listed(logs: Logs, compiled: Compiled) -> Any:
    """The logs as Keras' ``evaluate`` and ``*_on_batch`` list them (its
    ``_flatten_metrics_in_order``): the loss, the compiled metrics by their own names,
    each output's loss, then what is left by name; one value alone."""
    named = ["loss", *(m.name for m in getattr(compiled.metrics, "metrics", ()))]
    named += [name for name in logs if name.endswith("_loss") and name not in named]
    values = [logs[k] for k in named if k in logs]
    values += [logs[k] for k in sorted(logs) if k not in named]
    return values[0] if len(values) == 1 else values


def _callbacks(
    model: DistributedModel,
    callbacks: Any,
    verbose: Any,
    progbar: keras.callbacks.ProgbarLogger | None = None,
    **params: Any,
) -> keras.callbacks.CallbackList:
    """The user's callbacks with Keras' History, and a progress bar on rank 0 only:
    ``progbar`` where given and the user's callbacks have none, else Keras' own."""
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    rank = runtime.get().rank
    verbose = (1 if verbose == "auto" else verbose) if rank == 0 else 0
    callbacks = for_rank(list(callbacks or []), rank)
    own = any(isinstance(c, keras.callbacks.ProgbarLogger) for c in callbacks)
    if progbar is not None and verbose != 0 and not own:
        callbacks.append(progbar)
    return keras.callbacks.CallbackList(
        callbacks,
        add_history=True,
        add_progbar=verbose != 0,
        model=model,
        verbose=verbose,
        **params,
    )


def _train_epoch(
    model: DistributedModel,
    compiled: Compiled,
    batches: Iterator[tuple[Any, Any, Any]],
    cbs: keras.callbacks.CallbackList,
    record: Record | None = None,
    at_batches: bool = False,
) -> Logs:
    """One epoch's batches; with ``at_batches`` (``decides_at_batches``), whether a
    callback stopped training is agreed over the ranks after each call of the batch
    callbacks. As in Keras, with ``steps_per_execution=S`` those are called once every S
    batches (begin with the first's index, end with the last's) and after the last batch
    (end with the index a full execution would end at, as Keras names it)."""
    trackers = _reset(compiled)
    logs: Logs = {}
    every = _steps_per_execution(model)
    for n, batch in enumerate(batches):
        if n % every == 0:
            cbs.on_train_batch_begin(n)
        logs = _train_batch(model, compiled, trackers, batch, record)
        if (n + 1) % every == 0:
            cbs.on_train_batch_end(n, logs)
            if at_batches:
                agree_to_stop(model)
        if model.stop_training:
            break
    else:
        if logs and (n + 1) % every:  # the epoch's last execution, cut short
            cbs.on_train_batch_end(_execution_end(n, every), logs)
            if at_batches:
                agree_to_stop(model)
    return dict(logs)


def _steps_per_execution(model: DistributedModel) -> int:
    """``compile``'s ``steps_per_execution`` (Keras keeps it on the model; 1 by default)."""
    every = getattr(model, "steps_per_execution", 1)
    return every if isinstance(every, int) and every > 1 else 1


def _execution_end(n: int, every: int) -> int:
    """The batch index Keras ends the execution holding batch ``n`` with: a full
    execution's last, even where the epoch cuts it short."""
    return n - n % every + every - 1


def _train_batch(
    model: DistributedModel,
    compiled: Compiled,
    trackers: Trackers,
    batch: Any,
    record: Record | None = None,
) -> Logs:
    """One optimizer step, as the README's ``@tfsift.step`` loop does it; returns the logs.
    With ``record`` (``SiftConfig(scores="training")``) the batch's per-sample losses go
    back to the sifted dataset."""
    x, y, weight = batch
    # a batch that does not split into the microbatches is padded, its copies weighed 0
    x_p, y_p, w_p, rows = _padded(compiled, x, y, weight, runtime.get().config.microbatches)
    grads, losses, y_pred = compiled.train_step(x_p, y_p, *_weights(w_p))
    check_output_mask(model)  # on every rank, before any update
    compiled.loss.check_alone(y_p, y_pred, _parts())
    grads = compiled.whole_batch(allreduce(grads))  # each part's loss was its share
    grads, penalty = compiled.penalties.apply(grads)  # Keras' model.losses
    # every stage, one without trainable variables too: it takes its part in the sums the
    # others' update makes over the pipeline (a global norm, a loss scale's finite check)
    compiled.update(grads)
    if record is not None:  # a sifted batch splits: never padded
        record(y, y_pred, weight)
    return _update(compiled, trackers, losses, y_pred, y, weight, penalty, rows)


def _check_validation_freq(validation_freq: Any) -> None:
    """Before training: Keras takes an int (every N epochs) or a list of epochs (1-based),
    and says so only when it first validates, after an epoch's training."""
    valid = (isinstance(validation_freq, int) and validation_freq >= 1) or (
        isinstance(validation_freq, list) and all(isinstance(e, int) for e in validation_freq)
    )
    if isinstance(validation_freq, bool) or not valid:
        raise ValueError(
            "fit's validation_freq must be an int >= 1 (validate every that many epochs) or a "
            f"list of the epochs to validate after (1-based). Received: {validation_freq!r}"
        )


def _validates(epoch: int, validation_freq: int | list[int]) -> bool:
    """Whether fit validates after ``epoch`` (0-based), as Keras' ``_should_eval``."""
    if isinstance(validation_freq, list):
        return epoch + 1 in validation_freq
    return (epoch + 1) % validation_freq == 0


def _sift_logs(train: Any) -> Logs:
    """``sift_kept``: the fraction of the epoch's samples the sifted dataset ``train`` kept,
    averaged over the replicas (each keeps its own under most policies)."""
    kept = train.sifter.metrics.as_dict(epoch=True)["kept_fraction"]
    return replica_mean({"sift_kept": kept})


def _recorder(compiled: Compiled, train: Any) -> Record:
    """Hands a step's per-sample losses (unweighted, from its predictions, which every rank
    of the pipeline holds) back to the sifted dataset ``train``."""

    def record(y: Any, y_pred: Any, weight: Any) -> None:
        predictions = tree.map_structure(lambda o: o.concat(), y_pred)
        train.record(compiled.per_sample_loss(y, predictions, weight))

    return record


def _test_loop(
    model: DistributedModel,
    compiled: Compiled,
    batches: Iterator[tuple[Any, Any, Any]],
    cbs: keras.callbacks.CallbackList,
    what: str,
) -> Logs:
    trackers = _reset(compiled)
    logs: Logs = {}
    M = runtime.get().config.microbatches
    cbs.on_test_begin()
    every = _steps_per_execution(model)
    for n, (x, y, weight) in enumerate(batches):
        if n % every == 0:  # as in Keras, once every steps_per_execution batches
            cbs.on_test_batch_begin(n)
        # a batch that does not split into the microbatches is padded, its copies weighed 0
        x_p, y_p, w_p, rows = _padded(compiled, x, y, weight, M)
        losses, y_pred = compiled.eval_step(x_p, y_p, *_weights(w_p))
        if n == 0:  # after a step (the model partitioned); the weights stay as they are
            check_output_mask(model)
            compiled.loss.check_alone(y_p, y_pred, _parts())
            penalty = compiled.penalties.value()
        logs = _update(compiled, trackers, losses, y_pred, y, weight, penalty, rows)
        if (n + 1) % every == 0:
            cbs.on_test_batch_end(n, logs)
    if logs and (n + 1) % every:  # the last execution, cut short
        cbs.on_test_batch_end(_execution_end(n, every), logs)
    if not logs:  # as predict: a loss of nothing is no number to report
        raise ValueError(f"{what} read no batch from the dataset. Received: an empty dataset")
    cbs.on_test_end(logs)
    return dict(logs)


def _ran_dry(model: DistributedModel, epoch: int, first: bool) -> None:
    """An epoch of ``fit`` that trained no batch: an error in the first epoch (nothing
    would be trained at all), else a warning, and training stops, as Keras stops when its
    input runs out."""
    if first:
        raise ValueError(
            f"fit's training data yielded no batch in epoch {epoch + 1}, the first it trains: "
            "check the dataset (a .take(0), a filter that keeps nothing, fewer samples per "
            "replica than one batch with drop_remainder=True). Received: an empty dataset"
        )
    log.warning(
        "fit's training data yielded no batch in epoch %d (a dataset that can be "
        "iterated only once, a generator's?, or sifting that kept less than a batch): "
        "training stops here, as Keras stops when its input runs out",
        epoch + 1,
    )
    model.stop_training = True


def _reset(compiled: Compiled) -> Trackers:
    """Fresh loss means (made at the first update, one per loss the step returns); the
    compiled metrics reset (one epoch or evaluation each)."""
    if compiled.metrics is not None:
        compiled.metrics.reset_state()
    return {}


def _update(
    compiled: Compiled,
    trackers: Trackers,
    losses: dict[str, Any],
    y_pred: Any,
    y: Any,
    weight: Any,
    penalty: float = 0.0,
    rows: int | None = None,
) -> Logs:
    """Updates the loss means (``"loss"`` with the weights' ``penalty``, as Keras' loss
    includes it; each output's without, as Keras tracks them) and the metrics from the
    step's outputs, of its first ``rows`` samples (those of a padded batch; None: all);
    the replicas' mean."""
    y_pred = tree.map_structure(lambda o: o.concat()[:rows], y_pred)
    batch = int(tree.flatten(y_pred)[0].shape[0])
    for name, value in losses.items():
        if name not in trackers:  # a Mean makes its variables: once per loss, not per batch
            trackers[name] = keras.metrics.Mean(name=name)
        mean = value.reduce_mean() + penalty * (name == "loss")
        # Keras weighs the total by the batch's size and each output's loss by the size its
        # compiled step knows statically: the same for batches of one size, none (a plain
        # mean over the batches) where a last batch is smaller
        trackers[name].update_state(mean, sample_weight=batch if name == "loss" else None)
    if compiled.metrics is not None:
        compiled.metrics.update_state(y, y_pred, sample_weight=weight)
    return replica_logs({name: t.result() for name, t in trackers.items()}, compiled.metrics)


def _weights(weight: Any) -> tuple[Any, ...]:
    return () if weight is None else (weight,)
