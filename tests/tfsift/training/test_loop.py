"""One process: fit, evaluate, predict and callbacks on a DistributedModel (partitions=1), and
the Keras habits they keep (ModelCheckpoint, BackupAndRestore, validation_split,
class_weight, predict without compile, *_on_batch); ``tfsift.compiled_update``, fit's
update, in the README's loop; tests/mpi_scripts/fit_check.py runs the multi-rank side."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfsift
from tfsift.training import callbacks
from tfsift.training.data import shuffle_seed

N, B, SEED = 64, 16, 3


class Mlp(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(8, activation="relu")
        self.b = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


def dataset(batch: int = B, drop_remainder: bool = True) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=drop_remainder)


def compiled_model(microbatches: int = 2, **compile_args: Any) -> Mlp:
    tfsift.init({"microbatches": microbatches})
    keras.utils.set_random_seed(SEED)
    model = Mlp()
    compile_args.setdefault("loss", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"], **compile_args)
    return model


def readme_loop(
    epochs: int,
    microbatches: int = 2,
    optimizer: keras.optimizers.Optimizer | None = None,
    compiled: bool = False,
) -> list[np.ndarray]:
    """The README's @tfsift.step loop, same seed and data order: the weights it ends with.
    It updates through ``tfsift.compiled_update`` (``compiled``), as the README writes it,
    or eagerly through ``optimizer.apply_gradients``; SGD(0.1) unless ``optimizer``."""
    tfsift.init({"microbatches": microbatches})
    keras.utils.set_random_seed(SEED)
    model = Mlp()
    loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = optimizer if optimizer is not None else keras.optimizers.SGD(0.1)
    update = (
        tfsift.compiled_update(opt, model)
        if compiled
        else lambda grads: opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    )

    @tfsift.step
    def forward_backward(x: tf.Tensor, y: tf.Tensor) -> Any:
        loss = loss_obj(y, model(x, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    for _ in range(epochs):
        for x, y in dataset():
            update(tfsift.allreduce(forward_backward(x, y)[0]))
    return [v.numpy() for v in model.trainable_variables]


def test_fit_ends_with_the_readme_loops_weights_and_a_history() -> None:
    model = compiled_model()
    history = model.fit(dataset(), epochs=3, verbose=0, validation_data=dataset())
    weights = [v.numpy() for v in model.trainable_variables]
    assert sorted(history.history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert len(history.history["loss"]) == 3
    assert history.history["loss"][-1] < history.history["loss"][0]
    for got, want in zip(weights, readme_loop(3), strict=True):
        np.testing.assert_array_equal(got, want)


class CountingAdam(keras.optimizers.Adam):
    """Adam counting the Python runs of its per-variable update."""

    runs = 0

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        CountingAdam.runs += 1
        super().update_step(gradient, variable, learning_rate)


def test_fit_updates_the_variables_in_one_compiled_call() -> None:
    # eagerly the optimizer's Python would run for each variable at every step (4 x 12
    # here); compiled, only when the update is traced
    tfsift.init({"microbatches": 2})
    model = Mlp()
    model.compile(optimizer=CountingAdam(0.01), loss="sparse_categorical_crossentropy")
    CountingAdam.runs = 0
    model.fit(dataset(), epochs=3, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 3 * N // B
    assert CountingAdam.runs == len(model.trainable_variables)


def test_evaluate_and_predict_match_keras_on_the_same_weights() -> None:
    model = compiled_model()
    model.fit(dataset(), epochs=1, verbose=0)
    loss, accuracy = model.evaluate(dataset(), verbose=0)
    logits = model.predict(dataset(), verbose=0)
    x = np.concatenate([xb for xb, _ in dataset().as_numpy_iterator()])
    y = np.concatenate([yb for _, yb in dataset().as_numpy_iterator()])
    want = model.b(model.a(x)).numpy()  # partitions=1: the rank holds every layer
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-6)
    assert accuracy == pytest.approx(float(np.mean(want.argmax(-1) == y)))
    per_sample = keras.losses.sparse_categorical_crossentropy(y, want, from_logits=True)
    assert loss == pytest.approx(float(np.mean(per_sample)), rel=1e-5)
    assert model.evaluate(dataset(), verbose=0, return_dict=True) == {
        "loss": loss,
        "accuracy": accuracy,
    }


def seeded_layers() -> list[keras.layers.Layer]:
    """The same initial weights in every model made of them."""
    init = keras.initializers.GlorotUniform
    return [
        keras.layers.Dense(8, "relu", kernel_initializer=init(1)),
        keras.layers.Dense(3, kernel_initializer=init(2)),
    ]


class SeededMlp(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = seeded_layers()

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


def as_keras(model: keras.Model, **compile_args: Any) -> keras.Model:
    """``model`` compiled as these comparisons with Keras compile both sides."""
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        **compile_args,
    )
    return model


def keras_and_tfsift() -> tuple[keras.Model, keras.Model]:
    """A Keras model and a DistributedModel of the same layers and initial weights."""
    return keras.Sequential([keras.Input((5,)), *seeded_layers()]), SeededMlp()


def seventy() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """70 samples (not a multiple of the batch of 16), labels and sample weights."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(70, 5)).astype(np.float32), rng.integers(0, 3, 70)
    return x, y, rng.uniform(size=70).astype(np.float32)


@pytest.mark.parametrize("data", ["dataset", "arrays", "repeated"])
def test_steps_per_epoch_carries_on_where_the_last_epoch_stopped_as_keras_does(data: str) -> None:
    # 3 steps an epoch of 4 batches: Keras' epoch 2 takes batch 4 (and, the dataset ended,
    # stops it with a warning), epoch 3 batches 1-3 again; of a repeated dataset, batches
    # 4-6 and 7-9. Each epoch used to start again from batch 1.
    tfsift.init({"microbatches": 2})
    x, y = (np.concatenate([t.numpy() for t in part]) for part in zip(*dataset(), strict=True))
    runs = []
    for model in keras_and_tfsift():
        as_keras(model)
        args: dict[str, Any] = {"x": x, "y": y, "batch_size": B, "shuffle": False}
        if data != "arrays":
            args = {"x": dataset().repeat() if data == "repeated" else dataset()}
        history = model.fit(**args, epochs=3, steps_per_epoch=3, verbose=0)
        runs.append((history.history["loss"], model.get_weights()))
    (want, expected), (got, weights) = runs
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for a, b in zip(weights, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_validation_steps_start_each_validation_at_the_first_batch_as_keras_does() -> None:
    # unlike steps_per_epoch: Keras' evaluate resets the validation iterator it keeps, so
    # 3 steps of 4 batches validate on batches 1-3 every epoch
    tfsift.init({"microbatches": 2})
    runs = []
    for model in keras_and_tfsift():
        as_keras(model)
        history = model.fit(
            dataset(), epochs=3, validation_data=dataset(), validation_steps=3, verbose=0
        )
        runs.append(history.history["val_loss"])
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-6)


def test_evaluate_and_validation_on_arrays_take_every_sample_as_keras_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 70 samples in batches of 16: whole batches take 64; the 6 left are a last batch of
    # 3 microbatches of 2 (they were left out of the loss and metrics without a word).
    # And evaluate with sample weights after evaluate without (a step was planned for one
    # of the two structures, and the other failed)
    tfsift.init({"microbatches": 2})
    x, y, weight = seventy()
    got = []
    for model in keras_and_tfsift():
        as_keras(model, metrics=["accuracy"])
        history = model.fit(
            x[:64], y[:64], batch_size=16, shuffle=False, verbose=0, validation_data=(x, y)
        )
        evaluated = model.evaluate(x, y, batch_size=16, verbose=0)
        weighted = model.evaluate(x, y, sample_weight=weight, batch_size=16, verbose=0)
        got.append([*history.history["val_loss"], *evaluated, *weighted])
    np.testing.assert_allclose(got[1], got[0], rtol=1e-6)
    # 69: the 5 left do not split into 2 microbatches; the last batch is padded to 6 with
    # a copy weighed 0 (all 5 were left out before, with a warning), and so is a dataset's
    # last batch of 5 (refused before, with the advice to drop it), weighted or not
    runs = []
    for model in keras_and_tfsift():
        as_keras(model, metrics=["accuracy"])
        weighted = tf.data.Dataset.from_tensor_slices((x[:69], y[:69], weight[:69])).batch(16)
        with caplog.at_level(logging.WARNING, logger="tfsift"):
            arrays = model.evaluate(x[:69], y[:69], batch_size=16, verbose=0)
            by_dataset = model.evaluate(weighted, verbose=0)
            history = model.fit(
                x[:64], y[:64], batch_size=16, shuffle=False, verbose=0, validation_data=weighted
            )
        runs.append([*arrays, *by_dataset, *history.history["val_loss"]])
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-6)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == []


