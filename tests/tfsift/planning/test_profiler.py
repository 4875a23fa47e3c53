"""tfsift.planning.profiler: which input gradients a step computes, and the cost model it emits."""

from __future__ import annotations

from typing import Any

import keras
import pytest
import tensorflow as tf

from partitioner.costs import CostModel, LayerCost
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


@pytest.mark.parametrize(("recompute", "scale"), [(False, 0.6), (True, 0.6), (False, 1.7)])
def test_the_cost_per_action_and_the_layers_times_are_the_line_through_the_timed_prefixes(
    monkeypatch: Any, recompute: bool, scale: float
) -> None:
    from tfsift.planning import profiler

    graph = trace(Scaled(), [tf.zeros((2, 3, 2))])
    bare = profile(graph, [tf.ones((4, 3, 2))], repeats=3)
    monkeypatch.setattr(profiler, "_profile", lambda *args: bare)  # the same layer times
    layers = bare.prefix.compute + recompute * bare.prefix.forward  # each prefix's, as profiled
    calls: list[tuple[int, bool, tuple[int, ...]]] = []

    def stage(g: Any, example: Any, repeats: int, again: bool, ends: Any) -> list[float]:
        calls.append((repeats, again, tuple(ends)))
        # 0.4 ms per action, and one compiled call runs the layers in `scale` of their times
        return [2 * 4e-4 + scale * float(layers[e]) for e in ends]

    costs = profile(graph, [tf.ones((4, 3, 2))], 3, stage, recompute=recompute)
    ((repeats, again, ends),) = calls
    assert (repeats, again) == (3, recompute)
    assert ends[-1] == len(graph) and len(ends) >= 2  # the whole model and a shorter prefix
    assert list(ends) == sorted(set(ends))
    assert costs.action_overhead == pytest.approx(4e-4)
    for got, was in zip(costs.layers, bare.layers, strict=True):
        assert got.forward_time == pytest.approx(scale * was.forward_time)
        assert got.backward_time == pytest.approx(scale * was.backward_time)
        assert got.activation_bytes == was.activation_bytes


def test_the_prefixes_spread_over_the_profiled_time_up_to_calibrate_points(
    monkeypatch: Any,
) -> None:
    from tfsift.planning import profiler

    def chain(n: int) -> CostModel:  # 0.3 ms a layer, its forward 0.1 ms
        return CostModel(tuple(LayerCost(f"l{i}", 1e-4, 2e-4, 0, 0, 0) for i in range(n)))

    assert profiler._points(chain(12), False)[0] == (1, 12)  # the first node and the whole
    monkeypatch.setattr(profiler, "CALIBRATE_POINTS", 5)
    # at 0.3, 1.125, 1.95, 2.775 and 3.6 ms: the first prefix that reaches each
    assert profiler._points(chain(12), False)[0] == (1, 4, 7, 10, 12)
    ends, profiled = profiler._points(chain(12), True)  # 0.4 ms a layer, the forward twice
    assert ends == (1, 4, 7, 10, 12)
    assert profiled.tolist() == pytest.approx([4e-4 * e for e in ends])
    assert profiler._points(chain(2), False)[0] == (1, 2)


@pytest.mark.parametrize(("recomputing", "faster"), [(0.97, True), (0.99, False), (1.1, False)])
def test_recomputing_is_faster_when_its_microbatch_took_2_percent_less_timed_once_per_path(
    monkeypatch: Any, recomputing: float, faster: bool
) -> None:
    from tfsift.planning import profiler

    graph, example = trace(Scaled(), [tf.zeros((2, 3, 2))]), [tf.ones((4, 3, 2))]
    calls: list[tuple[bool, tuple[int, ...]]] = []

    def stage(g: Any, example: Any, repeats: int, recompute: bool, ends: Any) -> list[float]:
        calls.append((recompute, tuple(ends)))  # the tape's microbatch 10 ms
        return [0.01 * recomputing if recompute else 0.01] * len(ends)

    assert not profiler.recomputing_is_faster(graph, example, 3, stage)  # not profiled yet
    bare = profile(graph, example, repeats=3)
    assert profiler.small(bare)  # a stage this small is timed
    assert profiler.recomputing_is_faster(graph, example, 3, stage) == faster
    assert profiler.recomputing_is_faster(graph, example, 3, stage) == faster
    L = len(graph)
    assert calls == [(False, (L,)), (True, (L,))]  # each path's whole model, once
    # the chosen path's calibration times only its shorter prefixes: the whole one is known
    profile(graph, example, repeats=3, stage_call=stage, recompute=faster)
    ends = profiler._points(bare, faster)[0]
    assert calls[2:] == [(faster, ends[:-1])] and ends[-1] == L
    monkeypatch.setattr(profiler, "CALIBRATE_BELOW", 0)  # as if its layers computed for long
    assert not profiler.recomputing_is_faster(graph, example, 3, stage)


def test_the_bare_stages_cost_stays_when_the_runtimes_is_less_or_cannot_be_timed(
    caplog: Any,
) -> None:
    graph = trace(Scaled(), [tf.zeros((2, 3, 2))])

    def no_time(g: Any, example: Any, repeats: int, recompute: bool, ends: Any) -> list[float]:
        return [0.0] * len(ends)

    cheaper = profile(graph, [tf.ones((4, 3, 2))], repeats=2, stage_call=no_time)
    assert cheaper.action_overhead > 0  # the bare stage's, not a line through zero

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
