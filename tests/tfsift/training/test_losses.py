"""The compiled loss as a batch mean (what a step trains on) and per sample (what sift scores);
``fit`` reduces it as Keras does, or refuses it at ``compile``."""

from __future__ import annotations

import re
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfsift
from tfsift.training.losses import ModelLoss, batch_loss, per_sample_loss

Y = np.array([0, 2, 1, 1])
LOGITS = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
WANT = keras.losses.sparse_categorical_crossentropy(Y, LOGITS, from_logits=True).numpy()
LOSS_OBJECT = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Scaled(keras.losses.Loss):  # type: ignore[misc]
    """A subclass whose __init__ does not take its own config back."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def call(self, y_true: Any, y_pred: Any) -> Any:
        return self.scale * keras.losses.sparse_categorical_crossentropy(
            y_true, y_pred, from_logits=True
        )


def from_logits(y_true: Any, y_pred: Any) -> Any:
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)


@pytest.mark.parametrize(
    ("loss", "scale"),
    [
        (keras.losses.SparseCategoricalCrossentropy(from_logits=True), 1.0),
        (from_logits, 1.0),
        (Scaled(2.0), 2.0),
    ],
    ids=["object", "function", "subclass"],
)
def test_batch_loss_is_the_mean_of_the_per_sample_losses(loss: Any, scale: float) -> None:
    mean = batch_loss(loss)
    np.testing.assert_allclose(mean(Y, LOGITS).numpy(), scale * WANT.mean(), rtol=1e-6)
    np.testing.assert_allclose(per_sample_loss(mean)(Y, LOGITS).numpy(), scale * WANT, rtol=1e-6)


def test_a_loss_name_resolves_through_keras() -> None:
    probs = keras.ops.softmax(LOGITS).numpy()
    want = keras.losses.sparse_categorical_crossentropy(Y, probs).numpy()
    for name in ("sparse_categorical_crossentropy", "SparseCategoricalCrossentropy"):
        mean = batch_loss(name)
        np.testing.assert_allclose(per_sample_loss(mean)(Y, probs).numpy(), want, rtol=1e-6)


def test_no_loss_says_to_compile_with_one() -> None:
    with pytest.raises(ValueError, match=r"model.compile\(loss=...\). Received: None"):
        batch_loss(None)


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(8, "relu", name="hidden")
        self.head = keras.layers.Dense(3, name="head")

    def call(self, x: Any) -> Any:
        return self.head(self.hidden(x))


def test_fit_with_sample_weights_on_microbatches_equals_keras() -> None:
    # the default reduction: each microbatch's mean, averaged, is the batch's mean
    tfsift.init({"microbatches": 2})
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 5)).astype(np.float32), rng.integers(0, 3, 64)
    weights = np.where(np.arange(64) % 16 < 4, 3.0, 1.0).astype(np.float32)  # not even
    keras.utils.set_random_seed(1)
    ref = keras.Sequential([keras.Input((5,)), *Net().layers])
    model = Net()
    model.predict(x[:2], verbose=0)
    model.set_weights(ref.get_weights())
    histories = []
    for m in (ref, model):
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS_OBJECT)
        fit = m.fit(x, y, sample_weight=weights, batch_size=16, shuffle=False, verbose=0)
        histories.append(fit.history["loss"])
    np.testing.assert_allclose(histories[1], histories[0], rtol=1e-6)
    for a, b in zip(ref.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(b, a, atol=1e-6)


@pytest.mark.parametrize("reduction", ["sum", None, "mean_with_sample_weight"])
def test_a_loss_fit_would_reduce_otherwise_than_keras_is_refused_at_compile(
    reduction: str | None,
) -> None:
    # measured before the refusal, 2 microbatches, SGD: "sum" halved the loss and left the
    # weights 0.038 from Keras' after one epoch; None, the same (Keras' fit sums it);
    # "mean_with_sample_weight" with uneven weights, 0.0016
    tfsift.init({"microbatches": 2})
    model = Net()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
    with pytest.raises(ValueError) as err:
        model.compile(optimizer="sgd", loss=loss)
    assert str(err.value) == (
        "tfsift's fit and evaluate average each microbatch's loss over the microbatches and "
        "replicas, which is Keras' loss of the whole batch only with "
        "reduction='sum_over_batch_size' (Keras' default): pass the loss with that reduction "
        "(and scale it yourself for a sum). Received: "
        f"SparseCategoricalCrossentropy(reduction={reduction!r})"
    )
    assert getattr(model, "optimizer", None) is None  # refused before Keras compiled


class Tokens(tfsift.DistributedModel):
    def __init__(self, mask_zero: bool) -> None:
        super().__init__()
        self.embed = keras.layers.Embedding(12, 8, mask_zero=mask_zero, name="embed")
        self.head = keras.layers.Dense(12, name="head")

    def call(self, x: Any) -> Any:
        return self.head(self.embed(x))


def tokens() -> tuple[np.ndarray, np.ndarray]:
    """Sequences of 6 token ids, the first half of every 16 padded (0) after 2 tokens."""
    rng = np.random.default_rng(0)
    x, y = rng.integers(1, 12, size=(32, 6)), rng.integers(0, 12, size=(32, 6))
    x[np.arange(32) % 16 < 8, 2:] = 0
    return x, y


def refusals_of_fit_and_evaluate(model: tfsift.DistributedModel, x: Any, y: Any) -> list[str]:
    """The ValueError messages of fit and of evaluate on batches of 16 (each must raise)."""
    messages = []
    for run in (lambda: model.fit(x, y, batch_size=16, verbose=0),
                lambda: model.evaluate(x, y, batch_size=16, verbose=0)):  # fmt: skip
        with pytest.raises(ValueError) as err:
            run()
        messages.append(str(err.value))
    return messages


def test_a_mask_on_the_output_is_refused_and_the_padding_as_weights_equals_keras() -> None:
    # with the mask Keras averages over the unmasked positions; fit averaged over all of
    # them (the weights 0.05 from Keras' after two epochs, equal to Keras' without a mask)
    tfsift.init({"microbatches": 2})
    x, y = tokens()
    model = Tokens(mask_zero=True)
    model.compile(optimizer="sgd", loss=LOSS_OBJECT)
    assert refusals_of_fit_and_evaluate(model, x, y) == 2 * [
        "tfsift's fit and evaluate do not weigh the loss by a mask on the model's output, "
        "as Keras' losses do (padding from Embedding(mask_zero=True) or Masking that "
        "reaches the output): the loss would count the masked positions. Stop the mask "
        "before the output and pass the padding as sample_weight, or weigh the loss "
        "yourself in a @tfsift.step loop. Received: a mask on output 0 of model 'tokens'"
    ]
    # what it says to do: no mask, the padding weighted 0, as Keras weighs it
    weights = (x != 0).astype(np.float32)
    keras.utils.set_random_seed(1)
    plain = Tokens(mask_zero=False)
    ref = keras.Sequential([keras.Input((6,), dtype="int32"), plain.embed, plain.head])
    model = Tokens(mask_zero=False)
    model.predict(x[:2], verbose=0)
    model.set_weights(ref.get_weights())
    for m in (ref, model):
        m.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS_OBJECT)
        m.fit(x, y, sample_weight=weights, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(ref.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(b, a, atol=1e-6)


class TwoHeads(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(8, "relu")
        self.first, self.second = keras.layers.Dense(1), keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        z = self.hidden(x)
        return self.first(z), self.second(z)


def test_a_model_of_two_outputs_needs_a_target_for_each_and_its_losses_a_mean() -> None:
    tfsift.init({"microbatches": 2})
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 4)).astype(np.float32), rng.normal(size=(32, 1))
    model = TwoHeads()
    model.compile(optimizer="sgd", loss="mse")
    assert refusals_of_fit_and_evaluate(model, x, y) == 2 * [
        "the model returns 2 outputs, and its loss needs a target for each: y must hold 2 "
        "(a list, a tuple or a dict by output, as the outputs are). Received: 1 target(s), "
        "y=*, outputs=('*', '*')"
    ]
    with pytest.raises(ValueError) as err:  # at compile, before any step
        TwoHeads().compile(optimizer="sgd", loss=["mse", keras.losses.MeanSquaredError("sum")])
    assert str(err.value).endswith("Received: MeanSquaredError(reduction='sum')")


@pytest.mark.parametrize("microbatches", [1, 2])
def test_a_loss_that_ignores_a_class_among_several_outputs_is_refused_where_batches_split(
    microbatches: int,
) -> None:
    # each microbatch's loss would be divided by its own count of targets it does not ignore
    tfsift.init({"microbatches": microbatches})
    ignoring = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1)
    model = TwoHeads()
    if microbatches == 1:  # Keras' own batch: nothing to refuse
        model.compile(optimizer="sgd", loss=["mse", ignoring])
        return
    with pytest.raises(ValueError) as err:  # at compile, before any step
        model.compile(optimizer="sgd", loss=["mse", ignoring])
    assert str(err.value) == (
        "a loss that ignores a class divides by the targets it does not ignore, which "
        "tfsift's fit counts over the whole batch for a model of one output only; here each "
        "microbatch's would be divided by its own count. Weigh the ignored targets 0 with "
        "sample_weight instead, or use one microbatch on one replica. Received: "
        "SparseCategoricalCrossentropy(ignore_class=-1) among several losses"
    )


def test_a_per_token_loss_scores_each_sample_by_its_tokens_mean_which_averages_to_the_loss() -> (
    None
):
    # a language model's loss is per token; sifting ranks samples: each one's mean, whose
    # mean over the batch is Keras' batch loss (it averages over every token)
    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(size=(4, 6, 10)), tf.float32)
    targets = tf.constant(rng.integers(0, 10, (4, 6)))
    loss = ModelLoss(keras.losses.SparseCategoricalCrossentropy(from_logits=True), None, None)
    per_token = keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True)
    per_sample = loss.per_sample(targets, logits)
    np.testing.assert_allclose(per_sample, np.mean(per_token, axis=1), rtol=1e-6)
    np.testing.assert_allclose(np.mean(per_sample), loss(targets, logits)["loss"], rtol=1e-6)


def in_batch_softmax(y_true: Any, y_pred: Any) -> Any:
    """One loss per sample that reads every sample of the batch (in-batch negatives)."""
    logits = keras.ops.matmul(y_pred, keras.ops.transpose(y_true))
    labels = keras.ops.arange(keras.ops.shape(y_pred)[0])
    return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


@pytest.mark.parametrize("what", ["fit", "evaluate"])
def test_a_loss_that_reads_the_batchs_other_samples_is_refused_before_any_update(
    what: str,
) -> None:
    # each microbatch saw half the negatives: 0.27 apart from Keras after an epoch
    tfsift.init({"microbatches": 2})
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 4)).astype(np.float32), rng.normal(size=(32, 3))
    model = Net()
    model.compile(optimizer="sgd", loss=in_batch_softmax)
    with pytest.raises(ValueError) as err:
        getattr(model, what)(x, y.astype(np.float32), batch_size=8, verbose=0)
    message = str(err.value)
    assert message.startswith(
        "the loss gives a sample another value in a part of the batch than in the whole "
        "batch: it reads the batch's other samples (in-batch negatives, a batch statistic). "
        "tfsift's fit and evaluate compute it on each of the 2 microbatches"
    )
    assert re.search(
        r"Received: sample \d+'s loss [\d.]+ in the batch of 8, [\d.]+ in a part of 4$", message
    )
    if what == "fit":
        assert model.optimizer.iterations.numpy() == 0  # refused before the update


def test_a_loss_that_reads_the_batch_is_taken_on_keras_own_batch() -> None:
    tfsift.init({"microbatches": 1})
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 4)).astype(np.float32), rng.normal(size=(32, 3))
    model = Net()
    model.compile(optimizer="sgd", loss=in_batch_softmax)
    model.fit(x, y.astype(np.float32), batch_size=8, verbose=0)


def test_each_outputs_loss_is_logged_as_keras_logs_it_where_a_last_batch_is_smaller() -> None:
    # Keras averages an output's loss over the batches plainly (its compiled step knows no
    # static batch size where a last batch is smaller), the total by their sizes; tfsift
    # weighed both by size: b_loss 1.69989 against Keras' 1.25627
    tfsift.init({"microbatches": 2})
    rng = np.random.default_rng(0)
    x = rng.normal(size=(70, 4)).astype(np.float32)
    y = (rng.normal(size=(70, 1)).astype(np.float32), rng.integers(0, 3, 70))
    losses = ["mse", keras.losses.SparseCategoricalCrossentropy(from_logits=True)]
    histories = []
    for model in (seeded_heads(keras.Model), seeded_heads(tfsift.DistributedModel)):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=losses)
        histories.append(model.fit(x, y, batch_size=16, shuffle=False, verbose=0).history)
    assert sorted(histories[1]) == sorted(histories[0])
    for key, value in histories[0].items():
        assert histories[1][key] == pytest.approx(value, rel=1e-5), key


def seeded_heads(base: type) -> keras.Model:
    """Two heads on a hidden layer, of the same initial weights whatever the base class."""

    class Heads(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            seeded = keras.initializers.GlorotUniform
            self.hidden = keras.layers.Dense(8, "relu", kernel_initializer=seeded(1))
            self.first = keras.layers.Dense(1, kernel_initializer=seeded(2))
            self.second = keras.layers.Dense(3, kernel_initializer=seeded(3))

        def call(self, x: Any) -> Any:
            z = self.hidden(x)
            return self.first(z), self.second(z)

    return Heads()
