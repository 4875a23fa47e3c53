"""The last stage's head: stage forward, step function and backward in one call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfsift
from tfsift.pipeline.compiled import Compiled
from tfsift.pipeline.context import StepFunctionError
from tfsift.pipeline.head import GRADS_MARKER, Head, HeadResult
from tfsift.pipeline.outputs import StepGradients
from tfsift.pipeline.stage import Stage
from tfsift.planning.graph import Graph, trace

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Mlp(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(6, activation="tanh")
        self.b = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


def batch(n: int = 8) -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(0)
    return tf.constant(rng.normal(size=(n, 4)), tf.float32), tf.constant(rng.integers(0, 3, n))


def setup() -> tuple[Mlp, Graph, tf.Tensor, tf.Tensor]:
    keras.utils.set_random_seed(0)
    model, (x, y) = Mlp(), batch()
    return model, trace(model, [x]), x, y


def whole(graph: Graph) -> Stage:
    """The only stage of a pipeline of K = 1."""
    return Stage(graph.stage(0, len(graph)), 0, recompute=False)


def head(
    stage: Stage,
    graph: Graph,
    fn: Callable[..., Any],
    backward: bool = True,
    compile: bool = True,
) -> Head:
    return Head(stage, fn, graph.structure, backward, training=backward, compile=compile)


def train_fn(model: Mlp, variables: list[Any]) -> Callable[..., Any]:
    """The README's training step; ``variables`` stands for ``model.trainable_variables``."""

    def train(x: tf.Tensor, y: tf.Tensor) -> Any:
        loss = LOSS(y, model(x, training=True))
        return tfsift.gradients(loss, variables), loss

    return train


def eager_only_train(model: Mlp, variables: list[Any], seen: list[float]) -> Callable[..., Any]:
    """A training step that cannot be traced (it calls ``.numpy()``); appends each loss."""

    def train(x: tf.Tensor, y: tf.Tensor) -> Any:
        loss = LOSS(y, model(x, training=True))
        seen.append(float(loss.numpy()))  # only an eager tensor has .numpy()
        return tfsift.gradients(loss, variables), loss

    return train


