"""tfsift.planning.profiler: which input gradients a step computes, and the cost model it emits."""

from __future__ import annotations

from typing import Any

import keras
import pytest
import tensorflow as tf

from tfsift.planning.graph import trace
from tfsift.planning.profiler import needs_input_gradients, profile


class Scaled(keras.Model):  # type: ignore[misc]
    """Weight-free ops before the first Dense, then a skip connection around the second."""

    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(6)
        self.b = keras.layers.Dense(6)

    def call(self, x: Any) -> Any:
        h = self.a(keras.ops.multiply(keras.ops.reshape(x, (-1, 6)), 2.0))
        return keras.ops.add(self.b(h), h)


def test_only_nodes_downstream_of_a_weight_need_their_input_gradient() -> None:
    graph = trace(Scaled(), [tf.zeros((2, 3, 2))])
    names = [type(gn.operation).__name__ for gn in graph.nodes]
    assert names == ["Reshape", "Multiply", "Dense", "Dense", "Add"]
    assert needs_input_gradients(graph) == [False, False, False, True, True]


def test_weight_free_nodes_before_the_first_weight_cost_no_backward() -> None:
    graph = trace(Scaled(), [tf.zeros((2, 3, 2))])
    costs = profile(graph, [tf.ones((4, 3, 2))], repeats=3)
    backward = [layer.backward_time for layer in costs.layers]
    assert backward[:2] == [0.0, 0.0]  # nothing to differentiate: no weights, no input grad
    assert costs.batch_size == 4


