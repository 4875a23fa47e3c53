"""One process, partitions=1: a step equals a plain tape, evaluation steps, request checks."""

from __future__ import annotations

import collections
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfsift

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Mlp(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(8, activation="relu")
        self.b = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


def batch() -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(0)
    return tf.constant(rng.normal(size=(8, 5)), tf.float32), tf.constant(rng.integers(0, 3, 8))


def start(microbatches: int) -> tuple[Mlp, tf.Tensor, tf.Tensor]:
    """tfsift.init with ``microbatches``, a fresh model and the batch."""
    tfsift.init({"microbatches": microbatches})
    return Mlp(), *batch()


def standard_step(model: Mlp) -> Any:
    """The README's training step: (gradients, loss)."""

    @tfsift.step
    def train(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = LOSS(labels, model(images, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    return train


def test_microbatched_step_equals_a_full_batch_tape_and_eval_returns_predictions() -> None:
    model, x, y = start(4)
    train = standard_step(model)

    @tfsift.step
    def evaluate(images: tf.Tensor) -> Any:
        return model(images, training=False)

    grads, loss = train(x, y)
    with tf.GradientTape() as tape:
        want_loss = LOSS(y, model.b(model.a(x)))
    want = tape.gradient(want_loss, model.trainable_variables)
    assert len(grads) == len(want) == 4
    for got, ref in zip(grads, want, strict=True):
        np.testing.assert_allclose(got.accumulate().numpy(), ref.numpy(), rtol=1e-5, atol=1e-7)
    assert abs(float(loss.reduce_mean()) - float(want_loss)) < 1e-6
    logits = evaluate(x).concat()
    # atol: the weights are drawn afresh each run, and a logit near 0 computed on a
    # microbatch of 2 rows differs from the full batch's in float32's last bits
    np.testing.assert_allclose(logits.numpy(), model.b(model.a(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_gradients_of_other_variables_are_refused_with_the_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model, x, y = start(2)

    @tfsift.step
    def train(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = LOSS(labels, model(images, training=True))
        return tfsift.gradients(loss, model.trainable_variables[:1]), loss

    with pytest.raises(ValueError) as err, caplog.at_level("WARNING", logger="tfsift"):
        train(x, y)
    assert str(err.value) == (
        "tfsift.gradients must be called with model.trainable_variables (this rank's stage "
        "variables, 4 of them). Received: a list of 1 variables"
    )
    assert caplog.records == []  # raised from the compiled trace, not after falling back


def reference_gradients(model: Mlp, x: tf.Tensor, y: tf.Tensor, penalty: float) -> list[Any]:
    with tf.GradientTape() as tape:
        loss = LOSS(y, model.b(model.a(x))) + penalty * tf.reduce_sum(model.a.kernel**2)
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


@pytest.mark.parametrize("compile", [True, False])
def test_a_loss_that_reads_a_variable_directly_gets_its_gradient(compile: bool) -> None:
    model, x, y = start(4)

    @tfsift.step(compile=compile)
    def train(images: tf.Tensor, labels: tf.Tensor) -> Any:
        logits = model(images, training=True)
        loss = LOSS(labels, logits) + 0.5 * tf.reduce_sum(model.a.kernel**2)
        return tfsift.gradients(loss, model.trainable_variables), loss

    grads, _ = train(x, y)
    want = reference_gradients(model, x, y, 0.5)
    for got, ref in zip(grads, want, strict=True):
        np.testing.assert_allclose(got.accumulate().numpy(), ref, rtol=1e-5, atol=1e-7)


def test_a_step_function_that_cannot_be_traced_runs_eagerly_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model, x, y = start(2)
    seen: list[float] = []

    @tfsift.step
    def train(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = LOSS(labels, model(images, training=True))
        seen.append(float(loss.numpy()))  # eager only
        return tfsift.gradients(loss, model.trainable_variables), loss

    with caplog.at_level("WARNING", logger="tfsift"):
        grads, loss = train(x, y)
        train(x, y)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        "the @tfsift.step function could not be compiled with tf.function ("
    )
    assert "it runs eagerly instead, which is slower" in warnings[0]
    # the first call's probe (zero predictions: loss ln 3), then every microbatch eagerly
    assert len(seen) == 1 + 2 * 2
    assert seen[0] == pytest.approx(np.log(3))
    np.testing.assert_allclose(float(loss.reduce_mean()), np.mean(seen[1:3]), rtol=1e-6)
    for got, ref in zip(grads, reference_gradients(model, x, y, 0.0), strict=True):
        np.testing.assert_allclose(got.accumulate().numpy(), ref, rtol=1e-5, atol=1e-7)


def test_a_step_wrapped_in_tf_function_is_refused() -> None:
    model, x, y = start(2)

    train = standard_step(model)
    with pytest.raises(RuntimeError) as err:
        tf.function(train)(x, y)
    # tf.function prefixes the traceback of the user code it converted
    assert (
        str(err.value)
        .rstrip()
        .endswith(
            "RuntimeError: do not wrap a @tfsift.step function in tf.function: tfsift compiles "
            "the stages' forward and backward and the loss head itself"
        )
    )


def test_a_step_returns_python_values_and_nested_outputs() -> None:
    model, x, y = start(2)

    @tfsift.step
    def evaluate(images: tf.Tensor, labels: tf.Tensor) -> Any:
        logits = model(images, training=False)
        return {"logits": logits, "loss": LOSS(labels, logits), "name": "eval", "none": None}

    out = evaluate(x, y)
    assert out["name"] == "eval" and out["none"] is None
    assert out["logits"].concat().shape == (8, 3)
    assert len(out["loss"]) == 2


def test_a_step_whose_return_structure_changes_is_refused() -> None:
    model, x, y = start(2)

    @tfsift.step
    def train(images: tf.Tensor, labels: tf.Tensor) -> Any:
        logits = model(images, training=True)
        loss = LOSS(labels, logits)
        grads = tfsift.gradients(loss, model.trainable_variables)
        return (grads, loss, logits) if images.shape[0] == 4 else (grads, loss)

    train(x, y)  # microbatches of 4
    with pytest.raises(ValueError) as err:
        train(x[:4], y[:4])  # microbatches of 2: traced again, one output fewer
    assert str(err.value) == (
        "a @tfsift.step function must return the same structure on every call. "
        "Received: 1 tensors among 2 values, after 2 among 3"
    )


def test_named_tuples_come_back_as_named_tuples() -> None:
    model, x, y = start(2)
    Out = collections.namedtuple("Out", ["grads", "loss"])

    @tfsift.step
    def train(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = LOSS(labels, model(images, training=True))
        return Out(tfsift.gradients(loss, model.trainable_variables), loss)

    out = train(x, y)
    assert isinstance(out, Out) and len(out.grads) == 4 and len(out.loss) == 2


def test_a_python_number_that_changes_every_call_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model, x, y = start(1)

    @tfsift.step
    def train(images: tf.Tensor, labels: tf.Tensor, weight: float) -> Any:
        loss = weight * LOSS(labels, model(images, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    with caplog.at_level("WARNING", logger="tfsift"):
        losses = [float(train(x, y, float(w))[1].reduce_mean()) for w in range(1, 11)]
    # every value is honoured (a trace bakes the Python number in)
    np.testing.assert_allclose(np.array(losses) / losses[0], np.arange(1, 11), rtol=1e-5)
    warnings = [m for m in caplog.messages if "different argument signatures" in m]
    assert len(warnings) == 1
    assert warnings[0].startswith(
        "the @tfsift.step function "
        "'test_a_python_number_that_changes_every_call_warns_once.<locals>.train' has been "
        "traced for 8 different argument signatures"
    )


def test_python_control_flow_on_tensors_in_a_step_function_is_converted_by_autograph(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # tfsift keeps AutoGraph off its own modules; the user's step function is still rewritten
    from tensorflow.python.autograph.impl import conversion

    from tfsift.pipeline import head, stage

    model, x, _ = start(2)

    @tfsift.step
    def scaled(images: tf.Tensor, factor: tf.Tensor) -> Any:
        logits = model(images, training=False)
        if tf.reduce_sum(factor) > 0:  # a tensor condition: tf.cond once converted
            logits = logits * 2.0
        else:
            logits = logits * 3.0
        return logits

    with caplog.at_level("WARNING", logger="tfsift"):
        positive = scaled(x, tf.ones((8,))).concat().numpy()
        negative = scaled(x, -tf.ones((8,))).concat().numpy()
    assert not caplog.records  # compiled, not fallen back to eager
    plain = model.b(model.a(x)).numpy()
    np.testing.assert_allclose(positive, 2.0 * plain, rtol=1e-5)
    np.testing.assert_allclose(negative, 3.0 * plain, rtol=1e-5)
    assert conversion.is_allowlisted(stage.Stage.forward)
    assert conversion.is_allowlisted(head.Head._run)
    assert not conversion.is_allowlisted(scaled.__wrapped__)


class Normed(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(8)
        self.norm = keras.layers.BatchNormalization(name="norm")
        self.b = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.b(self.norm(self.a(x)))


@pytest.mark.parametrize("microbatches", [1, 2])
def test_batchnorm_on_microbatches_is_said_to_normalize_by_each_microbatch(
    caplog: pytest.LogCaptureFixture, microbatches: int
) -> None:
    # a step's batch reaches BatchNormalization as M calls: its statistics are a
    # microbatch's, where one Keras process with the same batch takes the whole batch's
    tfsift.init({"microbatches": microbatches})
    model, (x, y) = Normed(), batch()
    step = standard_step(model)
    with caplog.at_level("INFO", logger="tfsift"):
        step(x, y)
        step(x, y)
    said = [r.getMessage() for r in caplog.records if "BatchNormalization" in r.getMessage()]
    if microbatches == 1:
        assert said == []
    else:
        assert said == [
            "BatchNormalization layers (norm) normalize by each microbatch's statistics in "
            "training (4 samples a call, microbatches=2), not by the whole batch's"
        ]


class Dropped(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(4)
        self.drop = keras.layers.Dropout(0.3, seed=7, name="drop")
        self.attention = keras.layers.MultiHeadAttention(2, 2)  # its dropout of 0 draws nothing
        self.b = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        h = keras.ops.expand_dims(self.drop(self.a(x)), 1)
        return self.b(keras.ops.squeeze(self.attention(h, h), 1))


@pytest.mark.parametrize("microbatches", [1, 2])
def test_dropout_on_microbatches_is_said_to_draw_for_each_microbatch(
    caplog: pytest.LogCaptureFixture, microbatches: int
) -> None:
    # with M > 1 a step's dropout masks are other draws than one process's for the batch:
    # training differs from it by the draws, which nothing said
    tfsift.init({"microbatches": microbatches})
    model, (x, y) = Dropped(), batch()
    step = standard_step(model)
    with caplog.at_level("INFO", logger="tfsift"):
        step(x, y)
        step(x, y)
    said = [r.getMessage() for r in caplog.records if "random layers" in r.getMessage()]
    assert (
        said == []
        if microbatches == 1
        else said
        == [
            "random layers (drop) draw their values for each microbatch (microbatches=2): other "
            "draws than one process makes for the whole batch, alike in distribution"
        ]
    )


class Counting(keras.layers.Layer):  # type: ignore[misc]
    """Counts the samples it saw in training, in a non-trainable variable of its own."""

    def build(self, shape: Any) -> None:
        self.seen = self.add_weight(shape=(), initializer="zeros", trainable=False)

    def call(self, x: Any, training: bool | None = None) -> Any:
        if training:
            self.seen.assign_add(keras.ops.cast(keras.ops.shape(x)[0], "float32"))
        return x


class Counted(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.count, self.norm = Counting(), keras.layers.BatchNormalization()
        self.head = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.head(self.norm(self.count(x)))


@pytest.mark.parametrize("microbatches", [1, 2])
def test_a_layer_updating_its_own_state_in_training_is_said_to_do_so_per_microbatch(
    caplog: pytest.LogCaptureFixture, microbatches: int
) -> None:
    # it counted each microbatch, M times a step, without a word
    tfsift.init({"microbatches": microbatches})
    model, (x, y) = Counted(), batch()
    with caplog.at_level("WARNING", logger="tfsift"):
        standard_step(model)(x, y)
        standard_step(model)(x, y)  # a second step function's first call says it again
    said = [r.getMessage() for r in caplog.records if "non-trainable" in r.getMessage()]
    message = (
        f"layers ({model.count.name}) changed non-trainable variables of their own in a "
        "training step: a layer's call updates them for each microbatch (microbatches=2) "
        "and on each replica alone (replicas=1), where one Keras process updates them once "
        "a step for the whole batch"
    )
    assert said == ([] if microbatches == 1 else [message, message])
    assert float(model.count.seen.numpy()) == 16.0  # 8 samples a step, counted as they come


class Recurrent(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = keras.layers.LSTM(4, return_sequences=True)  # its cell draws nothing
        self.gru = keras.layers.GRU(4, dropout=0.2)
        self.head = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.head(self.gru(self.lstm(x)))


def test_only_recurrent_cells_with_dropout_are_said_to_draw(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # an LSTM without dropout was named: its cell holds a seed generator all the same
    tfsift.init({"microbatches": 2})
    model = Recurrent()
    x = tf.constant(np.random.default_rng(0).normal(size=(8, 3, 5)), tf.float32)
    with caplog.at_level("INFO", logger="tfsift"):
        standard_step(model)(x, batch()[1])
    said = [r.getMessage() for r in caplog.records if "random layers" in r.getMessage()]
    assert said == [
        f"random layers ({model.gru.cell.name}) draw their values for each microbatch "
        "(microbatches=2): other draws than one process makes for the whole batch, alike "
        "in distribution"
    ]


class Padded(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.embed = keras.layers.Embedding(5, 4, mask_zero=True)
        self.head = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.head(self.embed(x))


def test_a_step_of_a_model_whose_output_is_masked_says_its_outputs_carry_no_mask(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tfsift.init({})
    model = Padded()
    x = tf.constant([[1, 2, 0, 0], [3, 4, 1, 0]])

    @tfsift.step
    def scores(tokens: tf.Tensor) -> Any:
        return model(tokens)

    with caplog.at_level("WARNING", logger="tfsift"):
        out = scores(x)
    assert getattr(out.concat(), "_keras_mask", None) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"the output of {model.name!r} carries a Keras mask (padding), which a Keras loss in "
        "one process weighs by; the outputs of a @tfsift.step carry none, so a loss there "
        "counts the masked positions: weigh it by the padding yourself"
    ]


def test_a_layer_frozen_before_the_first_step_stays_and_one_frozen_after_is_refused() -> None:
    # after the first step, fit kept training the frozen layer and the optimizer paired
    # the other gradients with other weights (every weight 0.001 to 0.045 from Keras')
    tfsift.init({"microbatches": 2})
    x, y = batch()
    model = Mlp()
    model.a.trainable = False  # before the model is partitioned: its stage's gradients skip it
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    model.fit(x, y, batch_size=8, verbose=0)
    kept = [w.copy() for w in model.a.get_weights()]
    model.fit(x, y, batch_size=8, verbose=0)
    for a, b in zip(kept, model.a.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    model.a.trainable = True
    step = standard_step(model)
    with pytest.raises(ValueError) as err:
        step(x, y)
    name = model.a.name
    assert str(err.value) == (
        "a layer's trainable flag changed after the model was partitioned; tfsift fixes each "
        "stage's trainable weights when it partitions the model (its first step). Set "
        "trainable before the first step: for fine-tuning, save the weights "
        "(model.save_weights or a CheckpointManager) and load them into a new model with "
        f"the layers frozen. Received: {name}/kernel (trainable=True), {name}/bias "
        "(trainable=True)"
    )


def backbone() -> keras.Model:
    """A functional model, as a keras.applications or KerasHub backbone is."""
    inp = keras.Input((6,))
    hidden = keras.layers.Dense(5, "relu", kernel_initializer=keras.initializers.GlorotUniform(1))
    out = keras.layers.Dense(4, kernel_initializer=keras.initializers.GlorotUniform(2))
    return keras.Model(inp, out(hidden(inp)), name="body")


class Backbone(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.body = backbone()
        self.head = keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(3))

    def call(self, x: Any, training: bool | None = None) -> Any:
        return self.head(self.body(x, training=training))


def assert_fits_as_keras(
    model: tfsift.DistributedModel, ref: keras.Model, optimizer: Any = keras.optimizers.SGD
) -> None:
    """fit, on 2 microbatches, gives ``model`` the losses and weights that Keras' fit gives
    ``ref``, a plain Keras model of the same layers and initial weights (``optimizer(0.1)``
    each)."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 6)).astype(np.float32), rng.integers(0, 3, 32)
    losses = []
    for fitted in (model, ref):
        fitted.compile(optimizer=optimizer(0.1), loss=LOSS)
        losses.append(fitted.fit(x, y, batch_size=8, shuffle=False, verbose=0).history["loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    for a, b in zip(ref.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(b, a, atol=1e-6)


def test_a_backbone_called_whole_is_traced_through_and_trains_as_keras() -> None:
    # it was one node of the traced graph: no cut could fall between its layers
    tfsift.init({"microbatches": 2})
    model, inp, body = Backbone(), keras.Input((6,)), backbone()
    head = keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(3))
    assert_fits_as_keras(model, keras.Model(inp, head(body(inp))))
    assert model.partitioned is not None
    operations = [gn.node.operation for gn in model.partitioned.graph.nodes]
    assert [op for op in operations if isinstance(op, keras.layers.Dense)] == [
        *model.body.layers[1:],
        model.head,
    ]  # the backbone's layers, each a node
    assert type(model.body) is type(backbone())  # its own class back


class Centred(keras.optimizers.SGD):  # type: ignore[misc]
    """Centres every gradient by the mean over all of them, in its own apply_gradients."""

    def apply_gradients(self, grads_and_vars: Any) -> Any:
        pairs = list(grads_and_vars)
        mean = tf.add_n([tf.reduce_mean(g) for g, _ in pairs]) / len(pairs)
        return super().apply_gradients([(g - mean, v) for g, v in pairs])


def test_an_optimizers_own_apply_gradients_runs_in_fit_as_in_keras() -> None:
    # fit called optimizer.apply, which left the override out: plain SGD's weights
    tfsift.init({"microbatches": 2})
    inp, body = keras.Input((6,)), backbone()
    head = keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(3))
    assert_fits_as_keras(Backbone(), keras.Model(inp, head(body(inp))), Centred)


class Column(tfsift.DistributedModel):
    """Adds each sample's first feature to its 4 units: (B, 4) + (B, 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(4, kernel_initializer=keras.initializers.GlorotUniform(6))

    def call(self, x: Any) -> Any:
        return self.dense(x) + x[:, :1]


def test_a_column_added_to_as_many_units_as_a_microbatch_has_samples_is_broadcast() -> None:
    # Keras' TensorFlow add took (4, 4) + (4, 1) for a bias_add along the units (its
    # special case where the static batch equals the units): every sample got the first 4
    # samples' values, 0.7 apart from one process at a batch of 8
    tfsift.init({"microbatches": 2})  # microbatches of 4 samples, the units' count
    model = Column()
    x = np.random.default_rng(0).normal(size=(8, 5)).astype(np.float32)
    predicted = model.predict(x, batch_size=8, verbose=0)
    kernel, bias = model.get_weights()
    np.testing.assert_allclose(predicted, x @ kernel + bias + x[:, :1], atol=1e-6)


class OwnWeight(keras.Model):  # type: ignore[misc]
    """A subclassed model whose call uses a weight of its own, made in its build."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(4, kernel_initializer=keras.initializers.GlorotUniform(4))

    def build(self, shape: Any) -> None:
        self.w = self.add_weight(shape=(4, 3), initializer=keras.initializers.GlorotUniform(5))

    def call(self, x: Any) -> Any:
        return keras.ops.matmul(self.dense(x), self.w)


class Nesting(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.inner = OwnWeight()

    def call(self, x: Any) -> Any:
        return self.inner(x)


def test_a_subclassed_model_called_inside_stays_one_node_with_its_own_weights() -> None:
    # traced through, its build (which makes w) never ran and w was no variable of any node
    tfsift.init({"microbatches": 2})
    model, inp = Nesting(), keras.Input((6,))
    assert_fits_as_keras(model, keras.Model(inp, OwnWeight()(inp)))
    assert model.partitioned is not None
    assert [gn.node.operation for gn in model.partitioned.graph.nodes] == [model.inner]


class OwnTable(tfsift.DistributedModel):
    """A weight of the model's own, made in __init__ and used through keras.ops."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(4)
        self.table = self.add_weight(shape=(4, 3), name="table")

    def call(self, x: Any) -> Any:
        return keras.ops.matmul(self.dense(x), self.table)


class OwnBuild(tfsift.DistributedModel):
    """The same weight made in the model's own build."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(4)

    def build(self, shape: Any) -> None:
        self.table = self.add_weight(shape=(4, 3), name="table")

    def call(self, x: Any) -> Any:
        return keras.ops.matmul(self.dense(x), self.table)


@pytest.mark.parametrize(
    ("model", "received"),
    [
        (OwnTable, "own_table/table"),
        (OwnBuild, "those OwnBuild.build makes (tfsift never calls it)"),
    ],
)
def test_weights_of_the_models_own_are_refused_before_any_step(model: Any, received: str) -> None:
    # held by no node of the traced graph: fit ran with the table left as it was
    tfsift.init({"microbatches": 2})
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 6)).astype(np.float32), rng.integers(0, 3, 16)
    made = model()
    made.compile(optimizer="sgd", loss=LOSS)
    with pytest.raises(ValueError) as err:
        made.fit(x, y, batch_size=8, verbose=0)
    assert str(err.value) == (
        f"{model.__name__} makes weights of its own (self.add_weight), which tfsift cannot "
        "place: a stage holds the weights of the layers its part of call runs, and these "
        "belong to no layer. Make them a layer's (a keras.layers.Layer that creates them in its "
        f"build and uses them in its call) and call that layer. Received: {received}"
    )
    assert made.partitioned is None


def _functional() -> keras.Model:
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(8, "relu", kernel_initializer=keras.initializers.GlorotUniform(1))
    out = keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(2))
    return keras.Model(inputs, out(hidden(inputs)))


class Holder(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.net = _functional()

    def call(self, x: Any) -> Any:
        return self.net(x)


def test_keras_functional_constructor_is_refused_with_the_subclass_to_write() -> None:
    # it built and compiled, then fit said the model made weights of its own
    inputs = keras.Input((5,))
    outputs = keras.layers.Dense(3)(inputs)
    for args, kwargs in [((inputs, outputs), {}), ((), {"inputs": inputs, "outputs": outputs})]:
        with pytest.raises(TypeError) as err:
            tfsift.DistributedModel(*args, **kwargs)
        assert str(err.value) == (
            "tfsift.DistributedModel is subclassed (layers in __init__, the forward in call), "
            "not built from inputs and outputs: hold the functional model in a subclass, "
            "self.net = keras.Model(inputs, outputs), and return self.net(x) from call. "
            "Received: DistributedModel(inputs, outputs)"
        )


def test_a_subclass_holding_a_functional_model_trains_as_keras_does() -> None:
    tfsift.init({"microbatches": 2})
    x = np.random.default_rng(0).normal(size=(32, 5)).astype(np.float32)
    y = np.arange(32) % 3
    models = [_functional(), Holder()]
    for model in models:
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
        model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    for ours, theirs in zip(models[1].get_weights(), models[0].get_weights(), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_a_step_that_leaves_its_gradients_out_of_its_result_is_refused() -> None:
    # it returned None and trained nothing, without a word
    model, x, y = start(2)

    @tfsift.step
    def train(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = LOSS(labels, model(images, training=True))
        tfsift.gradients(loss, model.trainable_variables)

    with pytest.raises(RuntimeError) as err:
        train(x, y)
    assert str(err.value) == (
        "the @tfsift.step function computes tfsift.gradients but does not return them: "
        "return them (e.g. return tfsift.gradients(loss, model.trainable_variables), loss) "
        "to get them back from the step. Received: a step returning None"
    )


def test_allreduce_and_clipping_take_a_list_not_one_value() -> None:
    # a tensor's rows were averaged as gradients of their own; a StepOutput was "not iterable"
    model, x, y = start(2)
    _, loss = standard_step(model)(x, y)
    for value in (loss, tf.constant([1.0, 2.0]), np.ones(3), 2.0):
        with pytest.raises(TypeError) as err:
            tfsift.allreduce(value)
        assert str(err.value) == (
            "tfsift.allreduce(grads) expects a list of gradients, one per trainable variable "
            "(a step's tfsift.gradients result); for one value, pass a list of it. Received: "
            f"{type(value).__name__}"
        )
    with pytest.raises(TypeError, match=r"^clip_by_global_norm\(grads, clip_norm, model\) exp"):
        tfsift.clip_by_global_norm(tf.constant([1.0]), 1.0, model)
    assert float(tfsift.allreduce([loss])[0]) == pytest.approx(float(loss.reduce_mean()))


def test_update_names_a_gradient_not_of_its_variables_shape() -> None:
    # Keras said "Dimensions must be equal ... for '{{node adam/Sub_2}}'"
    model, x, y = start(2)
    grads, _ = standard_step(model)(x, y)
    update = tfsift.compiled_update(keras.optimizers.Adam(), model)
    tensors = tfsift.allreduce(grads)
    swapped = [tensors[1], tensors[0], *tensors[2:]]
    with pytest.raises(ValueError) as err:
        update(swapped)
    kernel = model.trainable_variables[0]
    assert str(err.value) == (
        "update(grads) expects each gradient in the shape of its variable, in the order of "
        f"the trainable variables of this rank's stage of {model.name!r}. Received: a "
        f"gradient of shape (8,) for {kernel.path!r} of shape (5, 8)"
    )
    update(tensors)  # the first call that passes the check