@pytest.mark.parametrize("n", [70, 69])
def test_fit_trains_every_sample_in_a_last_partial_batch_as_keras_does(
    n: int, caplog: pytest.LogCaptureFixture
) -> None:
    # batches of 16: 70 samples end with a batch of 6, 3 microbatches of 2; 69 with one of
    # 5, padded to 6 with a copy weighed 0 (they were left out of every epoch without a
    # word); as arrays and as a dataset (whose last batch of 5 was refused), weighted
    tfsift.init({"microbatches": 2})
    x, y, weight = seventy()
    x, y, weight = x[:n], y[:n], weight[:n]
    batches = tf.data.Dataset.from_tensor_slices((x, y, weight)).batch(16)
    runs = []
    for model, data in ((keras_and_tfsift()[0], "arrays"), (SeededMlp(), "arrays"),
                        (SeededMlp(), "dataset")):  # fmt: skip
        as_keras(model, metrics=["accuracy"])
        with caplog.at_level(logging.WARNING, logger="tfsift"):
            if data == "arrays":
                fitted = model.fit(
                    x, y, sample_weight=weight, batch_size=16, epochs=2, shuffle=False, verbose=0
                )
            else:
                fitted = model.fit(batches, epochs=2, verbose=0)
        runs.append((fitted.history, model.get_weights()))
    want, expected = runs[0]
    for got, weights in runs[1:]:
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)
        for a, b in zip(weights, expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == []


def test_on_batch_methods_take_a_batch_that_does_not_split_as_keras_does() -> None:
    # 5 samples on 2 microbatches: padded to 6, the copy weighed 0 (refused before)
    tfsift.init({"microbatches": 2})
    x, y, weight = seventy()
    runs = []
    for model in keras_and_tfsift():
        as_keras(model, metrics=["accuracy"])
        trained = model.train_on_batch(x[:5], y[:5], sample_weight=weight[:5])
        tested = model.test_on_batch(x[5:10], y[5:10])
        runs.append([*trained, *tested, *np.ravel(model.predict_on_batch(x[:5]))])
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-6, atol=1e-7)


def test_fit_on_fewer_samples_than_a_batch_trains_them_as_one_batch_as_keras_does() -> None:
    # a smoke test's 10 samples with the default batch of 32: refused before
    tfsift.init({"microbatches": 2})
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(10, 5)).astype(np.float32), rng.integers(0, 3, 10)
    runs = []
    for model in keras_and_tfsift():
        as_keras(model)
        runs.append((model.fit(x, y, epochs=2, verbose=0).history["loss"], model.get_weights()))
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=1e-6)
    for a, b in zip(runs[1][1], runs[0][1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_evaluate_and_validation_on_fewer_samples_than_a_batch_take_them_as_keras_does() -> None:
    # a quick check on a few samples: 10 with the default batch of 32, 5 (odd) in batches
    # of 16, as evaluate's and as fit's validation arrays (refused before: "fewer than one
    # batch"); and batches of 5 that do not split into the microbatches, as a dataset's
    # already could (refused before: "a positive multiple of microbatches=2")
    tfsift.init({"microbatches": 2})
    x, y, weight = seventy()
    runs = []
    for model in keras_and_tfsift():
        as_keras(model, metrics=["accuracy"])
        few = model.evaluate(x[:10], y[:10], verbose=0)
        odd = model.evaluate(x[:5], y[:5], sample_weight=weight[:5], batch_size=16, verbose=0)
        fives = model.evaluate(x, y, batch_size=5, verbose=0)
        history = model.fit(
            x[:32], y[:32], batch_size=16, shuffle=False, verbose=0, validation_data=(x[:5], y[:5])
        )
        by_five = model.fit(
            x[:32], y[:32], batch_size=16, shuffle=False, verbose=0, validation_data=(x, y),
            validation_batch_size=5,
        )  # fmt: skip
        logs = [*history.history["val_loss"], *history.history["val_accuracy"]]
        runs.append([*few, *odd, *fives, *logs, *by_five.history["val_loss"]])
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-6)


def pair_net(base: type) -> Any:
    """A model whose one input is a pair of arrays, of class ``base``."""

    class PairNet(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = seeded_layers()

        def call(self, x: Any) -> Any:
            return self.b(self.a(keras.ops.concatenate([x[0], x[1]], axis=-1)))

    return PairNet()


def test_predict_takes_a_pair_or_a_list_of_arrays_as_one_input_as_keras_does() -> None:
    # the pair was taken for inputs and targets: "zip() argument 2 is shorter than
    # argument 1" after a fit, Keras' "expected min_ndim=2, found ndim=1" before one
    tfsift.init({"microbatches": 2})
    x, y, _ = seventy()
    pair = (x[:, :2], x[:, 2:])
    runs = []
    for model in (pair_net(keras.Model), pair_net(tfsift.DistributedModel)):
        as_keras(model)
        before = model.predict(pair, batch_size=16, verbose=0)
        model.fit(pair, y, batch_size=16, shuffle=False, verbose=0)
        after = model.predict(list(pair), verbose=0)
        runs.append([before, after])
    for got, want in zip(runs[1], runs[0], strict=True):
        assert got.shape == want.shape == (70, 3)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_fits_shuffle_follows_keras_global_seed() -> None:
    # the order was from_arrays' seed 0 whatever keras.utils.set_random_seed said: runs
    # meant to vary by their seed trained the same batches (Keras' shuffle follows it)
    tfsift.init({"microbatches": 2})
    x, y, _ = seventy()
    histories = {}
    for seed in (0, 1, 0):
        keras.utils.set_random_seed(seed)
        assert shuffle_seed() == seed
        model = as_keras(SeededMlp())
        loss = model.fit(x[:64], y[:64], batch_size=16, epochs=2, verbose=0).history["loss"]
        histories.setdefault(seed, []).append(loss)
    assert histories[0][0] == histories[0][1]  # the same seed: the same batches
    assert histories[1][0] != histories[0][0]


def summed_loss(y_true: Any, y_pred: Any) -> Any:
    """tf.distribute's idiom: a loss that reduces the batch itself, a sum over a batch size."""
    per_sample = keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
    return keras.ops.sum(per_sample) / B


@pytest.mark.parametrize("nested", [False, True])
def test_a_loss_reducing_the_batch_itself_is_refused_where_microbatches_split_it(
    nested: bool,
) -> None:
    # averaged over 2 microbatches, a sum over the batch came out half of Keras': weights
    # 0.04 from Keras' after 2 epochs, without a word
    model = compiled_model(loss=[summed_loss] if nested else summed_loss)
    with pytest.raises(ValueError) as err:
        model.fit(dataset(), epochs=1, verbose=0)
    assert str(err.value) == (
        "the loss 'summed_loss' returns one value for the whole batch, where Keras' losses "
        "return one per sample and average them. tfsift's fit splits each batch into 2 "
        "microbatch(es) on 1 replica(s) and averages their losses, which equals the batch's "
        "loss only for a mean over samples; a sum (e.g. divided by a batch size, "
        "tf.distribute's idiom) would train at 1/M of it and a loss over pairs of samples "
        "differently, without a word. Return the per-sample losses and let Keras average "
        "them, or compute the loss in a @tfsift.step loop of your own. Received: "
        "summed_loss returning shape ()"
    )


def test_a_loss_reducing_the_batch_itself_trains_as_keras_on_one_microbatch() -> None:
    # one microbatch on one replica is Keras' own batch: the loss is taken as it is
    tfsift.init({"microbatches": 1})
    runs = []
    for model in keras_and_tfsift():
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=summed_loss)
        runs.append((model.fit(dataset(), epochs=2, verbose=0).history, model.get_weights()))
    np.testing.assert_allclose(runs[1][0]["loss"], runs[0][0]["loss"], rtol=1e-6)
    for a, b in zip(runs[1][1], runs[0][1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_lambda_loss_under_mixed_precision_is_checked_as_keras_converts_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the per-sample check called the function on a float64 target and a bfloat16 output
    # (Keras converts both first): it failed; and a lambda's name, "<lambda>", no name
    # scope, made the step fall back to running eagerly
    tfsift.init({"microbatches": 2})
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        x, y, _ = seventy()
        target = y.astype(np.float64)[:, None]
        runs = []
        for model in keras_and_tfsift():
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss=lambda a, b: (a - b) ** 2)
            with caplog.at_level(logging.WARNING, logger="tfsift"):
                runs.append(model.fit(x[:64], target[:64], batch_size=16, verbose=0))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    # bfloat16 rounds microbatches of 8 otherwise than Keras' batch of 16 (under 2% apart
    # run alone, 3.4% in one run beside other tests)
    np.testing.assert_allclose(runs[1].history["loss"], runs[0].history["loss"], rtol=0.1)
    assert [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()] == []


def test_callbacks_early_stopping_and_learning_rate_scheduler() -> None:
    model = compiled_model()
    seen: list[float] = []
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.1 / (epoch + 1))
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: seen.append(float(model.optimizer.learning_rate))
    )
    # min_delta so large that no epoch counts as an improvement: stops after 1 + patience
    stop = keras.callbacks.EarlyStopping(monitor="loss", min_delta=10.0, patience=1)
    history = model.fit(dataset(), epochs=10, verbose=0, callbacks=[schedule, record, stop])
    assert len(history.history["loss"]) == 2
    assert seen == pytest.approx([0.1, 0.05])
    assert history.history["learning_rate"] == pytest.approx([0.1, 0.05])