def test_profiling_leaves_batchnorm_statistics_and_seeds_unchanged() -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    from tfsift.planning.graph import trace
    from tfsift.planning.profiler import profile

    class Net(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.bn = keras.layers.BatchNormalization()
            self.drop = keras.layers.Dropout(0.5, seed=1)
            self.out = keras.layers.Dense(2)

        def call(self, x: tf.Tensor) -> tf.Tensor:
            return self.out(self.drop(self.bn(x)))

    model = Net()
    x = tf.constant(np.random.default_rng(0).normal(3.0, 2.0, (8, 4)), tf.float32)
    graph = trace(model, [x])
    before = {v.path: v.numpy() for v in model.variables}
    profile(graph, [x], repeats=2)
    for v in model.variables:
        np.testing.assert_array_equal(v.numpy(), before[v.path])  # moving mean/var, seeds


class Wider(Scaled):
    """Scaled with a wider second Dense: the same operations, other weights."""

    def __init__(self) -> None:
        super().__init__()
        self.b = keras.layers.Dense(6, use_bias=False)


def test_a_model_of_the_same_layers_gets_the_profile_again_under_its_own_names(
    monkeypatch: Any,
) -> None:
    from tfsift.planning import profiler

    first = profile(trace(Scaled(), [tf.zeros((2, 3, 2))]), [tf.ones((4, 3, 2))], repeats=3)
    runs: list[int] = []
    monkeypatch.setattr(profiler, "_profile", lambda *args: runs.append(1) or first)
    graph = trace(Scaled(), [tf.zeros((2, 3, 2))])
    again = profile(graph, [tf.ones((4, 3, 2))], repeats=3)
    assert runs == []  # nothing timed again
    assert [c.name for c in again.layers] == [gn.name for gn in graph.nodes]
    assert [c.name for c in again.layers] != [c.name for c in first.layers]
    assert [c.forward_time for c in again.layers] == [c.forward_time for c in first.layers]
    # another batch size, other repeats, other weights: each timed anew
    profile(graph, [tf.ones((8, 3, 2))], repeats=3)
    profile(graph, [tf.ones((4, 3, 2))], repeats=2)
    profile(trace(Wider(), [tf.zeros((2, 3, 2))]), [tf.ones((4, 3, 2))], repeats=3)
    assert runs == [1, 1, 1]


def _whole(costs: Any) -> float:
    return float(costs.prefix.compute[-1])


def test_a_small_model_is_charged_what_the_runtimes_stage_takes_beyond_its_layers(
    monkeypatch: Any,
) -> None:
    from tfsift.planning import profiler

    graph = trace(Scaled(), [tf.zeros((2, 3, 2))])
    bare = profile(graph, [tf.ones((4, 3, 2))], repeats=3)
    monkeypatch.setattr(profiler, "_profile", lambda *args: bare)  # the same layer times
    calls: list[int] = []

    def stage(g: Any, example: Any, repeats: int, recompute: bool) -> float:
        calls.append(repeats)
        again = float(bare.prefix.forward[-1]) if recompute else 0.0  # the forward twice
        return _whole(bare) + again + 2 * (bare.action_overhead + 1e-3)  # 1 ms more per action

    costs = profile(graph, [tf.ones((4, 3, 2))], repeats=3, stage_call=stage)
    assert calls == [3]
    assert costs.action_overhead == pytest.approx(bare.action_overhead + 1e-3)
    assert costs.layers == bare.layers
    # optimize="memory": the stage's path recomputes, and the charge leaves that forward out
    recomputing = profile(graph, [tf.ones((4, 3, 2))], repeats=4, stage_call=stage, recompute=True)
    assert calls == [3, 4]
    assert recomputing.action_overhead == pytest.approx(bare.action_overhead + 1e-3)


@pytest.mark.parametrize("recompute", [False, True])
def test_a_stage_faster_than_its_layers_times_scales_them_to_predict_its_microbatch(
    monkeypatch: Any, recompute: bool
) -> None:
    from tfsift.planning import profiler

    graph = trace(Scaled(), [tf.zeros((2, 3, 2))])
    bare = profile(graph, [tf.ones((4, 3, 2))], repeats=3)
    monkeypatch.setattr(profiler, "_profile", lambda *args: bare)
    forward = float(bare.prefix.forward[-1])
    layers = _whole(bare) + recompute * forward  # what the layers' times add up to
    timed = 2 * bare.action_overhead + 0.6 * layers  # one compiled call did them in 60%

    costs = profile(graph, [tf.ones((4, 3, 2))], 3, lambda *a: timed, recompute=recompute)
    assert costs.action_overhead == bare.action_overhead
    for got, was in zip(costs.layers, bare.layers, strict=True):
        assert got.forward_time == pytest.approx(0.6 * was.forward_time)
        assert got.backward_time == pytest.approx(0.6 * was.backward_time)
        assert got.activation_bytes == was.activation_bytes
    again = recompute * float(costs.prefix.forward[-1])
    assert _whole(costs) + again + 2 * costs.action_overhead == pytest.approx(timed)


@pytest.mark.parametrize(("recomputing", "faster"), [(0.97, True), (0.99, False), (1.1, False)])
def test_recomputing_is_faster_when_its_microbatch_took_2_percent_less_timed_once_per_path(
    monkeypatch: Any, recomputing: float, faster: bool
) -> None:
    from tfsift.planning import profiler

    graph, example = trace(Scaled(), [tf.zeros((2, 3, 2))]), [tf.ones((4, 3, 2))]
    calls: list[bool] = []

    def stage(g: Any, example: Any, repeats: int, recompute: bool) -> float:
        calls.append(recompute)  # the tape's microbatch 10 ms
        return 0.01 * recomputing if recompute else 0.01

    assert not profiler.recomputing_is_faster(graph, example, 3, stage)  # not profiled yet
    bare = profile(graph, example, repeats=3)
    assert profiler.small(bare)  # a stage this small is timed
    profile(graph, example, repeats=3, stage_call=stage)
    assert profiler.recomputing_is_faster(graph, example, 3, stage) == faster
    assert profiler.recomputing_is_faster(graph, example, 3, stage) == faster
    assert calls == [False, True]
    monkeypatch.setattr(profiler, "CALIBRATE_BELOW", 0)  # as if its layers computed for long
    assert not profiler.recomputing_is_faster(graph, example, 3, stage)


def test_the_bare_stages_cost_stays_when_the_runtimes_is_less_or_cannot_be_timed(
    caplog: Any,
) -> None:
    graph = trace(Scaled(), [tf.zeros((2, 3, 2))])
    cheaper = profile(graph, [tf.ones((4, 3, 2))], repeats=2, stage_call=lambda *a: 0.0)
    assert cheaper.action_overhead > 0  # the bare stage's, not a negative difference

    def broken(*args: Any) -> float:
        raise RuntimeError("no stage here")

    with caplog.at_level("WARNING", logger="tfsift"):
        failed = profile(graph, [tf.ones((5, 3, 2))], repeats=2, stage_call=broken)
    assert failed.action_overhead > 0
    assert (
        "could not time a microbatch through the runtime's stage (RuntimeError: no stage here)"
        in (caplog.text)
    )


def test_a_model_that_computes_long_is_not_run_again(monkeypatch: Any) -> None:
    from tfsift.planning import profiler

    monkeypatch.setattr(profiler, "CALIBRATE_BELOW", 0)  # every model counts as long
    graph = trace(Scaled(), [tf.zeros((2, 3, 2))])
    calls: list[int] = []
    profile(graph, [tf.ones((6, 3, 2))], repeats=2, stage_call=lambda *a: calls.append(1) or 1.0)
    assert calls == []
