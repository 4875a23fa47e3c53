"""One stage's forward and backward, in speed and memory mode, against a plain tape."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfsift.pipeline.stage import Stage
from tfsift.planning.graph import Graph, trace


class Net(keras.Model):  # type: ignore[misc]
    """Nodes: 0 a, 1 b, 2 bn, 3 drop, 4 c; the middle stage is nodes 1..3."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.a = keras.layers.Dense(6, activation="tanh")
        self.b = keras.layers.Dense(5)
        self.bn = keras.layers.BatchNormalization()
        self.drop = keras.layers.Dropout(rate)
        self.c = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.c(self.drop(self.bn(self.b(self.a(x)))))


class Scaled(keras.Model):  # type: ignore[misc]
    """An integer model input used after the first layer: it crosses the cut at 1."""

    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(4, activation="tanh")
        self.b = keras.layers.Dense(2)

    def call(self, x: Any, n: Any) -> Any:
        return keras.ops.multiply(self.b(self.a(x)), keras.ops.cast(n, "float32"))


def setup(rate: float) -> tuple[Net, Graph, tf.Tensor]:
    keras.utils.set_random_seed(0)
    model = Net(rate)
    x = tf.constant(np.random.default_rng(1).normal(size=(8, 4)), tf.float32)
    return model, trace(model, [x]), x


def upstream(shape: tuple[int, ...]) -> tf.Tensor:
    """A gradient arriving from the next stage (not all ones, so that masks matter)."""
    return tf.constant(np.random.default_rng(2).normal(size=shape), tf.float32)


def values(tensors: Any) -> list[np.ndarray]:
    return [np.asarray(t.numpy() if hasattr(t, "numpy") else t) for t in tensors]


