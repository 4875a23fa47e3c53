"""A stage's backward split into B and W gives the fused backward's gradients, and each
half runs only its own kernels."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

from tfsift.pipeline.split import SplitBackward
from tfsift.pipeline.stage import Stage
from tfsift.planning.graph import Graph, trace


class Chain(keras.Model):  # type: ignore[misc]
    """Conv2D + relu blocks, as the benchmark's chain, with a skip over the middle two."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = [
            keras.layers.Conv2D(4, 3, padding="same", activation="relu") for _ in range(4)
        ]

    def call(self, x: Any) -> Any:
        h = self.convs[0](x)
        return self.convs[3](keras.ops.add(h, self.convs[2](self.convs[1](h))))


class Mixed(keras.Model):  # type: ignore[misc]
    """BatchNormalization, dropout, a layer called twice (tied) and an integer input."""

    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(6, activation="tanh")
        self.b = keras.layers.Dense(6)
        self.bn = keras.layers.BatchNormalization()
        self.drop = keras.layers.Dropout(0.5, seed=3)
        self.c = keras.layers.Dense(3)

    def call(self, x: Any, n: Any) -> Any:
        h = self.drop(self.bn(self.b(self.a(x))))
        h = self.b(keras.ops.tanh(h))  # b again: its gradients add up
        return keras.ops.multiply(self.c(h), keras.ops.cast(n, "float32"))


def upstream(shape: tuple[int, ...], seed: int = 2) -> tf.Tensor:
    return tf.constant(np.random.default_rng(seed).normal(size=shape), tf.float32)


def fused(stage: Stage, inputs: list[tf.Tensor], grads: list[tf.Tensor]) -> list[np.ndarray]:
    outputs, saved = stage.forward(inputs, training=True, keep=True)
    assert saved is not None
    var_grads, in_grads = stage.backward(saved, grads)
    return [t.numpy() for t in [*outputs, *var_grads, *in_grads]]


def split(stage: Stage, inputs: list[tf.Tensor], grads: list[tf.Tensor]) -> list[np.ndarray]:
    halves = SplitBackward(stage)
    outputs, kept = halves.forward(inputs, training=True)
    in_grads, pending = halves.backward_input(kept, grads)
    var_grads = halves.backward_weights(pending, None)
    return [t.numpy() for t in [*outputs, *var_grads, *in_grads]]


def conv_stage() -> tuple[Stage, list[tf.Tensor], list[tf.Tensor]]:
    keras.utils.set_random_seed(0)
    model = Chain()
    x = upstream((2, 6, 6, 3), seed=1)
    graph = trace(model, [x])
    stage = Stage(graph.stage(1, len(graph)), 1, recompute=False)
    h = model.convs[0](x)
    return stage, [h], [upstream((2, 6, 6, 4))]


def test_b_then_w_equal_the_fused_backward_bitwise() -> None:
    stage, inputs, grads = conv_stage()
    want = fused(stage, inputs, grads)
    got = split(stage, inputs, grads)
    assert len(got) == len(want) == 1 + 6 + 1  # outputs, 3 layers' kernel and bias, input
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def mixed_stage() -> tuple[Mixed, Graph, Stage, list[tf.Tensor]]:
    keras.utils.set_random_seed(0)
    model = Mixed()
    x, n = upstream((4, 5), seed=1), tf.constant([[1], [2], [3], [4]], tf.int32)
    graph = trace(model, [x, n])
    stage = Stage(graph.stage(1, len(graph)), 1, recompute=False)
    return model, graph, stage, [n, model.a(x)]


def test_batchnorm_dropout_tied_weights_and_integer_inputs() -> None:
    model, _, stage, inputs = mixed_stage()
    state = [*stage.state_variables, *(s for s in stage._seeds)]
    start = [v.numpy() for v in state]
    want = fused(stage, inputs, [upstream((4, 3))])
    after = [v.numpy() for v in state]
    for v, value in zip(state, start, strict=True):
        v.assign(value)
    got = split(stage, inputs, [upstream((4, 3))])
    assert len(got) == 1 + len(stage.variables) + 1  # the integer input gets no gradient
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    # the forward updated the statistics and the dropout seed once, as the fused one did
    for v, value in zip(state, after, strict=True):
        np.testing.assert_array_equal(v.numpy(), value)
    assert model.b.kernel.path in [v.path for v in stage.variables]


def test_the_gradients_add_to_a_running_sum() -> None:
    stage, inputs, grads = conv_stage()
    halves = SplitBackward(stage)
    total = [tf.ones(tuple(v.shape)) for v in stage.variables]
    _, kept = halves.forward(inputs, training=True)
    _, pending = halves.backward_input(kept, grads)
    summed = halves.backward_weights(pending, total)
    alone = halves.backward_weights(pending, None)
    for s, a in zip(summed, alone, strict=True):
        np.testing.assert_array_equal(s.numpy(), a.numpy() + 1.0)


def kernels(fn: Callable[[], Any]) -> Counter[str]:
    """The convolution kernels that ran in ``fn``'s compiled calls (after TensorFlow's
    inlining and pruning), by their default names (``default_names``)."""
    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        fn()
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    return Counter(
        name
        for graph in metadata.function_graphs
        for partition in graph.partition_graphs
        for node in partition.node
        if "Conv2D" in node.op or node.op == "BiasAddGrad"
        for name in default_names(node.op)
    )


def default_names(op: str) -> list[str]:
    """The default CPU kernels that ``op`` stands for. On a CPU with AVX-512 VNNI or BF16,
    TensorFlow runs oneDNN's kernels by default: ``_MklNativeFusedConv2D`` for
    ``_FusedConv2D``, and one kernel for a filter's and a bias' gradients together."""
    name = op.removeprefix("_MklNative").removeprefix("_")
    if name == "Conv2DBackpropFilterWithBias":
        return ["Conv2DBackpropFilter", "BiasAddGrad"]
    return [name]


def test_b_runs_only_input_gradient_kernels_and_w_only_weight_ones() -> None:
    stage, inputs, grads = conv_stage()
    halves = SplitBackward(stage)
    # each first call traces, and the run metadata lists a function's graphs when it is made
    found: dict[str, Any] = {}

    def forward() -> None:
        found["kept"] = halves.forward(inputs, training=True)[1]

    def backward_input() -> None:
        found["pending"] = halves.backward_input(found["kept"], grads)[1]

    ran = {
        "F": kernels(forward),
        "B": kernels(backward_input),
        "W": kernels(lambda: halves.backward_weights(found["pending"], None)),
    }
    assert ran == {
        "F": Counter({"FusedConv2D": 3}),
        "B": Counter({"Conv2DBackpropInput": 3}),
        "W": Counter({"Conv2DBackpropFilter": 3, "BiasAddGrad": 3}),
    }