@pytest.mark.parametrize(
    "loss",
    [
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        "sparse_categorical_crossentropy",
        keras.losses.sparse_categorical_crossentropy,
    ],
    ids=["object", "name", "function"],
)
def test_a_loss_given_as_object_name_or_function_trains(loss: Any) -> None:
    model = compiled_model(loss=loss)
    history = model.fit(dataset(), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_fit_with_sift_trains_on_the_kept_samples() -> None:
    model = compiled_model()
    config = tfsift.SiftConfig(policy="big_loss", keep=0.5)
    history = model.fit(dataset(), epochs=2, verbose=0, sift=config)
    assert len(history.history["loss"]) == 2
    assert tfsift.sift_metrics()["kept_fraction"] == pytest.approx(0.5)
    assert history.history["sift_kept"] == pytest.approx([0.5, 0.5])
    epoch, total = tfsift.sift_metrics(epoch=True), tfsift.sift_metrics()
    assert (epoch["samples_seen"], epoch["samples_kept"], epoch["epochs"]) == (N, N // 2, 2)
    assert total["samples_seen"] == 2 * N
    assert epoch["mean_loss_kept"] > epoch["mean_loss_scored"] > 0  # big_loss: the larger


class Pair(Mlp):
    """The Mlp on a dict of two inputs, joined."""

    def call(self, x: Any) -> Any:
        return super().call(keras.ops.concatenate([x["a"], x["b"]], axis=-1))


def test_fit_with_forward_scores_on_a_dict_input_scores_and_trains_the_same() -> None:
    # the scorer cut the model on np.asarray(the dict)[:rows]: "too many indices for array"
    tfsift.init({"microbatches": 2})
    config = tfsift.SiftConfig(policy="big_loss", keep=0.5)
    x = np.random.default_rng(0).normal(size=(N, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    losses = []
    for cls, inputs in ((Mlp, x), (Pair, {"a": x[:, :3], "b": x[:, 3:]})):
        keras.utils.set_random_seed(SEED)
        model = cls()
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        fitted = model.fit(inputs, y, batch_size=B, epochs=2, shuffle=False, verbose=0, sift=config)
        assert fitted.history["sift_kept"] == pytest.approx([0.5, 0.5])
        losses.append(fitted.history["loss"])
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)


def test_a_sifted_fit_cut_by_steps_per_epoch_counts_the_batches_it_trained() -> None:
    # the epoch read one batch past steps_per_epoch, which the sifted dataset counted as kept
    model = compiled_model()
    x, y = arrays()
    config = tfsift.SiftConfig(policy="infobatch")  # the first epoch keeps every sample
    history = model.fit(x, y, batch_size=B, steps_per_epoch=2, verbose=0, sift=config)
    assert history.history["sift_kept"] == [2 * B / N]


def test_fit_with_training_scores_hands_each_steps_losses_back_and_scores_nothing() -> None:
    model = compiled_model()
    config = tfsift.SiftConfig(policy="big_loss", keep=0.5, scores="training", stale=1)
    model.fit(dataset(), epochs=3, verbose=0, sift=config)
    metrics = tfsift.sift_metrics()
    assert metrics["samples_scored"] == 0  # no scoring forward: the losses came from fit
    assert metrics["samples_reused"] > 0  # epochs 2 and 3 selected on epoch 1's and 2's
    assert metrics["kept_fraction"] < 1.0


def test_fit_with_infobatch_on_arrays_plans_by_row_and_never_reads_a_pruned_row(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tfsift.parallel.arrays import ArrayDataset

    read: list[int] = []
    gather = ArrayDataset.gather
    monkeypatch.setattr(
        ArrayDataset,
        "gather",
        lambda self, rows: (read.extend(rows.tolist()), gather(self, rows))[1],
    )
    model = compiled_model()
    config = tfsift.SiftConfig(policy="infobatch", anneal=0.0)  # fit's epochs, its weights
    x, y = (np.concatenate([t.numpy() for t in part]) for part in zip(*dataset(), strict=True))
    history = model.fit(x, y, batch_size=B, epochs=3, verbose=1, sift=config)
    metrics = tfsift.sift_metrics()
    assert metrics["samples_scored"] == 0 and metrics["samples_reused"] == 2 * N
    assert metrics["policy/pruned"] > 0 and metrics["samples_kept"] < 3 * N
    assert len(read) == metrics["samples_kept"]  # the rows read are the rows trained
    # each epoch's bar counts the batches it trained, not the first epoch's 4
    epoch = tfsift.sift_metrics(epoch=True)
    trained = [N // B, None, epoch["batches_yielded"]]
    trained[1] = metrics["batches_yielded"] - trained[0] - trained[2]
    assert trained[1] < N // B and trained[2] < N // B
    out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # Keras' colours
    bars = [re.findall(r"(\d+/\d+) ━", epoch) for epoch in out.split("Epoch ")[1:]]
    assert [bar[-1] for bar in bars] == [f"{n}/{n}" for n in trained], out
    assert bars[1][0] == f"1/{trained[1]}"  # planned at the epoch's start, by row
    # History: the fraction of each epoch's samples kept
    assert history.history["sift_kept"] == pytest.approx([1.0, *(n * B / N for n in trained[1:])])
    assert epoch["samples_seen"] == N and epoch["kept_fraction"] == trained[2] * B / N
    assert epoch["mean_loss_scored"] is None  # ranked by the table, nothing scored: no NaN


@pytest.mark.parametrize("per_token", [False, True], ids=["per_sample", "per_token"])
def test_fit_weighs_a_sifted_batch_by_the_sample_weights_times_infobatchs(per_token: bool) -> None:
    # Weights of 2 at half the learning rate train as none at the full one, with the same
    # selection (InfoBatch ranks unweighted losses), and log twice the loss: so InfoBatch's
    # weights and the sample weights both reach the loss. Each used to fail at the first
    # step (a batch of four parts). Per token: the weights of a sequence's positions.
    x, y = (np.concatenate([t.numpy() for t in part]) for part in zip(*dataset(), strict=True))
    if per_token:
        x, y = np.stack([x, -x], axis=1), np.stack([y, y], axis=1)  # 2 positions a sample
    runs = []
    for weight, lr in ((None, 0.1), (np.full(y.shape, 2.0, np.float32), 0.05)):
        model = compiled_model()
        model.optimizer.learning_rate.assign(lr)
        history = model.fit(
            x, y, sample_weight=weight, batch_size=B, epochs=3, shuffle=False, verbose=0,
            sift=tfsift.SiftConfig(policy="infobatch"),
        )  # fmt: skip
        runs.append((history.history, weights_of(model)))
    (plain, trained), (doubled, weighted) = runs
    assert plain["sift_kept"] == doubled["sift_kept"] and min(plain["sift_kept"]) < 1.0
    np.testing.assert_allclose(doubled["loss"], 2 * np.asarray(plain["loss"]), rtol=1e-5)
    for a, b in zip(trained, weighted, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_fit_weighs_each_sample_of_a_token_model_by_infobatch_as_the_readme_loop_does() -> None:
    # logits per token, 8 tokens a sample and microbatches of 8: InfoBatch's weight of a
    # sample, shape (8,), broadcast by Keras against losses of shape (8, 8), would weigh
    # token t by sample t's weight; fit weighs every token of a sample by its own
    x, y = (np.concatenate([t.numpy() for t in part]) for part in zip(*dataset(), strict=True))
    x = np.stack([np.roll(x, t, axis=1) for t in range(8)], axis=1)  # (N, 8, 5)
    y = np.stack([np.roll(y, t) for t in range(8)], axis=1)  # (N, 8)
    config = tfsift.SiftConfig(policy="infobatch", epochs=3)
    fitted = compiled_model()
    history = fitted.fit(x, y, batch_size=B, epochs=3, shuffle=False, verbose=0, sift=config)
    assert history.history["sift_kept"] == [1.0, 0.5, 0.5]

    model = compiled_model()  # the same initial weights
    per_token = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    update = tfsift.compiled_update(model.optimizer, model)
    train = tfsift.from_arrays((x, y), batch_size=B, shuffle=False).apply(
        tfsift.sift(config=config)
    )

    @tfsift.step
    def weighted_step(x: Any, y: Any, w: Any) -> Any:
        losses = per_token(y, model(x, training=True))  # (b, 8)
        loss = keras.ops.mean(w[:, None] * losses)  # each sample's weight on its tokens
        return tfsift.gradients(loss, model.trainable_variables), keras.ops.mean(losses, axis=1)

    for _ in range(3):
        for xb, yb, wb in train:
            grads, losses = weighted_step(xb, yb, wb)
            train.record(losses)
            update(tfsift.allreduce(grads))
    assert_same_weights(fitted, model)


@pytest.mark.parametrize("on_arrays", [True, False], ids=["arrays", "dataset"])
def test_fit_from_initial_epoch_runs_infobatchs_schedule_from_that_epoch(on_arrays: bool) -> None:
    # epochs 3 and 4 of 4, annealed over the last quarter: the first has no scores yet and
    # the last anneals, so neither prunes; counted from 1, the second pruned as epoch 2
    x, y = (np.concatenate([t.numpy() for t in part]) for part in zip(*dataset(), strict=True))
    data = (x, y) if on_arrays else (dataset(),)
    history = compiled_model().fit(
        *data, batch_size=B if on_arrays else None, epochs=4, initial_epoch=2, verbose=0,
        sift=tfsift.SiftConfig(policy="infobatch", anneal=0.25),
    )  # fmt: skip
    assert history.history["sift_kept"] == [1.0, 1.0]
    assert tfsift.sift_metrics()["epochs"] == 4


def test_fit_scores_a_padded_sequence_by_its_weighted_tokens_as_its_loss_counts_them() -> None:
    # per-token sample weights 0 on the padding (the documented stand-in for an output
    # mask): a sample's score is the mean over the tokens its loss counts, not the
    # padding's random targets too; the README's loop recording the same equals fit
    x, y = (np.concatenate([t.numpy() for t in part]) for part in zip(*dataset(), strict=True))
    x = np.stack([np.roll(x, t, axis=1) for t in range(8)], axis=1)  # (N, 8, 5)
    y = np.stack([np.roll(y, t) for t in range(8)], axis=1)  # (N, 8)
    rng = np.random.default_rng(7)
    length = rng.integers(2, 9, N)  # tokens per sample; the rest is padding
    padding = np.arange(8)[None, :] >= length[:, None]
    y = np.where(padding, rng.integers(0, 3, y.shape), y)  # what the padding would cost
    mask = (~padding).astype(np.float32)
    config = tfsift.SiftConfig(policy="infobatch", epochs=3)
    fitted = compiled_model()
    history = fitted.fit(
        x, y, sample_weight=mask, batch_size=B, epochs=3, shuffle=False, verbose=0, sift=config
    )
    assert history.history["sift_kept"][1] < 1.0

    model = compiled_model()  # the same initial weights
    per_token = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    update = tfsift.compiled_update(model.optimizer, model)
    train = tfsift.from_arrays((x, y, mask), batch_size=B, shuffle=False)
    train = train.apply(tfsift.sift(config=config))

    @tfsift.step
    def weighted_step(x: Any, y: Any, mask: Any, w: Any) -> Any:
        losses = per_token(y, model(x, training=True))  # (b, 8)
        weights = mask * w[:, None]  # the padding's 0, the sample's weight on its tokens
        loss = keras.ops.mean(losses * weights)
        score = tf.math.divide_no_nan(tf.reduce_sum(weights * losses, 1), tf.reduce_sum(weights, 1))
        return tfsift.gradients(loss, model.trainable_variables), score

    for _ in range(3):
        for xb, yb, mb, wb in train:
            grads, scores = weighted_step(xb, yb, mb, wb)
            train.record(scores)
            update(tfsift.allreduce(grads))
    assert_same_weights(fitted, model)


def test_fit_with_infobatch_for_other_epochs_than_it_trains_fails_before_training() -> None:
    model = compiled_model()
    config = tfsift.SiftConfig(policy="infobatch", epochs=3)
    with pytest.raises(ValueError) as err:
        model.fit(dataset(), epochs=5, verbose=0, sift=config)
    assert str(err.value) == (
        "policy='infobatch' stops pruning for the last anneal fraction of its epochs, so they "
        "must be the epochs fit trains. Received: fit(epochs=5) with SiftConfig(epochs=3); "
        "pass sift=config.replace(epochs=5)"
    )
    assert model.partitioned is None  # nothing ran


def test_a_batch_size_not_divisible_by_microbatches_fails_before_training() -> None:
    # every step would be padded; a last, smaller batch is (64 in batches of 6: 4 left)
    model = compiled_model(microbatches=3)
    with pytest.raises(ValueError) as err:
        model.fit(dataset(), verbose=0)
    assert str(err.value) == (
        "fit needs a batch size that splits into microbatches=3 equal parts (a last, smaller "
        "batch is padded to split, as Keras trains it): batch the dataset with .batch(B), B a "
        "multiple of 3. Received: batch size 16"
    )
    assert model.partitioned is None  # nothing ran
    history = model.fit(dataset(batch=6, drop_remainder=False), verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_a_dataset_of_known_size_trains_without_drop_remainder_when_every_batch_splits() -> None:
    model = compiled_model(microbatches=4)
    history = model.fit(dataset(drop_remainder=False), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_evaluate_and_predict_refuse_single_samples_as_fit_does() -> None:
    model = compiled_model()
    model.fit(dataset(), epochs=1, verbose=0)  # traced: inputs of 2 dimensions
    x, y = arrays()
    spec = "TensorSpec(shape=(5,), dtype=tf.float32, name=None)"
    why = "the model's inputs have 2 dimensions with the batch axis, these elements 1"
    for what, call in [
        ("predict", lambda: model.predict(tf.data.Dataset.from_tensor_slices(x), verbose=0)),
        ("evaluate", lambda: model.evaluate(tf.data.Dataset.from_tensor_slices((x, x)))),
    ]:
        with pytest.raises(ValueError) as err:
            call()
        got = "(" + spec + ", " + spec + ")" if what == "evaluate" else spec
        assert str(err.value) == (
            f"{what} needs a batched dataset (call .batch(B, drop_remainder=True)): {why}. "
            f"Received: element_spec={got}"
        )
    with pytest.raises(ValueError, match=r"^evaluate needs a batched dataset .* Received: elem"):
        model.evaluate(tf.data.Dataset.from_tensor_slices((x, y)), verbose=0)


def test_an_empty_dataset_fails_fit_and_evaluate_naming_it() -> None:
    model = compiled_model()
    empty = dataset().take(0)
    with pytest.raises(ValueError) as err:
        model.fit(empty, epochs=2, verbose=0)
    assert str(err.value) == (
        "fit's training data yielded no batch in epoch 1, the first it trains: check the "
        "dataset (a .take(0), a filter that keeps nothing, fewer samples per replica than one "
        "batch with drop_remainder=True). Received: an empty dataset"
    )
    model.fit(dataset(), epochs=1, verbose=0)
    for what, call in [
        ("evaluate", lambda: model.evaluate(empty, verbose=0)),
        ("fit's validation_data", lambda: model.fit(dataset(), validation_data=empty, verbose=0)),
    ]:
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == (
            f"{what} read no batch from the dataset. Received: an empty dataset"
        )


def test_an_input_that_runs_dry_after_an_epoch_stops_fit_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = compiled_model()
    once = iter(list(dataset()))  # a generator's data: iterated once, then empty
    spec = dataset().element_spec
    with caplog.at_level("WARNING", logger="tfsift"):
        history = model.fit(
            tf.data.Dataset.from_generator(lambda: once, output_signature=spec),
            epochs=4,
            verbose=0,
        )
    assert len(history.history["loss"]) == 1  # epoch 2 trained nothing, and fit stopped there
    assert caplog.messages == [
        "fit's training data yielded no batch in epoch 2 (a dataset that can be "
        "iterated only once, a generator's?, or sifting that kept less than a batch): training "
        "stops here, as Keras stops when its input runs out"
    ]


def test_predict_before_any_step_names_batch_for_single_samples() -> None:
    tfsift.init({})
    x, _ = arrays()
    with pytest.raises(ValueError) as err:
        Mlp().predict(tf.data.Dataset.from_tensor_slices(x), verbose=0)  # not traced yet
    assert str(err.value).startswith(
        "predict could not trace the model on the dataset's first element (Input 0 "
    )
    assert str(err.value).endswith(
        "predict needs a batched dataset; if this one is not, call .batch(B). Received: "
        "element_spec=TensorSpec(shape=(5,), dtype=tf.float32, name=None)"
    )


class Branches(Mlp):
    """A Python branch on ``training``, which tfsift refuses at its trace."""

    def call(self, x: Any, training: bool | None = None) -> Any:
        return self.b(self.a(x)) if training else self.b(keras.ops.relu(self.a(x)))


def test_predict_before_any_step_says_only_the_models_refusal_of_a_model() -> None:
    # tfsift's own refusal ended "predict needs a batched dataset; if this one is not,
    # call .batch(B)", of arrays that were batched
    tfsift.init({})
    x, _ = arrays()
    with pytest.raises(ValueError) as err:
        Branches().predict(x, verbose=0)
    assert str(err.value).startswith("tfsift traces Branches.call once into a graph")
    assert "batch" not in str(err.value)


def test_fit_before_compile_says_to_compile() -> None:
    tfsift.init({})
    with pytest.raises(RuntimeError, match=r"model.compile\(optimizer="):
        Mlp().fit(dataset(), verbose=0)


class OwnSteps(Mlp):
    """Keras' "Customizing what happens in fit()": a loss of its own, a predict_step."""

    def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
        return 0.0 * super().compute_loss(*args, **kwargs)

    def predict_step(self, data: Any) -> Any:
        return super().predict_step(data)


def test_keras_hooks_a_model_overrides_are_refused_before_any_step() -> None:
    # tfsift's fit ran its own step and trained as if compute_loss were not there
    compiled_model()
    model = OwnSteps()
    model.compile(optimizer="sgd", loss="mse")
    x, y = next(iter(dataset()))
    for what, run in [("fit", lambda: model.fit(dataset(), verbose=0)),
                      ("evaluate", lambda: model.evaluate(dataset(), verbose=0)),
                      ("train_on_batch", lambda: model.train_on_batch(x, y)),
                      ("test_on_batch", lambda: model.test_on_batch(x, y))]:  # fmt: skip
        with pytest.raises(ValueError) as err:
            run()
        assert str(err.value) == (
            f"tfsift's {what} runs its own pipelined step, which does not call compute_loss as "
            f"Keras' {what} does: write the step as a @tfsift.step function in a loop of your "
            "own (README), or leave compute_loss to Keras. Received: OwnSteps overrides "
            "compute_loss"
        )
    for what, run in [("predict", lambda: model.predict(x, verbose=0)),
                      ("predict_on_batch", lambda: model.predict_on_batch(x))]:  # fmt: skip
        with pytest.raises(ValueError, match=f"^tfsift's {what} runs .* overrides predict_step$"):
            run()
    assert model.partitioned is None  # refused before the first step traced it


class OwnLogs(Mlp):
    """A model whose logs Keras builds with its own ``get_metrics_result``."""

    def get_metrics_result(self) -> dict[str, Any]:
        return {**super().get_metrics_result(), "custom": 1.0}


def test_a_model_with_logs_of_its_own_is_refused_before_any_step() -> None:
    # tfsift's logs left the override's "custom" out without a word
    compiled_model()
    model = OwnLogs()
    model.compile(optimizer="sgd", loss="mse")
    for what, run in [("fit", lambda: model.fit(dataset(), verbose=0)),
                      ("evaluate", lambda: model.evaluate(dataset(), verbose=0))]:  # fmt: skip
        with pytest.raises(ValueError, match=f"^tfsift's {what} runs .* overrides get_metrics"):
            run()
    assert model.partitioned is None


@pytest.mark.parametrize("freq", [[1, 3], 2])
def test_validation_freq_takes_an_int_or_a_list_of_epochs_as_keras_does(freq: Any) -> None:
    # a list raised "unsupported operand type(s) for %" after the first epoch's training
    history = compiled_model().fit(
        dataset(), epochs=3, validation_data=dataset(), validation_freq=freq, verbose=0
    )
    validated = [1, 3] if freq == [1, 3] else [2]
    assert len(history.history["val_loss"]) == len(validated)


@pytest.mark.parametrize("freq", [0, "2", 1.5, [1, "2"], True])
def test_a_validation_freq_of_another_kind_is_refused_before_training(freq: Any) -> None:
    model = compiled_model()
    with pytest.raises(ValueError) as err:
        model.fit(dataset(), epochs=2, validation_data=dataset(), validation_freq=freq, verbose=0)
    assert str(err.value) == (
        "fit's validation_freq must be an int >= 1 (validate every that many epochs) or a "
        f"list of the epochs to validate after (1-based). Received: {freq!r}"
    )
    assert model.partitioned is None  # before the first step


def test_the_progress_bar_shows_on_rank_0(capsys: pytest.CaptureFixture[str]) -> None:
    model = compiled_model()
    model.fit(dataset(), epochs=1, verbose=2)
    assert "loss:" in capsys.readouterr().out


def test_tensorboard_writes_train_and_validation_events_on_rank_0_only(tmp_path: Path) -> None:
    model = compiled_model()
    board = keras.callbacks.TensorBoard(str(tmp_path))
    model.fit(dataset(), epochs=1, verbose=0, validation_data=dataset(), callbacks=[board])
    assert [len(list((tmp_path / d).glob("events.*"))) for d in ("train", "validation")] == [1, 1]
    stop = keras.callbacks.EarlyStopping()
    assert callbacks.for_rank([board, stop], 0) == [board, stop]
    assert callbacks.for_rank([board, stop], 1) == [stop]


def arrays() -> tuple[np.ndarray, np.ndarray]:
    x, y = zip(*dataset().unbatch().as_numpy_iterator(), strict=True)
    return np.stack(x), np.stack(y)


def test_arrays_train_as_the_dataset_of_their_batches() -> None:
    x, y = arrays()
    from_arrays = compiled_model()
    history = from_arrays.fit(
        x, y, batch_size=B, epochs=2, shuffle=False, verbose=0, validation_data=(x, y)
    )
    from_dataset = compiled_model()
    want = from_dataset.fit(dataset(), epochs=2, verbose=0, validation_data=dataset())
    assert history.history == want.history
    for a, b in zip(from_arrays.trainable_variables, from_dataset.trainable_variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert from_arrays.evaluate(x, y, batch_size=B, verbose=0) == from_dataset.evaluate(
        dataset(), verbose=0
    )


def test_predict_returns_one_row_per_sample_whatever_the_microbatches() -> None:
    # 37 = 2 batches of 16 and 5 rows, not a multiple of 4, as arrays and as a dataset
    # (refused before, with the advice of drop_remainder=True: 32 predictions for 37
    # samples); a batch size of 6; predict_on_batch of 5 rows. Keras takes them all.
    model = compiled_model(microbatches=4)
    model.fit(dataset(), epochs=1, verbose=0)
    x = arrays()[0][:37]
    want = model.b(model.a(x)).numpy()
    for got in (
        model.predict(x, batch_size=16, verbose=0),
        model.predict(tf.data.Dataset.from_tensor_slices(x).batch(16), verbose=0),
        model.predict(x, batch_size=6, verbose=0),
        model.predict_on_batch(x[:5]),
    ):
        np.testing.assert_allclose(got, want[: len(got)], rtol=1e-5, atol=1e-6)
        assert len(got) in (37, 5)


def weights_of(model: Any) -> list[np.ndarray]:
    return [v.numpy() for v in model.trainable_variables]


def assert_same_weights(a: Any, b: Any) -> None:
    for x, y in zip(weights_of(a), weights_of(b), strict=True):
        np.testing.assert_array_equal(x, y)


def adam_model() -> Mlp:
    """Adam, so that a restore that lost the optimizer's moments would show."""
    tfsift.init({"microbatches": 2})
    keras.utils.set_random_seed(SEED)
    model = Mlp()
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def test_model_checkpoint_saves_the_best_keras_file_and_weights_every_epoch(
    tmp_path: Path,
) -> None:
    model = compiled_model()
    best = keras.callbacks.ModelCheckpoint(tmp_path / "best.keras", "loss", save_best_only=True)
    each = keras.callbacks.ModelCheckpoint(
        tmp_path / "w-{epoch}.weights.h5", save_weights_only=True
    )
    history = model.fit(dataset(), epochs=3, verbose=0, callbacks=[best, each])
    assert np.argmin(history.history["loss"]) == 2  # so the best file is the last epoch's
    x = arrays()[0]
    restored = keras.saving.load_model(tmp_path / "best.keras")  # plain Keras
    np.testing.assert_allclose(
        restored.predict(x, verbose=0), model.predict(x, batch_size=B, verbose=0), atol=1e-6
    )
    assert sorted(p.name for p in tmp_path.glob("w-*")) == [f"w-{e}.weights.h5" for e in (1, 2, 3)]
    other = compiled_model()
    other.predict(x, batch_size=B, verbose=0)  # partitions it
    other.load_weights(tmp_path / "w-3.weights.h5")
    assert_same_weights(other, model)


@pytest.mark.parametrize("which", ["ModelCheckpoint", "BackupAndRestore"])
def test_a_checkpoint_directory_that_cannot_be_written_fails_fit_before_epoch_1(
    tmp_path: Path, which: str
) -> None:
    (tmp_path / "file").write_text("a file where a directory should be")
    model = adam_model()
    target = tmp_path / "file" / "runs"
    callback = (
        keras.callbacks.ModelCheckpoint(target / "{epoch}" / "best.keras", save_best_only=True)
        if which == "ModelCheckpoint"
        else tfsift.callbacks.BackupAndRestore(target)
    )
    with pytest.raises(tfsift.checkpoint.CheckpointError) as err:
        model.fit(dataset(), epochs=2, verbose=0, callbacks=[callback])
    assert str(err.value) == (
        f"rank 0: {which}'s directory must be one this job can write to (fit checks it "
        f"before the first epoch rather than fail after it): {tmp_path / 'file'} is not a "
        f"directory. Received: {target}"
    )
    assert int(model.optimizer.iterations) == 0  # nothing trained


def test_a_directory_is_unwritable_where_no_file_can_be_made_in_it(tmp_path: Path) -> None:
    from tfsift.checkpoint import files

    # made before the first epoch: every rank's ModelCheckpoint then finds it (each made
    # it at the first save, and one of them failed with FileExistsError in about half the
    # runs, ending the job after the epoch)
    assert files.unwritable(tmp_path / "not" / "made" / "yet") is None
    assert (tmp_path / "not" / "made" / "yet").is_dir()
    assert list((tmp_path / "not" / "made" / "yet").iterdir()) == []  # the probe removed
    # os.access allows root here, and the save failed after training
    # (No such file or directory as root; the reason is the system's)
    why = files.unwritable(Path("/proc/tfsift-probe"))
    assert why is not None and why.startswith("/proc/tfsift-probe cannot be made or written (")


def test_save_and_save_weights_name_the_files_they_write() -> None:
    model = compiled_model()
    model.fit(dataset(), epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"writes a \.keras file\. Received: filepath='m\.h5'"):
        model.save("m.h5")
    with pytest.raises(ValueError, match=r"end in \.weights\.h5\. Received: filepath='w\.h5'"):
        model.save_weights("w.h5")


def test_load_weights_of_a_file_before_any_step_says_how_to_partition_first(
    tmp_path: Path,
) -> None:
    model = compiled_model()
    with pytest.raises(ValueError, match=r"call it after a step, or use tfsift\.load_weights"):
        model.load_weights(tmp_path / "w.weights.h5")


def test_load_weights_of_a_checkpoint_partitions_from_its_manifest(tmp_path: Path) -> None:
    model = compiled_model()
    model.fit(dataset(), epochs=1, verbose=0)
    tfsift.CheckpointManager(model, model.optimizer, tmp_path / "ckpt").save(0)
    other = compiled_model()
    assert other.partitioned is None
    other.load_weights(tmp_path / "ckpt")  # the manifest has the inputs: no step first
    assert_same_weights(other, model)


class Interrupt(keras.callbacks.Callback):
    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if epoch == 1:
            raise KeyboardInterrupt("stopped after epoch 1")


def test_backup_and_restore_resumes_after_the_last_epoch_saved(tmp_path: Path) -> None:
    whole = adam_model()
    whole.fit(dataset(), epochs=3, verbose=0)
    backup = tmp_path / "backup"
    stopped = adam_model()
    with pytest.raises(KeyboardInterrupt):
        stopped.fit(
            dataset(), epochs=3, verbose=0,
            callbacks=[tfsift.callbacks.BackupAndRestore(backup), Interrupt()],
        )  # fmt: skip
    assert [p.name for p in backup.glob("ckpt-*")] == ["ckpt-1"]  # epochs 0 and 1 done
    resumed = adam_model()
    history = resumed.fit(
        dataset(), epochs=3, verbose=0, callbacks=[tfsift.callbacks.BackupAndRestore(backup)]
    )
    assert len(history.history["loss"]) == 1  # epoch 2 only
    assert_same_weights(resumed, whole)
    assert not backup.exists()  # delete_checkpoint: fit ended normally


def test_a_resume_over_a_dataset_that_reshuffles_says_it_is_not_exact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tfsift.init({"microbatches": 2})
    x, y = arrays()
    shuffled = tfsift.shard(tf.data.Dataset.from_tensor_slices((x, y)), shuffle_buffer=N)
    with pytest.raises(KeyboardInterrupt):
        adam_model().fit(
            shuffled.batch(B, drop_remainder=True), epochs=3, verbose=0,
            callbacks=[tfsift.callbacks.BackupAndRestore(tmp_path), Interrupt()],
        )  # fmt: skip
    with caplog.at_level("WARNING", logger="tfsift"):
        adam_model().fit(
            shuffled.batch(B, drop_remainder=True), epochs=3, verbose=0,
            callbacks=[tfsift.callbacks.BackupAndRestore(tmp_path)],
        )  # fmt: skip
    assert [m for m in caplog.messages if "reshuffles" in m] == [
        "fit starts at epoch 3 of a dataset that reshuffles at each iteration (a "
        ".shuffle(), or tfsift.shard(shuffle_buffer=...)): tf.data orders its epochs by the "
        "iterations made in this process, so these epochs take the orders of epochs 1, 2, "
        "... again and a resumed run does not repeat the uninterrupted one exactly. For an "
        "exact resume, pass arrays (fit(x, y)) or tfsift.from_arrays, whose order follows "
        "the epoch"
    ]


def test_reshuffles_finds_a_shuffle_under_any_transformation() -> None:
    from tfsift.training.data import reshuffles

    tfsift.init({})
    base = tf.data.Dataset.range(8)
    assert reshuffles(base.shuffle(8).map(lambda v: v + 1).batch(2).prefetch(1))
    assert reshuffles(tf.data.Dataset.zip((base, base.shuffle(8))))
    assert not reshuffles(base.shuffle(8, reshuffle_each_iteration=False).batch(2))
    assert not reshuffles(base.batch(2)) and not reshuffles(tfsift.from_arrays(arrays(), B))


def test_callbacks_show_and_write_on_rank_0_only(tmp_path: Path) -> None:
    csv = keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))
    board = keras.callbacks.TensorBoard(str(tmp_path))
    stop = keras.callbacks.EarlyStopping(verbose=1)
    save = keras.callbacks.ModelCheckpoint(tmp_path / "m.keras", verbose=1)
    assert callbacks.for_rank([csv, board, stop, save], 0) == [csv, board, stop, save]
    assert (stop.verbose, save.verbose) == (1, 1)
    assert callbacks.for_rank([csv, board, stop, save], 1) == [stop, save]
    assert (stop.verbose, save.verbose) == (0, 0)


def test_keras_backup_and_restore_is_refused_naming_tfsifts() -> None:
    model = compiled_model()
    with pytest.raises(TypeError, match=r"Use tfsift\.callbacks\.BackupAndRestore\(backup_dir\)"):
        model.fit(dataset(), epochs=1, verbose=0, callbacks=[keras.callbacks.BackupAndRestore("b")])
    with pytest.raises(ValueError, match=r"Received: save_freq=10"):
        tfsift.callbacks.BackupAndRestore("b", save_freq=10)  # type: ignore[arg-type]


def test_validation_split_holds_out_the_last_samples_as_keras_does() -> None:
    x, y = arrays()  # 64 samples: the last 16 validate
    split = compiled_model().fit(
        x, y, batch_size=B, epochs=2, shuffle=False, verbose=0, validation_split=0.25
    )
    held = compiled_model().fit(
        x[:48], y[:48], batch_size=B, epochs=2, shuffle=False, verbose=0,
        validation_data=(x[48:], y[48:]),
    )  # fmt: skip
    assert split.history == held.history
    with pytest.raises(ValueError, match=r"validation_split needs array inputs"):
        compiled_model().fit(dataset(), validation_split=0.25, verbose=0)
    with pytest.raises(ValueError, match=r"between 0 and 1\. Received: validation_split=1\.5"):
        compiled_model().fit(x, y, validation_split=1.5, verbose=0)


@pytest.mark.parametrize("one_hot", [False, True])
def test_class_weight_weighs_each_sample_by_its_class(one_hot: bool) -> None:
    x, y = arrays()
    weights = {0: 1.0, 1: 2.0, 2: 0.5}
    targets = np.eye(3, dtype=np.float32)[y] if one_hot else y
    loss = keras.losses.CategoricalCrossentropy(from_logits=True) if one_hot else None
    args: dict[str, Any] = {"loss": loss} if one_hot else {}
    by_class = compiled_model(**args)
    by_class.fit(x, targets, batch_size=B, shuffle=False, verbose=0, class_weight=weights)
    by_sample = compiled_model(**args)
    per_sample = np.array([weights[int(c)] for c in y], np.float32)
    by_sample.fit(x, targets, batch_size=B, shuffle=False, verbose=0, sample_weight=per_sample)
    assert_same_weights(by_class, by_sample)


def test_class_weight_with_sample_weight_is_refused_as_keras_refuses_it() -> None:
    # they were multiplied, where Keras refuses the two: for arrays, a dataset and a batch
    model = compiled_model()
    x, y = arrays()
    weights = np.ones(len(y), np.float32)
    for run in (
        lambda: model.fit(x, y, sample_weight=weights, class_weight={0: 2.0}, verbose=0),
        lambda: model.fit(
            tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(B), class_weight={0: 2.0},
            verbose=0,
        ),
        lambda: model.train_on_batch(
            x[:B], y[:B], sample_weight=weights[:B], class_weight={0: 2.0}
        ),
    ):  # fmt: skip
        with pytest.raises(ValueError) as err:
            run()
        assert str(err.value) == (
            "class_weight and sample_weight cannot both weigh the samples, as in Keras: fold "
            "the class weights into sample_weight. Received: class_weight={0: 2.0} and a "
            "sample_weight"
        )


def test_class_weight_applies_to_a_dataset_too() -> None:
    x, y = arrays()
    weights = {0: 0.0, 1: 3.0}  # class 2 is not named: weight 1, as in Keras
    by_class = compiled_model()
    by_class.fit(dataset(), verbose=0, class_weight=weights)
    by_sample = compiled_model()
    per_sample = np.array([weights.get(int(c), 1.0) for c in y], np.float32)
    by_sample.fit(x, y, batch_size=B, shuffle=False, verbose=0, sample_weight=per_sample)
    assert_same_weights(by_class, by_sample)


def test_predict_runs_without_compile_as_in_keras() -> None:
    x = arrays()[0]
    tfsift.init({"microbatches": 2})
    keras.utils.set_random_seed(SEED)
    never_compiled = Mlp()
    got = never_compiled.predict(x, batch_size=B, verbose=0)
    want = compiled_model().predict(x, batch_size=B, verbose=0)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(never_compiled.predict_on_batch(x[:B]), want[:B])
    with pytest.raises(RuntimeError, match=r"must be compiled before fit, evaluate"):
        never_compiled.evaluate(x, np.zeros(len(x)), batch_size=B, verbose=0)


def test_on_batch_methods_step_like_fit() -> None:
    x, y = arrays()
    stepped = compiled_model()
    for i in range(0, len(x), B):
        logs = stepped.train_on_batch(x[i : i + B], y[i : i + B], return_dict=True)
    fitted = compiled_model()
    fitted.fit(x, y, batch_size=B, shuffle=False, verbose=0)
    assert_same_weights(stepped, fitted)
    assert sorted(logs) == ["accuracy", "loss"]
    loss, accuracy = stepped.test_on_batch(x[:B], y[:B])
    assert [loss, accuracy] == fitted.evaluate(x[:B], y[:B], batch_size=B, verbose=0)
    np.testing.assert_array_equal(
        stepped.predict_on_batch(x[:B]), fitted.predict(x[:B], batch_size=B, verbose=0)
    )


def test_train_on_batch_weighs_classes_as_fit_does() -> None:
    x, y = arrays()
    weights = {0: 0.5, 2: 3.0}
    by_class, by_sample = compiled_model(), compiled_model()
    for i in range(0, len(x), B):
        xb, yb = x[i : i + B], y[i : i + B]
        by_class.train_on_batch(xb, yb, class_weight=weights)
        per_sample = np.array([weights.get(int(c), 1.0) for c in yb], np.float32)
        by_sample.train_on_batch(xb, yb, sample_weight=per_sample)
    assert_same_weights(by_class, by_sample)


# ---------------------------------------------------------------- compiled_update


def test_the_update_equals_apply_gradients_in_one_compiled_call() -> None:
    steps = 2 * N // B
    eager, optimizer = CountingAdam(0.01), CountingAdam(0.01)
    CountingAdam.runs = 0
    want = readme_loop(2, optimizer=eager)
    assert CountingAdam.runs == steps * 4  # eagerly: each variable's update in Python, each step
    CountingAdam.runs = 0
    got = readme_loop(2, optimizer=optimizer, compiled=True)
    assert CountingAdam.runs == 4  # compiled: only while tracing, once
    assert int(optimizer.iterations.numpy()) == int(eager.iterations.numpy()) == steps
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def built_model(trainable: bool = True) -> Mlp:
    tfsift.init({"microbatches": 1})
    model = Mlp()
    model.trainable = trainable
    tfsift.step(lambda x: model(x))(np.zeros((2, 5), np.float32))  # built and partitioned
    return model


def test_a_stage_without_trainable_variables_updates_nothing() -> None:
    model = built_model(trainable=False)
    assert model.trainable_variables == []
    optimizer = keras.optimizers.Adam()
    tfsift.compiled_update(optimizer, model)([])
    assert int(optimizer.iterations.numpy()) == 0  # built for no variables, never applied
    assert not optimizer._trainable_variables


def test_the_optimizer_is_built_for_the_stage_before_a_step_is_traced() -> None:
    # a LossScaleOptimizer's scale_loss reads its scale variable only once built: a step
    # traced before that would multiply by the initial scale for ever
    tfsift.init({"microbatches": 1})
    model = Mlp()
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    update = tfsift.compiled_update(optimizer, model)
    assert not optimizer.built
    scales = []

    @tfsift.step
    def train(x: Any) -> Any:
        loss = keras.ops.mean(model(x, training=True) ** 2)
        scales.append(optimizer.built)
        return tfsift.gradients(optimizer.scale_loss(loss), model.trainable_variables), loss

    grads, _ = train(np.ones((2, 5), np.float32))
    assert optimizer.built and all(scales)  # built when partitioned, inside the first call
    optimizer.dynamic_scale.assign(4.0)
    update(tfsift.allreduce(grads))
    grads, _ = train(np.ones((2, 5), np.float32))  # the traced step reads the new scale
    ref = model.trainable_variables[0]
    with tf.GradientTape() as tape:
        loss = keras.ops.mean(model.call(np.ones((2, 5), np.float32)) ** 2) * 4.0
    np.testing.assert_allclose(
        tfsift.allreduce(grads)[0].numpy(), tape.gradient(loss, ref).numpy(), rtol=1e-6, atol=1e-7
    )


def test_bad_arguments_say_what_was_expected_and_received() -> None:
    model = built_model()
    with pytest.raises(TypeError) as error:
        tfsift.compiled_update("adam", model)
    assert str(error.value) == (
        "compiled_update(optimizer, model) expects a keras.optimizers.Optimizer. Received: str"
    )
    with pytest.raises(TypeError) as error:
        tfsift.compiled_update(keras.optimizers.SGD(), [model])
    assert str(error.value) == (
        "compiled_update(optimizer, model) expects a keras.Model (a tfsift.DistributedModel). "
        "Received: list"
    )
    update = tfsift.compiled_update(keras.optimizers.SGD(), model)
    with pytest.raises(ValueError) as error:
        update([tf.zeros((5, 8))])
    assert str(error.value) == (
        f"update(grads) expects one gradient per trainable variable of this rank's stage of "
        f"{model.name!r}, in their order (4). Received: 1 gradients"
    )


def test_clip_by_global_norm_in_one_process_is_tensorflows() -> None:
    model = built_model()
    grads = [tf.fill(v.shape, 0.5) for v in model.trainable_variables]
    clipped, norm = tfsift.clip_by_global_norm(grads, 1.0, model)
    want, want_norm = tf.clip_by_global_norm(grads, 1.0)
    np.testing.assert_allclose(norm.numpy(), want_norm.numpy(), rtol=1e-6)
    for got, expected in zip(clipped, want, strict=True):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-6)
    with pytest.raises(ValueError) as error:
        tfsift.clip_by_global_norm(grads, 0.0, model)
    assert str(error.value) == "clip_norm must be a number > 0. Received: clip_norm=0.0"
    with pytest.raises(ValueError) as error:
        tfsift.clip_by_global_norm(grads[:1], 1.0, model)
    assert str(error.value) == (
        "clip_by_global_norm(grads, clip_norm, model) expects one gradient per trainable "
        f"variable of this rank's stage of {model.name!r} ({len(grads)}). Received: 1 gradients"
    )


def test_the_partitioned_model_gets_sets_and_exports_the_whole_model(tmp_path: Path) -> None:
    model = built_model()
    whole = model.get_weights()
    assert [w.shape for w in whole] == [tuple(v.shape) for v in model.weights]
    model.set_weights([w + 1 for w in whole])
    np.testing.assert_array_equal(model.get_weights()[0], whole[0] + 1)
    with pytest.raises(ValueError) as error:
        model.set_weights(whole[:1])
    assert str(error.value).startswith("set_weights expects one array per weight of the whole")
    model.export(tmp_path / "served", verbose=False)
    served = tf.saved_model.load(str(tmp_path / "served"))
    x = np.ones((4, 5), np.float32)
    np.testing.assert_allclose(
        served.serve(tf.constant(x)).numpy(), model.predict(x, verbose=0), rtol=1e-6, atol=1e-7
    )
    with pytest.raises(RuntimeError) as call:
        model(x)
    assert str(call.value).endswith("to compute its outputs for data, call model.predict(x) on "
                                    "every rank")  # fmt: skip


class SumAndMean(keras.metrics.Metric):  # type: ignore[misc]
    """A metric whose result is a dict, which Keras merges into the logs."""

    def __init__(self) -> None:
        super().__init__(name="sum_and_mean")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        self.total.assign_add(keras.ops.sum(y_pred))
        self.count.assign_add(keras.ops.cast(keras.ops.size(y_pred), "float32"))

    def result(self) -> dict[str, Any]:
        return {"pred_sum": self.total + 0.0, "pred_mean": self.total / self.count}


def test_a_metric_of_one_value_per_class_or_a_dict_is_logged_as_keras_logs_it() -> None:
    # F1Score's default, one value per class, and a dict result raised "only 0-dimensional
    # arrays can be converted to Python scalars" after the first epoch
    tfsift.init({"microbatches": 2})
    x, y, _ = seventy()
    histories, evaluated = [], []
    for model in keras_and_tfsift():
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.CategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.F1Score(), SumAndMean()],
        )
        one_hot = keras.utils.to_categorical(y, 3)
        histories.append(model.fit(x, one_hot, batch_size=16, shuffle=False, verbose=0).history)
        evaluated.append(model.evaluate(x, one_hot, batch_size=16, verbose=0, return_dict=True))
    for ours, theirs in ((histories[1], histories[0]), (evaluated[1], evaluated[0])):
        assert sorted(ours) == sorted(theirs) == ["f1_score", "loss", "pred_mean", "pred_sum"]
        for key, value in theirs.items():
            np.testing.assert_allclose(np.asarray(ours[key]), np.asarray(value), rtol=1e-5)
    assert np.asarray(histories[1]["f1_score"][0]).shape == (3,)


class Calls(keras.callbacks.Callback):  # type: ignore[misc]
    """Records the batch callbacks' calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.calls.append(("train_begin", batch))

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.calls.append(("train_end", batch))

    def on_test_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.calls.append(("test_begin", batch))

    def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
        self.calls.append(("test_end", batch))


def test_batch_callbacks_come_once_every_steps_per_execution_as_in_keras() -> None:
    # tfsift called them at every batch: a per-batch schedule or log ran 3 times as often
    tfsift.init({"microbatches": 2})
    x, y, _ = seventy()  # 5 batches of 16 (the last of 6): executions of 3 and 2
    seen = []
    for model in keras_and_tfsift():
        as_keras(model, steps_per_execution=3)
        calls = Calls()
        model.fit(x, y, batch_size=16, validation_data=(x, y), verbose=0, callbacks=[calls])
        seen.append(calls.calls)
    # the last execution, of batches 3 and 4, is named by where a full one would end
    assert seen[1] == seen[0] == [
        ("train_begin", 0), ("train_end", 2), ("train_begin", 3), ("train_end", 5),
        ("test_begin", 0), ("test_end", 2), ("test_begin", 3), ("test_end", 5),
    ]  # fmt: skip
