"""tfsift.sift in one process: exact selections, refills, delay, weights, errors, lock-step."""

from __future__ import annotations

import logging
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from events import scalars

import tfsift
from tfsift.sift.reader import SourceReader
from tfsift.sift.relative import RelativePolicy
from tfsift.sift.scorer import Scorer, Scores
from tfsift.sift.selection import Selection
from tfsift.sift.transform import SiftedDataset, Sifter

PER_SAMPLE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
MEAN = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
N, B = 192, 16


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(8, activation="tanh")
        self.b = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


def data(n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """Features whose column 0 is the sample id / 1000, and labels."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    x[:, 0] = np.arange(n) / 1000
    return x, rng.integers(0, 3, n)


def ids(x: Any) -> list[int]:
    return [round(float(v) * 1000) for v in np.asarray(x)[:, 0]]


def source(n: int = N, batch: int = B) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(data(n)).batch(batch, drop_remainder=True)


def start(microbatches: int = 1) -> Net:
    tfsift.init({"microbatches": microbatches})
    keras.utils.set_random_seed(1)
    return Net()


def full_losses(model: Net) -> np.ndarray:
    """Every sample's loss from the whole model, outside the pipeline (no training)."""
    x, y = data()
    model.partition_model([tf.constant(x[:B])])
    return np.asarray(PER_SAMPLE(y, model.b(model.a(x))))


def test_relative_selection_equals_the_policy_replayed_on_the_same_losses() -> None:
    model = start()
    config = tfsift.SiftConfig(policy="relative", beta=1.0, history=50, seed=7)
    losses = full_losses(model)
    got = [i for x, _ in source().apply(tfsift.sift(model, PER_SAMPLE, config)) for i in ids(x)]
    policy, kept = RelativePolicy(1.0, 50), []
    for r in range(N // B):
        batch = losses[r * B : (r + 1) * B]
        policy.observe(batch)
        chosen = policy.select(batch, np.random.default_rng([7, 0, r]))
        kept += [r * B + int(i) for i in chosen.indices]
    assert got == kept[: len(kept) // B * B]
    assert len(got) % B == 0 and len(got) >= B


def test_every_sifted_batch_has_the_source_batch_size_and_metrics_count_it() -> None:
    model = start(microbatches=4)
    config = tfsift.SiftConfig(policy="big_loss", keep=0.25)
    sizes = [int(x.shape[0]) for x, _ in source().apply(tfsift.sift(model, PER_SAMPLE, config))]
    assert sizes == [B] * 3  # 12 batches x 4 kept = 48 samples = 3 batches
    metrics = tfsift.sift_metrics()
    assert metrics["samples_seen"] == N and metrics["samples_kept"] == 48
    assert metrics["kept_fraction"] == 0.25 and metrics["batches_yielded"] == 3
    assert metrics["mean_loss_kept"] > metrics["mean_loss_scored"]


def test_big_loss_keeps_the_highest_losses_of_each_scored_group() -> None:
    model = start()
    losses = full_losses(model)
    config = tfsift.SiftConfig(policy="big_loss", keep=0.5, score_batches=3)
    got = [i for x, _ in source().apply(tfsift.sift(model, PER_SAMPLE, config)) for i in ids(x)]
    want = []
    for r in range(N // (3 * B)):
        group = losses[r * 3 * B : (r + 1) * 3 * B]
        want += sorted(r * 3 * B + int(i) for i in np.argsort(-group, kind="stable")[: 3 * B // 2])
    assert got == want


def test_the_delay_passes_the_first_batches_through_unchanged() -> None:
    model = start()
    config = tfsift.SiftConfig(policy="big_loss", keep=0.25, delay=3)
    batches = [ids(x) for x, _ in source().apply(tfsift.sift(model, PER_SAMPLE, config))]
    assert batches[:3] == [list(range(r * B, (r + 1) * B)) for r in range(3)]
    assert tfsift.sift_metrics()["samples_kept"] == 3 * B + 9 * 4


def test_the_remainder_is_yielded_in_whole_microbatches_when_asked() -> None:
    model = start(microbatches=4)
    config = tfsift.SiftConfig(policy="big_loss", keep=0.5, drop_remainder=False)
    sizes = [int(x.shape[0]) for x, _ in source(80).apply(tfsift.sift(model, PER_SAMPLE, config))]
    assert sizes == [B, B, 8]  # 5 batches x 8 kept = 40 = 16 + 16 + 8
    model = start(microbatches=4)
    config = config.replace(keep=0.3125)  # 5 of 16: 25 kept, 9 left, 8 yielded
    sizes = [int(x.shape[0]) for x, _ in source(80).apply(tfsift.sift(model, PER_SAMPLE, config))]
    assert sizes == [B, 8]


@pytest.mark.parametrize("rescale", ["unbiased", "normalized"])
def test_rescale_adds_the_inverse_keep_probability_as_sample_weight(rescale: str) -> None:
    model = start()
    config = tfsift.SiftConfig(policy="uniform", keep=0.25, rescale=rescale)
    *_, w = next(iter(source().apply(tfsift.sift(model, PER_SAMPLE, config))))
    assert w.dtype == tf.float32 and w.shape == (B,)
    want = 4.0 if rescale == "unbiased" else 1.0
    np.testing.assert_allclose(w.numpy(), np.full(B, want), rtol=1e-6)


def test_nonfinite_losses_are_never_kept_and_are_counted_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = start()

    def poisoned(y_true: Any, y_pred: Any) -> Any:
        losses = PER_SAMPLE(y_true, y_pred)
        return tf.where(tf.range(tf.shape(losses)[0]) % 4 == 0, np.nan, losses)

    config = tfsift.SiftConfig(policy="big_loss", keep=1.0)
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        got = [i for x, _ in source().apply(tfsift.sift(model, poisoned, config)) for i in ids(x)]
    assert got and all(i % 4 != 0 for i in got)
    assert tfsift.sift_metrics()["nonfinite_losses"] == N // 4
    warnings = [r.getMessage() for r in caplog.records if "NaN or infinite" in r.getMessage()]
    assert len(warnings) == 1


def test_a_policy_that_starves_the_loop_is_named_once_with_what_to_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = start()
    config = tfsift.SiftConfig(policy="big_loss", keep=0.01)  # 1 sample of 32 a round
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        batches = list(source(32 * 45, 32).apply(tfsift.sift(model, PER_SAMPLE, config)))
    assert len(batches) == 1  # after 32 rounds
    warnings = [r.getMessage() for r in caplog.records if "yielded no batch" in r.getMessage()]
    assert warnings == [
        "tfsift.sift: 20 rounds of source batches in a row have yielded no batch: the policy "
        "kept 20 samples since the last one, fewer than a batch of 32 (policy='big_loss'). "
        "Training waits while sifting reads on; keep more with a larger keep, or check "
        "sift_metrics()"
    ]


@pytest.mark.parametrize("microbatches", [1, 2])
def test_a_loss_that_returns_one_value_per_batch_is_refused_with_a_hint(microbatches: int) -> None:
    model = start(microbatches)
    with pytest.raises(ValueError) as err:
        next(iter(source().apply(tfsift.sift(model, MEAN))))
    assert str(err.value) == (
        "the per-sample loss must return one loss per sample (shape (B,)); it got a single "
        "value. Use a Keras loss with reduction=None. Received: shape=()"
    )


def test_a_batch_size_not_divisible_by_microbatches_is_refused_before_training() -> None:
    model = start(microbatches=4)
    with pytest.raises(ValueError) as err:
        source(batch=10).apply(tfsift.sift(model, PER_SAMPLE))
    assert str(err.value) == (
        "the sifted dataset's batch size must be divisible by microbatches=4, since every "
        "sifted batch has that size. Received: batch size 10"
    )


def test_an_unbatched_dataset_and_a_wrong_first_argument_are_refused() -> None:
    model = start()
    unbatched = tf.data.Dataset.from_tensor_slices(data())
    with pytest.raises(ValueError) as err:
        unbatched.apply(tfsift.sift(model, PER_SAMPLE))
    assert str(err.value).startswith("tfsift.sift needs a batched dataset (apply it after")
    with pytest.raises(TypeError) as type_err:
        tfsift.sift(keras.Sequential([keras.layers.Dense(2)]), PER_SAMPLE)
    assert str(type_err.value) == (
        "tfsift.sift expects a tfsift.DistributedModel and a per-sample loss, or a "
        "forward-only @tfsift.step function. Received: Sequential"
    )


def test_a_scoring_step_serves_dict_elements() -> None:
    model = start()

    @tfsift.step
    def score(batch: dict[str, Any]) -> Any:
        return PER_SAMPLE(batch["y"], model(batch["x"], training=False))

    x, y = data()
    dicts = tf.data.Dataset.from_tensor_slices({"x": x, "y": y}).batch(B, drop_remainder=True)
    config = tfsift.SiftConfig(policy="small_loss", keep=0.5)
    out = list(dicts.apply(tfsift.sift(score, config=config)))
    assert len(out) == N // B // 2 and set(out[0]) == {"x", "y"}
    assert out[0]["x"].shape == (B, 4)


def train(prefetch: int, path: str) -> list[np.ndarray]:
    """Two sifted epochs with Adam; returns the final weights."""
    model = start(microbatches=2)
    config = tfsift.SiftConfig(policy="relative", beta=1.0, history=64, seed=3)
    sifted = source().apply(tfsift.sift(model, PER_SAMPLE, config))
    if prefetch:
        sifted = sifted.prefetch(prefetch)
    if path == "graph":
        sifted = sifted.take(1000)  # a transformation after sift: the tf.data path
    optimizer = keras.optimizers.Adam(0.05)

    @tfsift.step
    def step(x: tf.Tensor, y: tf.Tensor) -> Any:
        loss = MEAN(y, model(x, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    for _ in range(2):
        for x, y in sifted:
            grads, _ = step(x, y)
            pairs = zip(tfsift.allreduce(grads), model.trainable_variables, strict=True)
            optimizer.apply_gradients(pairs)
    return [v.numpy() for v in model.trainable_variables]


def test_prefetch_after_sift_and_the_tf_data_path_train_exactly_like_plain_iteration() -> None:
    plain = train(0, "python")
    for prefetch, path in [(2, "python"), (0, "graph")]:
        got = train(prefetch, path)
        for a, b in zip(got, plain, strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_prefetch_ahead_of_training_raises_instead_of_scoring_stale() -> None:
    model = start()
    config = tfsift.SiftConfig(policy="big_loss", keep=0.5)
    ahead = source().apply(tfsift.sift(model, PER_SAMPLE, config)).take(100).prefetch(4)

    @tfsift.step
    def step(x: tf.Tensor, y: tf.Tensor) -> Any:
        import time

        time.sleep(0.2)  # the prefetch thread scores meanwhile
        loss = MEAN(y, model(x, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    with pytest.raises((RuntimeError, tf.errors.OpError)) as err:
        for x, y in ahead:
            step(x, y)
    assert "steps cannot nest or overlap" in str(err.value) or "in lock-step" in str(err.value)


def test_a_step_called_inside_a_step_is_refused() -> None:
    model = start()

    @tfsift.step
    def inner(x: tf.Tensor) -> Any:
        return model(x, training=False)

    @tfsift.step(compile=False)
    def outer(x: tf.Tensor) -> Any:
        inner(x)
        return model(x, training=False)

    with pytest.raises(RuntimeError) as err:
        outer(tf.ones((4, 4)))
    assert "was called while" in str(err.value)
    assert "steps cannot nest or overlap" in str(err.value)


def test_tfsift_sift_is_callable_after_its_modules_are_imported() -> None:
    import tfsift.sift.config  # binds the package to tfsift.sift

    assert callable(tfsift.sift)
    assert tfsift.SiftConfig is tfsift.sift.config.SiftConfig


@pytest.mark.parametrize("where", ["SiftConfig", "tfsift.init"])
def test_log_dir_gets_tensorboard_scalars_of_the_metrics(tmp_path: Any, where: str) -> None:
    model = start()
    if where == "tfsift.init":  # the run's log_dir, when the SiftConfig names none
        tfsift.init({"log_dir": str(tmp_path)})
    log_dir = str(tmp_path) if where == "SiftConfig" else None
    config = tfsift.SiftConfig(policy="big_loss", keep=0.5, log_dir=log_dir)
    batches = len(list(source().apply(tfsift.sift(model, PER_SAMPLE, config))))
    tags = {tag: [value for _, value in points] for tag, points in scalars(tmp_path).items()}
    assert len(tags["sift/kept_fraction"]) == batches == N // B // 2
    assert tags["sift/kept_fraction"][-1] == 0.5
    assert tags["sift/samples_seen"][-1] == N


def test_log_dir_scalars_are_written_in_batches_not_per_batch(tmp_path: Any) -> None:
    # eager summary ops and a flush per batch cost rank 0 milliseconds per sifted batch:
    # the points wait in a buffer until runlog.FLUSH batches, the epoch's end, or exit
    model = start()
    config = tfsift.SiftConfig(policy="big_loss", keep=0.5, log_dir=str(tmp_path))
    batches = iter(source().apply(tfsift.sift(model, PER_SAMPLE, config)))
    next(batches), next(batches)
    assert "sift/kept_fraction" not in scalars(tmp_path)
    rest = len(list(batches))
    points = scalars(tmp_path)["sift/kept_fraction"]
    assert [step for step, _ in points] == list(range(1, rest + 3))


class Deep(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(16, activation="relu", name="a")
        self.b = keras.layers.Dense(16, activation="relu", name="b")
        self.c = keras.layers.Dense(16, activation="relu", name="c")
        self.d = keras.layers.Dense(3, name="d")

    def call(self, x: Any) -> Any:
        return self.d(self.c(self.b(self.a(x))))


def test_early_exit_scores_with_the_first_layers_and_a_head_that_learns() -> None:
    tfsift.init({"microbatches": 2})
    keras.utils.set_random_seed(2)
    model = Deep()
    config = tfsift.SiftConfig(
        policy="big_loss", keep=0.5, scorer="early_exit", exit_after="b", exit_lr=0.05, delay=2
    )
    sifted = source().apply(tfsift.sift(model, PER_SAMPLE, config))
    first = [ids(x) for x, _ in sifted]
    scorer = sifted.sifter.rounds.scorer
    head = scorer._head.model
    assert [type(layer).__name__ for layer in head.layers] == ["Flatten", "Dense", "Reshape"]
    assert head.layers[1].kernel.shape == (16, 3)  # layer b's 16 features to the 3 logits
    # the kept samples are the highest early-exit losses of their batch, not the model's
    head_before = [w.numpy() for w in head.weights]
    trunk_before = [w.numpy() for w in model.trainable_variables]
    assert len(first) == 2 + (N // B - 2) // 2
    epoch_two = [ids(xb) for xb, _ in sifted]  # the delay is over: 8 of every 16 kept
    assert len(epoch_two) == N // B // 2
    assert sorted(epoch_two[0]) == epoch_two[0] and set(epoch_two[0]) <= set(range(2 * B))
    assert all((w.numpy() != b).any() for w, b in zip(head.weights, head_before, strict=True))
    for w, b in zip(model.trainable_variables, trunk_before, strict=True):
        np.testing.assert_array_equal(w.numpy(), b)  # no gradient reaches the trunk
    assert -1.0 <= tfsift.sift_metrics()["exit_spearman"] <= 1.0


def test_early_exit_refuses_a_layer_outside_stage_0_and_a_scoring_step() -> None:
    tfsift.init({})
    model = Deep()
    config = tfsift.SiftConfig(scorer="early_exit", exit_after="e")
    with pytest.raises(ValueError) as err:
        next(iter(source().apply(tfsift.sift(model, PER_SAMPLE, config))))
    assert str(err.value) == (
        "exit_after must name a layer of stage 0 (by layer name or model attribute: a, b, c, "
        "d); 'e' is not a layer of the model. Received: exit_after='e'"
    )

    @tfsift.step
    def score(x: tf.Tensor, y: tf.Tensor) -> Any:
        return PER_SAMPLE(y, model(x, training=False))

    with pytest.raises(ValueError) as value_err:
        tfsift.sift(score, config=config)
    assert str(value_err.value).startswith("scorer='early_exit' needs tfsift.sift(model,")


def test_spearman_is_one_for_the_same_order_and_minus_one_reversed() -> None:
    from tfsift.sift.experimental.early_exit import spearman

    a = np.array([0.3, 0.1, 0.9, 0.5])
    assert spearman(a, a * 2 + 1) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)


def test_stale_reuses_last_epochs_losses_and_rescores_after_stale_epochs() -> None:
    model = start()
    config = tfsift.SiftConfig(policy="big_loss", keep=0.5, stale=1)
    sifted = source().apply(tfsift.sift(model, PER_SAMPLE, config))
    epochs = [[i for x, _ in sifted for i in ids(x)] for _ in range(3)]
    metrics = tfsift.sift_metrics()
    assert metrics["samples_scored"] == 2 * N  # epochs 1 and 3 score, epoch 2 reuses
    assert metrics["samples_reused"] == N
    assert epochs[0] == epochs[1] == epochs[2]  # no training: the same losses each time


def test_stale_scores_only_the_samples_it_has_no_loss_for() -> None:
    from tfsift.sift.transform import SiftedDataset

    model = start()
    config = tfsift.SiftConfig(policy="big_loss", keep=0.5, stale=5)
    first = source().take(6).apply(tfsift.sift(model, PER_SAMPLE, config))  # ids 0..95
    list(first)
    list(SiftedDataset(first.sifter, source().skip(3)))  # ids 48..191: 48 of them known
    assert tfsift.sift_metrics()["samples_scored"] == 96 + 96
    assert tfsift.sift_metrics()["samples_reused"] == 48


def test_score_cache_keys_survive_shuffling_and_expire() -> None:
    from tfsift.sift.stale import ScoreCache

    cache = ScoreCache(epochs=2)
    x, y = data(10)
    keys = cache.fingerprints([x, y])
    assert len(set(keys.tolist())) == 10
    cache.store(keys, np.arange(10.0), epoch=1)
    order = np.random.default_rng(0).permutation(10)
    again = cache.fingerprints([x[order], y[order]])
    fresh, losses = cache.lookup(again, epoch=3)
    assert fresh.all() and losses.tolist() == order.astype(float).tolist()
    assert not cache.lookup(again, epoch=4)[0].any()


def test_stale_with_a_policy_that_needs_logits_is_refused_when_the_config_is_made() -> None:
    # as config.md says a bad value fails; it failed at tfsift.sift before
    with pytest.raises(ValueError) as err:
        tfsift.SiftConfig(policy="grad_norm", stale=2)
    assert str(err.value) == (
        "stale reuses losses, but policy 'grad_norm' needs fresh logits. Received: stale=2, "
        "policy='grad_norm'"
    )


@pytest.mark.parametrize("scorer", ["full", "early_exit"])
def test_a_sifter_restored_mid_epoch_yields_what_the_uninterrupted_one_would(
    scorer: str,
) -> None:
    tfsift.init({})
    exit_after = "b" if scorer == "early_exit" else None
    config = tfsift.SiftConfig(
        policy="relative", beta=1.0, history=32, seed=4, scorer=scorer, exit_after=exit_after,
        stale=1,
    )  # fmt: skip
    keras.utils.set_random_seed(2)
    model = Deep()
    whole = source().apply(tfsift.sift(model, PER_SAMPLE, config))
    want = [[ids(x) for x, _ in whole] for _ in range(2)]
    keras.utils.set_random_seed(2)
    model = Deep()
    first = source().apply(tfsift.sift(model, PER_SAMPLE, config))
    stream = iter(first)
    got = [ids(next(stream)[0]) for _ in range(2)]  # stop after two batches
    saved = first.sifter.state()
    again = source().apply(tfsift.sift(model, PER_SAMPLE, config))
    again.sifter.load_state(saved)
    got += [ids(x) for x, _ in again]  # the rest of epoch 1
    assert got == want[0]
    assert [ids(x) for x, _ in again] == want[1]


def test_exit_after_accepts_the_model_attribute_holding_the_layer() -> None:
    tfsift.init({})
    model = Net()  # layers named dense_N by Keras, held as model.a and model.b
    config = tfsift.SiftConfig(policy="big_loss", scorer="early_exit", exit_after="a")
    sifted = source().apply(tfsift.sift(model, PER_SAMPLE, config))
    next(iter(sifted))
    assert sifted.sifter.rounds.scorer._exit_graph.nodes[-1].operation is model.a


@pytest.mark.parametrize("scorer", ["full", "early_exit", "step"])
def test_a_scorer_that_calls_the_model_first_partitions_it_for_the_training_batch(
    scorer: str,
) -> None:
    # the profile, and so the cut, depend on the microbatch size: B / M, the training
    # step's, not g * B / M of a scoring call that happens to run first
    model = start(microbatches=2)
    config = tfsift.SiftConfig(
        policy="big_loss", keep=0.5, score_batches=4, scorer="full" if scorer == "step" else scorer
    )
    if scorer == "step":

        @tfsift.step
        def score(x: Any, y: Any) -> Any:
            return PER_SAMPLE(y, model(x, training=False))

        sifted = source().apply(tfsift.sift(score, config=config))
    else:
        sifted = source().apply(tfsift.sift(model, PER_SAMPLE, config))
    x, _ = next(iter(sifted))
    assert x.shape[0] == B
    part = model.partitioned
    assert part is not None
    assert part.graph.tensors[part.graph.inputs[0]].shape[0] == B // 2  # not 4 * B // 2


def test_a_round_shorter_than_g_batches_is_padded_to_one_scoring_shape() -> None:
    # 12 source batches in rounds of g=5: 5, 5 and 2 batches; the last is scored padded
    # to 5 batches with copies of its first sample, so the scoring step keeps one shape
    model = start()
    shapes: list[int] = []

    @tfsift.step(compile=False)
    def score(x: Any, y: Any) -> Any:
        shapes.append(int(x.shape[0]))
        return PER_SAMPLE(y, model(x, training=False))

    config = tfsift.SiftConfig(policy="big_loss", keep=0.5, score_batches=5)
    sifted = source().apply(tfsift.sift(score, config=config))
    got = [ids(x) for x, _ in sifted]
    # the first call (its probe, then the call) partitions the model for one batch
    assert shapes[:3] == [B, B, 5 * B]
    assert set(shapes[2:]) == {5 * B}
    assert len(got) == N // B // 2
    # the last round kept half of its own 32 samples, none of the copies
    assert sorted(i for batch in got for i in batch if i >= 10 * B) == sorted(
        set(i for batch in got for i in batch if i >= 10 * B)
    )
    assert len([i for batch in got for i in batch if i >= 10 * B]) == B
    assert tfsift.sift_metrics()["samples_scored"] == N


def test_a_consumer_that_stops_early_ends_the_readers_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    readers: list[SourceReader] = []  # held here: the thread must end on close, not on GC
    init = SourceReader.__init__

    def held(self: SourceReader, *args: Any) -> None:
        init(self, *args)
        readers.append(self)

    monkeypatch.setattr(SourceReader, "__init__", held)
    model = start()
    config = tfsift.SiftConfig(policy="uniform", keep=0.5, score_batches=2)
    batches = iter(source().apply(tfsift.sift(model, PER_SAMPLE, config)))
    next(batches)
    (reader,) = readers
    thread = reader._thread
    assert thread is not None  # the next block is being read ahead
    workers = list(thread._threads)
    assert workers
    del batches  # the consumer stops: the epoch's generator is closed
    for worker in workers:
        worker.join(5.0)
    assert reader._thread is None and not any(w.is_alive() for w in workers)


class PartlyScored(Scorer):
    """Scores each round's first ``scored[r]`` samples, with their ids as losses, and
    leaves the rest unscored, as overlap with ``leftover="keep"`` does where its waits
    had room for that many; records the kept positions it is told to learn."""

    def __init__(self, scored: list[int]) -> None:
        self.scored, self.rounds, self.learnt = scored, 0, []

    def __call__(self, element: Any) -> Scores:
        losses = np.asarray(ids(element[0]), np.float64)
        k = self.scored[self.rounds]
        self.rounds += 1
        losses[k:] = np.nan
        return Scores(losses, scored=None if k == len(losses) else k)

    def learn(self, kept: np.ndarray) -> None:
        self.learnt.append(kept.tolist())


def test_what_overlap_left_unscored_is_kept_and_the_policy_sees_only_the_scored() -> None:
    start()
    scored = [16, 8, 0, 5, 16, 3]  # per round of 16: all, half, none, ...
    scorer = PartlyScored(scored)
    config = tfsift.SiftConfig(policy="relative", beta=1.0, history=50, seed=7, rescale="unbiased")
    sifter = Sifter(source().element_spec, scorer, config)
    got = [(ids(x), w.numpy().tolist()) for x, _, w in SiftedDataset(sifter, source(6 * B))]
    policy, kept, weights, learnt = RelativePolicy(1.0, 50), [], [], []
    for r, k in enumerate(scored):
        losses = np.arange(r * B, r * B + k, dtype=np.float64)
        policy.observe(losses)  # the history holds the scored losses only
        rng = np.random.default_rng([7, 0, r])
        chosen = policy.select(losses, rng) if k else Selection.empty()
        learnt.append(chosen.indices.tolist())
        kept += [r * B + int(i) for i in chosen.indices] + list(range(r * B + k, (r + 1) * B))
        weights += (1 / chosen.probs).tolist() + [1.0] * (B - k)
    yielded = len(kept) // B * B
    assert [i for batch, _ in got for i in batch] == kept[:yielded]
    np.testing.assert_allclose([v for _, w in got for v in w], weights[:yielded], rtol=1e-6)
    assert scorer.learnt == learnt  # the kept among the scored, as positions among them
    metrics = tfsift.sift_metrics()
    assert metrics["samples_unscored"] == 6 * B - sum(scored)
    assert metrics["samples_scored"] == sum(scored)
    assert metrics["samples_kept"] == len(kept)


class Preparing(PartlyScored):
    """``PartlyScored``, told the rounds that overlap prepares: notes, per call, whether a
    round was prepared since the last call and whether the call scores that very round
    (the scorer finds a prepared round by its x: the same array)."""

    def __init__(self, scored: list[int]) -> None:
        super().__init__(scored)
        self.prepared: Any = None
        self.calls: list[tuple[bool, bool]] = []

    def prepare(self, element: Any) -> None:
        self.prepared = element[0]

    def __call__(self, element: Any) -> Scores:
        had, self.prepared = self.prepared, None
        self.calls.append((had is not None, element[0] is had))
        return super().__call__(element)


def test_stale_with_overlap_prepares_only_rounds_it_scores_whole_and_stores_the_scored() -> None:
    # stale=1, every sample kept: epoch 1 scores rounds 2 and 4 partly (8 and 4 samples of
    # 16, leftover="keep"), so only 44 losses are stored; epoch 2 reuses them and scores
    # the 20 others; in epoch 3 only those 20 are fresh
    start()
    scorer = Preparing([16, 8, 16, 4, 16, 16, 16, 16, 16, 16])  # per call: epochs 1, 2, 3
    config = tfsift.SiftConfig(
        policy="big_loss", keep=1.0, stale=1, overlap=True, scorer="early_exit",
        leftover="keep",
    )  # fmt: skip
    sifter = Sifter(source().element_spec, scorer, config)
    epochs = []
    for _ in range(3):
        before = len(scorer.calls)
        list(SiftedDataset(sifter, source(4 * B)))
        epochs.append(scorer.calls[before:])
        metrics = tfsift.sift_metrics()
        epochs[-1].append((metrics["samples_scored"], metrics["samples_reused"]))
    # epoch 1: no fresh loss; every round after the first (a full batch is then ready to
    # train on) prepared, and scored from the prepared arrays
    assert epochs[0] == [(False, False), (True, True), (True, True), (True, True), (44, 0)]
    # epoch 2: rounds 2 and 4 partly fresh, scored at the round, and nothing prepared
    # for them (it would have scored other rows), nor for the two fully fresh rounds
    assert epochs[1] == [(False, False), (False, False), (44 + 20, 44)]
    # epoch 3: rounds 1 and 3 have no fresh loss (round 3 prepared, as in epoch 1); 2 and
    # 4 have 8 and 12 (what epoch 2 scored)
    assert epochs[2] == [(False, False), (False, False), (True, True), (False, False), (108, 64)]