def assert_all_close(got: Any, want: Any) -> None:
    assert len(got) == len(want)
    for g, w in zip(values(got), values(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def forward_backward(stage: Stage, inputs: list[tf.Tensor]) -> tuple[Any, Any, Any]:
    """Outputs, variable gradients, input gradients of one microbatch."""
    outputs, saved = stage.forward(inputs, training=True, keep=True)
    assert saved is not None
    var_grads, in_grads = stage.backward(saved, [upstream(tuple(outputs[0].shape))])
    return outputs, var_grads, in_grads


@pytest.mark.parametrize("recompute", [False, True])
def test_a_middle_stage_gives_the_tapes_variable_and_input_gradients(recompute: bool) -> None:
    model, graph, x = setup(rate=0.0)
    stage = Stage(graph.stage(1, 4), 1, recompute)
    h = model.a(x)
    outputs, var_grads, in_grads = forward_backward(stage, [h])
    with tf.GradientTape() as tape:
        tape.watch(h)
        want_out = model.drop(model.bn(model.b(h), training=True), training=True)
    want = tape.gradient(
        want_out, [*stage.variables, h], output_gradients=upstream(tuple(want_out.shape))
    )
    assert [v.path for v in stage.variables] == [
        v.path for v in [model.b.kernel, model.b.bias, model.bn.gamma, model.bn.beta]
    ]
    assert_all_close(outputs, [want_out])
    assert_all_close(var_grads, want[:4])
    assert_all_close(in_grads, want[4:])


def test_the_tape_and_the_recompute_give_bitwise_the_same_gradients() -> None:
    # optimize="speed" picks either by time (Plan.recompute): the choice must not move a bit
    model, graph, x = setup(rate=0.5)
    h = model.a(x)
    got = []
    for recompute in (False, True):
        stage = Stage(graph.stage(1, 4), 1, recompute)
        seeds = [s.numpy() for s in stage._seeds]  # the same dropout mask for both
        moments = [v.numpy() for v in stage.state_variables]
        outputs, var_grads, in_grads = forward_backward(stage, [h])
        got.append(values([*outputs, *var_grads, *in_grads]))
        for state, value in zip(stage._seeds + stage.state_variables, seeds + moments, strict=True):
            state.assign(value)
    assert all(np.array_equal(a, b) for a, b in zip(*got, strict=True))


@pytest.mark.parametrize("recompute", [False, True])
def test_stage_0_returns_no_input_gradients(recompute: bool) -> None:
    model, graph, x = setup(rate=0.0)
    stage = Stage(graph.stage(0, 1), 0, recompute)
    _, var_grads, in_grads = forward_backward(stage, [x])
    with tf.GradientTape() as tape:
        out = model.a(x)
    want = tape.gradient(out, stage.variables, output_gradients=upstream(tuple(out.shape)))
    assert in_grads == []
    assert_all_close(var_grads, want)


@pytest.mark.parametrize("recompute", [False, True])
def test_integer_stage_inputs_get_no_gradient(recompute: bool) -> None:
    keras.utils.set_random_seed(0)
    model = Scaled()
    x, n = tf.ones((3, 5)), tf.constant([[1], [2], [3]], tf.int32)
    graph = trace(model, [x, n])
    sub = graph.stage(1, len(graph))
    assert [graph.tensors[t].dtype for t in sub.inputs] == ["int32", "float32"]  # n, then h
    stage = Stage(sub, 1, recompute)
    h = model.a(x)
    _, var_grads, in_grads = forward_backward(stage, [n, h])
    with tf.GradientTape() as tape:
        tape.watch(h)
        out = model.b(h) * tf.cast(n, tf.float32)
    want = tape.gradient(out, [*stage.variables, h], output_gradients=upstream((3, 2)))
    assert len(in_grads) == 1  # for h only
    assert_all_close(var_grads, want[:2])
    assert_all_close(in_grads, want[2:])


def test_memory_mode_keeps_only_the_inputs_and_the_seeds() -> None:
    model, graph, x = setup(rate=0.5)
    sub = graph.stage(1, 4)
    h = model.a(x)
    _, saved = Stage(sub, 1, recompute=True).forward([h], training=True, keep=True)
    assert saved is not None
    assert (saved.tape, saved.outputs) == (None, None)
    assert saved.inputs == [h]
    assert saved.seeds is not None and len(saved.seeds) == len(sub.seed_states()) == 1
    _, kept = Stage(sub, 1, recompute=False).forward([h], training=True, keep=True)
    assert kept is not None and kept.tape is not None and kept.seeds is None
    assert Stage(sub, 1, recompute=True).forward([h], training=True, keep=False)[1] is None


def test_recompute_replays_the_forwards_dropout_mask() -> None:
    model, graph, x = setup(rate=0.5)
    sub = graph.stage(1, 4)
    seeds = sub.seed_states()
    start = values(seeds)
    h = model.a(x)

    speed = forward_backward(Stage(sub, 1, recompute=False), [h])
    seeds_after = values(seeds)
    for seed, value in zip(seeds, start, strict=True):
        seed.assign(value)
    memory = forward_backward(Stage(sub, 1, recompute=True), [h])

    for got, want in zip(memory, speed, strict=True):
        assert_all_close(got, want)
    assert_all_close(values(seeds), seeds_after)  # the random stream moved on once, as in speed
    # without rewinding the seeds the next forward draws another mask: the check above can fail
    again, _ = Stage(sub, 1, recompute=False).forward([h], training=True, keep=False)
    assert not np.allclose(again[0].numpy(), speed[0][0].numpy())


def test_recompute_updates_batchnorm_statistics_once() -> None:
    model, graph, x = setup(rate=0.0)
    sub = graph.stage(1, 4)
    stats = [model.bn.moving_mean, model.bn.moving_variance]
    start = values(stats)
    h = model.a(x)
    batch = model.b(h)

    forward_backward(Stage(sub, 1, recompute=False), [h])
    after_speed = values(stats)
    for var, value in zip(stats, start, strict=True):
        var.assign(value)
    forward_backward(Stage(sub, 1, recompute=True), [h])

    assert_all_close(values(stats), after_speed)
    momentum = model.bn.momentum
    mean, variance = tf.nn.moments(batch, axes=[0])
    # one update from the initial (0, 1): a second one would move them further
    assert_all_close(after_speed, [(1 - momentum) * mean, momentum + (1 - momentum) * variance])


def test_accumulate_starts_with_the_first_gradients_then_adds() -> None:
    _, graph, _ = setup(rate=0.0)
    stage = Stage(graph.stage(0, 1), 0, recompute=False)
    first = [tf.constant([1.0, 2.0]), tf.constant(3.0)]
    assert stage.accumulate(None, first) is first
    total = stage.accumulate(first, [tf.constant([10.0, 20.0]), tf.constant(30.0)])
    assert_all_close(total, [[11.0, 22.0], 33.0])


def test_microbatch_seconds_times_a_stages_forward_backward_and_sum(monkeypatch: Any) -> None:
    from tfsift.pipeline import stage as stage_module

    calls: list[str] = []
    for name in ("forward", "backward", "accumulate"):
        method = getattr(Stage, name)
        monkeypatch.setattr(
            Stage,
            name,
            lambda self, *a, _m=method, _n=name, **k: calls.append(_n) or _m(self, *a, **k),
        )
    x = tf.constant(np.random.default_rng(0).normal(size=(4, 4)), tf.float32)
    graph = trace(Net(0.0), [x])
    (seconds,) = stage_module.microbatch_seconds(graph, [x], repeats=2)
    assert seconds > 0
    # one forward for the activations' shapes, then a warm-up and 20 timed microbatches
    assert calls == ["forward"] + ["forward", "backward", "accumulate"] * 21
    calls.clear()
    prefixes = stage_module.microbatch_seconds(graph, [x], repeats=2, ends=[1, len(graph)])
    assert len(prefixes) == 2 and all(t > 0 for t in prefixes)
    # each prefix's stage is made and traced first, then they run in turn, round by round
    assert calls == ["forward"] * 2 + ["forward", "backward", "accumulate"] * 2 * 21


def test_microbatch_seconds_times_an_example_holding_a_nan() -> None:
    from tfsift.pipeline import stage as stage_module

    x = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    x[1, 2] = np.nan  # the profiler's example is the first batch: a NaN there must pass
    graph = trace(Net(0.0), [tf.constant(x)])
    (seconds,) = stage_module.microbatch_seconds(graph, [tf.constant(x)], repeats=2)
    assert seconds > 0


def test_profiling_through_the_stage_leaves_every_variable_as_it_was() -> None:
    from tfsift.pipeline.stage import microbatch_seconds
    from tfsift.planning.profiler import profile, recomputing_is_faster
    from tfsift.state import STATE

    model = Net(0.5)
    x = tf.constant(np.random.default_rng(1).normal(3.0, 2.0, (8, 4)), tf.float32)
    graph = trace(model, [x])
    before = {v.path: v.numpy() for v in model.variables}
    costs = profile(graph, [x], repeats=2, stage_call=microbatch_seconds)
    recomputing_is_faster(graph, [x], 2, microbatch_seconds)  # times the recomputing path
    for v in model.variables:  # BatchNorm's moving statistics, the dropout seed, weights
        np.testing.assert_array_equal(v.numpy(), before[v.path])
    assert costs.action_overhead > 0
    assert STATE.profiles  # both paths were timed, not skipped
    assert sum(key.endswith("+microbatch+recompute") for key in STATE.profiles) == 1


@pytest.mark.parametrize("recompute", [False, True])
def test_a_backward_adds_its_gradients_to_a_given_total(
    recompute: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, graph, x = setup(rate=0.0)
    stage = Stage(graph.stage(0, 4), 0, recompute)
    sums: list[int] = []
    monkeypatch.setattr(
        stage, "accumulate", lambda *a: sums.append(1) or Stage.accumulate(stage, *a)
    )
    outputs, var_grads, _ = forward_backward(stage, [x])
    total = [tf.fill(g.shape, 1.5) for g in var_grads]
    _, saved = stage.forward([x], training=True, keep=True)
    assert saved is not None
    added, _ = stage.backward(saved, [upstream(tuple(outputs[0].shape))], total)
    assert_all_close(added, [g.numpy() + 1.5 for g in var_grads])
    # recomputing, the sum is made inside the backward's own compiled call
    assert len(sums) == (0 if recompute else 2)