def reference(model: Mlp, x: tf.Tensor, y: tf.Tensor) -> tuple[float, list[np.ndarray]]:
    with tf.GradientTape() as tape:
        loss = LOSS(y, model.b(model.a(x)))
    return float(loss), [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def assert_all_close(got: Any, want: Any) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("compile", [True, False])
def test_a_k1_head_gives_the_loss_and_gradients_of_a_plain_tape(compile: bool) -> None:
    model, graph, x, y = setup()
    stage = whole(graph)
    run = head(stage, graph, train_fn(model, stage.variables), compile=compile)
    done = run([], ((x, y), {}), None)
    assert isinstance(done, HeadResult)
    marker, loss = done.results
    want_loss, want_grads = reference(model, x, y)
    assert marker == GRADS_MARKER  # the step puts the GradientOutputs here
    assert float(loss) == pytest.approx(want_loss, rel=1e-6)
    assert done.grad_sum is not None
    assert_all_close(done.grad_sum, want_grads)
    assert done.in_grads == []  # stage 0: nobody needs the model input's gradient
    assert run.compiled is compile


def test_a_forward_only_head_returns_results_and_no_gradients() -> None:
    model, graph, x, _ = setup()

    def evaluate(images: tf.Tensor) -> Any:
        return {"logits": model(images, training=False), "name": "eval"}

    done = head(whole(graph), graph, evaluate, backward=False)([], ((x,), {}), None)
    assert done.results["name"] == "eval"
    assert_all_close(done.results["logits"], model.b(model.a(x)))
    assert done.grad_sum is None and done.in_grads == []


def test_the_last_stage_of_two_returns_its_input_gradients() -> None:
    model, graph, x, y = setup()
    stage = Stage(graph.stage(1, 2), 1, recompute=False)
    h = model.a(x)
    done = head(stage, graph, train_fn(model, stage.variables))([h], ((x, y), {}), None)
    with tf.GradientTape() as tape:
        tape.watch(h)
        loss = LOSS(y, model.b(h))
    want = tape.gradient(loss, [*stage.variables, h])
    assert done.grad_sum is not None
    assert_all_close(done.grad_sum, want[:2])
    assert_all_close(done.in_grads, want[2:])


@pytest.mark.parametrize("compile", [True, False])
def test_a_given_gradient_sum_is_added_to(compile: bool) -> None:
    model, graph, x, y = setup()
    stage = whole(graph)
    run = head(stage, graph, train_fn(model, stage.variables), compile=compile)
    previous = [tf.fill(v.shape, float(i + 1)) for i, v in enumerate(stage.variables)]
    done = run([], ((x, y), {}), previous)
    _, grads = reference(model, x, y)
    assert done.grad_sum is not None
    assert_all_close(done.grad_sum, [g + p.numpy() for g, p in zip(grads, previous, strict=True)])
    again = run([], ((x, y), {}), done.grad_sum)
    assert again.grad_sum is not None
    assert_all_close(
        again.grad_sum, [2 * g + p.numpy() for g, p in zip(grads, previous, strict=True)]
    )


@pytest.mark.parametrize("compile", [True, False])
@pytest.mark.parametrize("calls", [0, 2])
def test_a_training_step_must_ask_for_gradients_exactly_once(compile: bool, calls: int) -> None:
    model, graph, x, y = setup()
    stage = whole(graph)

    def train(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = LOSS(labels, model(images, training=True))
        return [tfsift.gradients(loss, stage.variables) for _ in range(calls)], loss

    run = head(stage, graph, train, compile=compile)
    with pytest.raises(StepFunctionError) as err:
        run([], ((x, y), {}), None)
    assert str(err.value) == (
        f"a training step must call tfsift.gradients exactly once per call. Received: {calls} calls"
    )
    assert run.compiled is compile  # a broken rule is raised, not retried eagerly


@pytest.mark.parametrize("compile", [True, False])
def test_gradients_of_other_variables_are_refused(compile: bool) -> None:
    model, graph, x, y = setup()
    stage = whole(graph)
    wrong = [stage.variables[1], stage.variables[0], *stage.variables[2:]]  # same set, reordered
    run = head(stage, graph, train_fn(model, wrong), compile=compile)
    with pytest.raises(StepFunctionError) as err:
        run([], ((x, y), {}), None)
    kernel, bias = stage.variables[0].path, stage.variables[1].path
    assert str(err.value) == (
        "tfsift.gradients must be called with model.trainable_variables (this rank's stage "
        "variables, 4 of them). Received: a list of 4 variables, the same number but not the "
        f"same variables in the same order (first difference at position 0: {bias!r} where "
        f"{kernel!r} was expected)"
    )


def test_a_function_that_cannot_be_traced_runs_eagerly_after_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model, graph, x, y = setup()
    stage = whole(graph)
    seen: list[float] = []
    train = eager_only_train(model, stage.variables, seen)

    run = head(stage, graph, train)
    with caplog.at_level("WARNING", logger="tfsift"):
        first = run([], ((x, y), {}), None)
        run([], ((x, y), {}), None)
    assert [(r.name, r.levelname) for r in caplog.records] == [("tfsift", "WARNING")]
    assert (
        caplog.records[0]
        .getMessage()
        .startswith("the @tfsift.step function could not be compiled with tf.function (")
    )
    assert run.compiled is False
    want_loss, want_grads = reference(model, x, y)
    assert seen == pytest.approx([want_loss, want_loss], rel=1e-6)  # ran eagerly, twice
    assert first.grad_sum is not None
    assert_all_close(first.grad_sum, want_grads)


def test_a_function_that_compiled_once_is_not_demoted_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model, graph, x, y = setup()
    stage = whole(graph)

    def train(images: tf.Tensor, labels: tf.Tensor, fail: bool) -> Any:
        loss = LOSS(labels, model(images, training=True))
        if fail:  # a Python value: traced again when it changes
            loss.numpy()
        return tfsift.gradients(loss, stage.variables), loss

    run = head(stage, graph, train)
    run([], ((x, y, False), {}), None)
    with caplog.at_level("WARNING", logger="tfsift"), pytest.raises(AttributeError):
        run([], ((x, y, True), {}), None)
    assert caplog.records == [] and run.compiled is True


@pytest.mark.parametrize("compile", [True, False])
def test_a_step_whose_return_structure_changes_is_refused(compile: bool) -> None:
    model, graph, x, y = setup()
    stage = whole(graph)

    def train(images: tf.Tensor, labels: tf.Tensor) -> Any:
        logits = model(images, training=True)
        loss = LOSS(labels, logits)
        grads = tfsift.gradients(loss, stage.variables)
        return (grads, loss, logits) if images.shape[0] == 4 else (grads, loss)

    run = head(stage, graph, train, compile=compile)
    run([], ((x[:4], y[:4]), {}), None)
    with pytest.raises(StepFunctionError) as err:
        run([], ((x[:2], y[:2]), {}), None)
    assert str(err.value) == (
        "a @tfsift.step function must return the same structure on every call. "
        "Received: 1 tensors among 2 values, after 2 among 3"
    )


def test_python_values_returned_by_an_earlier_trace_come_back_unchanged() -> None:
    model, graph, x, _ = setup()

    def evaluate(images: tf.Tensor, tag: str) -> Any:
        return {"logits": model(images, training=False), "tag": tag}

    run = head(whole(graph), graph, evaluate, backward=False)
    tags = [run([], ((x, tag), {}), None).results["tag"] for tag in ["a", "b", "a"]]
    assert tags == ["a", "b", "a"]


def microbatches(x: tf.Tensor, y: tf.Tensor, M: int) -> list[Any]:
    return [((a, b), {}) for a, b in zip(tf.split(x, M), tf.split(y, M), strict=True)]


def test_a_lone_stage_runs_all_its_microbatches_in_one_compiled_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, graph, x, y = setup()
    stage = whole(graph)
    run = head(stage, graph, train_fn(model, stage.variables))
    calls = []
    monkeypatch.setattr(
        run._call, "call_keyed", lambda *a: calls.append(a) or Compiled.call_keyed(run._call, *a)
    )
    done = run.run_all(microbatches(x, y, 4))
    assert done is not None and len(calls) == 1
    wants = [reference(model, a, b) for (a, b), _ in microbatches(x, y, 4)]
    assert [r[0] for r in done.results] == [GRADS_MARKER] * 4
    assert [float(r[1]) for r in done.results] == pytest.approx([w[0] for w in wants], rel=1e-6)
    assert done.grad_sum is not None and done.grad_mean is not None
    assert_all_close(done.grad_sum, [sum(w[1][i] for w in wants) for i in range(4)])
    # the mean comes out of the same call, bitwise what accumulate() computes from the sum
    means = StepGradients(done.grad_sum, 4).outputs
    for got, want in zip(done.grad_mean, means, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.accumulate().numpy())
    one = run.run_all(microbatches(x, y, 1))
    assert one is not None and one.grad_mean is None  # M = 1: the sum is the mean


@pytest.mark.parametrize("backward", [True, False])
def test_in_one_call_a_microbatch_starts_only_after_the_one_before_has_finished(
    backward: bool,
) -> None:
    # Side by side, a graph would hold every microbatch's activations at once, which is
    # what microbatches in one process are there to avoid: each microbatch's arguments
    # are read again under the previous one's gradients (or outputs).
    model, graph, x, y = setup()
    stage = whole(graph)

    def evaluate(images: tf.Tensor, labels: tf.Tensor) -> Any:
        return model(images, training=False)

    fn = train_fn(model, stage.variables) if backward else evaluate
    run = head(stage, graph, fn, backward=backward)
    assert run.run_all(microbatches(x, y, 4)) is not None
    ((concrete, _),) = run._call._concrete.values()  # type: ignore[union-attr]
    waits = [
        op for op in concrete.graph.get_operations()
        if op.type == "Identity" and op.inputs[0].op.type == "Placeholder" and op.control_inputs
    ]  # fmt: skip
    assert len(waits) == 3 * 2  # microbatches 1 to 3, two arguments each
    # each microbatch waits for its own predecessor's (the gradient sum or the forward call)
    assert len({tuple(sorted(c.name for c in op.control_inputs)) for op in waits}) == 3


@pytest.mark.parametrize("compile", [True, False])
def test_an_eager_step_runs_all_microbatches_in_one_loop(
    compile: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # compile=False, or a first call that could not be traced: the same loop, eagerly
    model, graph, x, y = setup()
    stage = whole(graph)
    seen: list[float] = []
    train = eager_only_train(model, stage.variables, seen)

    run = head(stage, graph, train, compile=compile)
    with caplog.at_level("WARNING", logger="tfsift"):
        done = run.run_all(microbatches(x, y, 4))
    assert run.compiled is False and len(caplog.records) == int(compile)  # tried once
    wants = [reference(model, a, b) for (a, b), _ in microbatches(x, y, 4)]
    assert seen == pytest.approx([w[0] for w in wants], rel=1e-6)  # once each, eagerly
    assert done.grad_sum is not None and done.grad_mean is not None
    assert_all_close(done.grad_sum, [sum(w[1][i] for w in wants) for i in range(4)])
    assert_all_close(done.grad_mean, [sum(w[1][i] for w in wants) / 4 for i in range(4)])
