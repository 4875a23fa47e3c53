"""The executor in one process: two stages on two threads joined by a fake communicator.

Schedules are data, so the executor can be driven without MPI: each stage's plan is
built by hand from a traced model, the messages go through queues, and the result is
compared with one full-batch tape (the mpirun tests are the end-to-end proof).
"""

from __future__ import annotations

import doctest
import gc
import itertools
import queue
import threading
import time
import types
import weakref
from pipes import FakePipe
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfsift
from partitioner import schedule
from tfsift.pipeline import executor as executor_module
from tfsift.pipeline.chunks import Chunks
from tfsift.pipeline.executor import Executor
from tfsift.pipeline.head import Head
from tfsift.pipeline.plan import Chunk, StepPlan
from tfsift.pipeline.roles import FirstStage, LastStage, MiddleStage, role_for
from tfsift.pipeline.stage import Stage
from tfsift.pipeline.step import split
from tfsift.planning.graph import trace

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Chain(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(6, activation="tanh")
        self.b = keras.layers.Dense(5, activation="relu")
        self.drop = keras.layers.Dropout(0.0)
        self.c = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.c(self.drop(self.b(self.a(x))))


class TrainFn:
    """The README's training step; ``variables`` is what ``model.trainable_variables``
    would be on the last stage's rank (set once that stage is built)."""

    def __init__(self, model: Chain) -> None:
        self.model, self.variables = model, []

    def __call__(self, x: tf.Tensor, y: tf.Tensor) -> Any:
        loss = LOSS(y, self.model(x, training=True))
        return tfsift.gradients(loss, self.variables), loss


def train_fn(model: Chain) -> TrainFn:
    return TrainFn(model)


def plans(
    model: Chain,
    fn: Any,
    example: tf.Tensor,
    K: int,
    M: int,
    pipeline: str,
    recompute: bool,
    v: int = 1,
) -> list[StepPlan]:
    """One hand-built plan per stage, cutting the 4-node chain into K equal parts (K v
    chunks of one node, with ``v`` virtual stages: stage s runs chunks s, s + K, ...)."""
    graph = trace(model, [example])
    bounds = {1: (0, 4), 2: (0, 2, 4), 4: (0, 1, 2, 3, 4)}[K * v]
    compute = schedule.build(pipeline, K, M, virtual_stages=v)
    actions = schedule.add_communication(compute, virtual_stages=v)
    queues: dict[tuple[int, int, int, int], queue.Queue[Any]] = {}
    out = []
    for s in range(K):
        held = Chunks(
            [Stage(graph.stage(bounds[c], bounds[c + 1]), c, recompute) for c in range(s, K * v, K)]
        )
        chunks = []
        for stage in held.stages:
            sub, c = stage.graph, stage.index
            specs = [
                (tuple(graph.tensors[t].shape[1:]), graph.tensors[t].dtype) for t in sub.inputs
            ]
            outs = [
                (tuple(graph.tensors[t].shape[1:]), graph.tensors[t].dtype) for t in sub.outputs
            ]
            head = None
            if c == K * v - 1:
                fn.variables = held.variables
                head = Head(stage, fn, graph.structure, True, True, requested=held.variables)
            chunks.append(Chunk(stage, role_for(c, K * v), tuple(specs), tuple(outs), head))
        plan = StepPlan(
            K, M, pipeline, "memory" if recompute else "speed", model, tuple(chunks),
            tuple(actions[s]), graph.structure,
            FakePipe(s, queues),  # type: ignore[arg-type]
            True, True, "(tensor(rank 2), tensor(rank 1))", None,  # type: ignore[arg-type]
            combine=held.combine if v > 1 else None,
        )  # fmt: skip
        out.append(plan)
    return out


def run_pipeline(plans_: list[StepPlan], fn: Any, x: tf.Tensor, y: tf.Tensor) -> list[Any]:
    microbatches = split((x, y), {}, plans_[0].M)
    results: list[Any] = [None] * len(plans_)
    errors: list[BaseException] = []

    def work(s: int) -> None:
        try:
            results[s] = Executor(plans_[s], fn, microbatches).run()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(len(plans_))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results


def batch() -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(3)
    return tf.constant(rng.normal(size=(8, 4)), tf.float32), tf.constant(rng.integers(0, 3, 8))


@pytest.mark.parametrize("K", [1, 2, 4])
@pytest.mark.parametrize("M", [1, 4])
@pytest.mark.parametrize("pipeline", ["simple", "interleaved"])
@pytest.mark.parametrize("recompute", [False, True])
def test_threaded_stages_give_the_full_batch_gradients(
    K: int, M: int, pipeline: str, recompute: bool
) -> None:
    keras.utils.set_random_seed(0)
    model, (x, y) = Chain(), batch()
    fn = train_fn(model)
    stage_plans = plans(model, fn, x[: 8 // M], K, M, pipeline, recompute)
    results = run_pipeline(stage_plans, fn, x, y)
    with tf.GradientTape() as tape:
        want_loss = LOSS(y, model.c(model.b(model.a(x))))
    want = tape.gradient(want_loss, model.trainable_variables)
    got = [g / M for r in results for g in r.grad_sum]
    assert len(got) == len(want) == 6
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-7)
    losses = [float(r[1]) for r in results[-1].results]
    assert np.mean(losses) == pytest.approx(float(want_loss), rel=1e-5)
    assert all(r.results is None for r in results[:-1])  # only the last stage has results


@pytest.mark.parametrize("M", [2, 4])
@pytest.mark.parametrize("recompute", [False, True])
def test_threaded_stages_on_virtual_stages_give_the_full_batch_gradients(
    M: int, recompute: bool
) -> None:
    # stage 0 runs layers a and drop (chunks 0, 2), stage 1 layers b and c (chunks 1, 3)
    keras.utils.set_random_seed(0)
    model, (x, y) = Chain(), batch()
    fn = train_fn(model)
    stage_plans = plans(model, fn, x[: 8 // M], 2, M, "interleaved", recompute, v=2)
    results = run_pipeline(stage_plans, fn, x, y)
    with tf.GradientTape() as tape:
        want_loss = LOSS(y, model.c(model.b(model.a(x))))
    want = dict(zip([v.path for v in model.trainable_variables],
                    tape.gradient(want_loss, model.trainable_variables), strict=True))  # fmt: skip
    counted = 0
    for plan, result in zip(stage_plans, results, strict=True):
        held = [v.path for c in plan.chunks for v in c.stage.variables]
        assert len(result.grad_sum) == len(held)
        counted += len(held)
        for path, g in zip(held, result.grad_sum, strict=True):
            np.testing.assert_allclose(g.numpy() / M, want[path].numpy(), rtol=1e-5, atol=1e-7)
    assert counted == len(want) == 6  # a's on stage 0 (with drop), b's and c's on stage 1
    losses = [float(r[1]) for r in results[-1].results]
    assert np.mean(losses) == pytest.approx(float(want_loss), rel=1e-5)
    assert results[0].results is None


class TiedChain(tfsift.DistributedModel):
    """One Dense layer called at two depths: with 2 x 2 chunks, both calls on stage 0."""

    def __init__(self) -> None:
        super().__init__()
        self.t = keras.layers.Dense(4, activation="tanh")
        self.m = keras.layers.Dense(4, activation="relu")
        self.c = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.c(self.t(self.m(self.t(x))))


def test_a_layer_two_chunks_of_a_stage_call_is_one_variable_with_both_gradients() -> None:
    keras.utils.set_random_seed(0)
    model, (x, y) = TiedChain(), batch()
    fn = train_fn(model)  # type: ignore[arg-type]
    stage_plans = plans(model, fn, x[:4], 2, 2, "interleaved", False, v=2)  # type: ignore[arg-type]
    # chunks 0 and 2 (t and t again) on stage 0, 1 and 3 (m, c) on stage 1
    assert [[len(c.stage.variables) for c in p.chunks] for p in stage_plans] == [[2, 2], [2, 2]]
    results = run_pipeline(stage_plans, fn, x, y)
    with tf.GradientTape() as tape:
        want_loss = LOSS(y, model.c(model.t(model.m(model.t(x)))))
    want = tape.gradient(want_loss, [model.t.kernel, model.t.bias])
    assert len(results[0].grad_sum) == 2  # t's kernel and bias once: one copy on stage 0
    for g, w in zip(results[0].grad_sum, want, strict=True):
        np.testing.assert_allclose(g.numpy() / 2, w.numpy(), rtol=1e-5, atol=1e-7)


def test_a_stage_of_virtual_stages_talks_to_both_neighbours_in_the_schedule_order() -> None:
    keras.utils.set_random_seed(0)
    model, (x, y) = Chain(), batch()
    fn = train_fn(model)
    stage_plans = plans(model, fn, x[:4], 2, 2, "interleaved", False, v=2)
    run_pipeline(stage_plans, fn, x, y)
    # stage 0: 0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1; chunk 2 receives from chunk 1 (stage 1)
    # and sends to chunk 3 (stage 1 too): with K = 2 both neighbours are stage 1
    assert stage_plans[0].comm.calls == [  # type: ignore[attr-defined]
        "sendC0->1", "sendF0->1", "sendC1->1", "sendF1->1",
        "recvC0<-1", "recvF0<-1", "sendC0->1", "sendF0->1",
        "recvC1<-1", "recvF1<-1", "sendC1->1", "sendF1->1",
        "recvB0<-1", "sendB0->1", "recvB1<-1", "sendB1->1",
        "recvB0<-1", "recvB1<-1", "wait",
    ]  # fmt: skip


def test_stage_0_talks_in_the_schedule_order_interleaved_m4() -> None:
    keras.utils.set_random_seed(0)
    model, (x, y) = Chain(), batch()
    fn = train_fn(model)
    stage_plans = plans(model, fn, x[:2], 2, 4, "interleaved", False)
    run_pipeline(stage_plans, fn, x, y)
    assert stage_plans[0].comm.calls == [  # type: ignore[attr-defined]
        "sendC0->1", "sendF0->1", "sendC1->1", "sendF1->1", "recvB0<-1", "sendC2->1",
        "sendF2->1", "recvB1<-1", "sendC3->1", "sendF3->1", "recvB2<-1", "recvB3<-1", "wait",
    ]  # fmt: skip
    assert stage_plans[1].comm.calls == [  # type: ignore[attr-defined]
        "recvC0<-0", "recvF0<-0", "sendB0->0", "recvC1<-0", "recvF1<-0", "sendB1->0",
        "recvC2<-0", "recvF2<-0", "sendB2->0", "recvC3<-0", "recvF3<-0", "sendB3->0", "wait",
    ]  # fmt: skip


def test_a_stage_fed_other_data_refuses_before_receiving_activations() -> None:
    keras.utils.set_random_seed(0)
    model, (x, y) = Chain(), batch()
    fn = train_fn(model)
    stage_plans = plans(model, fn, x[:4], 2, 2, "simple", False)
    for plan in stage_plans:
        plan.comm.timeout = 2.0  # type: ignore[attr-defined]
    batches = [split((x, y), {}, 2), split((x[::-1], y[::-1]), {}, 2)]  # stage 1: reversed
    errors: list[BaseException] = []

    def work(s: int) -> None:
        try:
            Executor(stage_plans[s], fn, batches[s]).run()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    mismatch = [e for e in errors if isinstance(e, RuntimeError)]
    assert len(mismatch) == 1
    assert str(mismatch[0]).startswith(
        "stage 1 was given other data than stage 0 for microbatch 0 of this step"
    )
    assert "tfsift.shard(dataset, shuffle_buffer=..., seed=...)" in str(mismatch[0])
    assert stage_plans[1].comm.calls == ["recvC0<-0"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("K", [1, 2])
def test_a_nan_in_the_data_trains_as_in_one_process_and_is_no_data_mismatch(K: int) -> None:
    keras.utils.set_random_seed(0)
    model, (x, y) = Chain(), batch()
    x = tf.tensor_scatter_nd_update(x, [[5, 1]], [np.nan])  # microbatch 1 of 2 holds a NaN
    fn = train_fn(model)
    results = run_pipeline(plans(model, fn, x[:4], K, 2, "simple", False), fn, x, y)
    got = [float(r[1]) for r in results[-1].results]
    # one process's losses, compiled as the stages are: where TensorFlow runs oneDNN's
    # kernels (CPUs with AVX-512 VNNI or BF16), the fused relu after a matmul turns the
    # NaN row into zeros, as in the pipeline, where an eager call gives NaN
    one = tf.function(lambda x, y: LOSS(y, model.c(model.b(model.a(x)))))
    want = [float(one(x[:4], y[:4])), float(one(x[4:], y[4:]))]
    assert got == pytest.approx(want, rel=1e-6, nan_ok=True)


def test_the_fingerprint_counts_nan_and_infinities_instead_of_summing_them() -> None:
    def of(*leaves: Any) -> list[float]:
        return executor_module.fingerprint((leaves, {})).tolist()  # type: ignore[no-any-return]

    with_nan = np.array([[1.0, np.nan], [2.0, -np.inf]])
    assert of(with_nan) == of(with_nan.copy()) == [2.0, 3.0, 5.0, 2.0]  # NaN equals itself
    assert of(with_nan, np.array([3, 1])) == [2.0, 7.0, 15.0, 2.0]
    assert of(np.array([[1.0, 2.0]])) == [1.0, 3.0, 5.0, 0.0]
    assert doctest.testmod(executor_module).failed == 0


def test_roles_follow_the_stage_position() -> None:
    assert isinstance(role_for(0, 1), LastStage)
    assert isinstance(role_for(0, 3), FirstStage)
    assert isinstance(role_for(1, 3), MiddleStage)
    assert isinstance(role_for(2, 3), LastStage)


def test_a_schedule_with_a_backward_before_its_forward_fails_on_the_last_stage() -> None:
    # the last stage's backward ran with its forward: one that did not run is an error
    ex = types.SimpleNamespace(fused={1})
    with pytest.raises(KeyError):
        LastStage().backward(ex, None, 0)  # type: ignore[arg-type]
    LastStage().backward(ex, None, 1)  # type: ignore[arg-type]
    assert ex.fused == set()


def test_a_lone_stage_shows_its_one_call_as_equal_shares_of_its_forwards() -> None:
    keras.utils.set_random_seed(0)
    model, (x, y) = Chain(), batch()
    fn = train_fn(model)
    (plan,) = plans(model, fn, x[:2], 1, 4, "simple", False)
    timed: list[Any] = []
    before = time.perf_counter()
    result = Executor(plan, fn, split((x, y), {}, 4)).run(timed)
    assert result.results is not None and len(result.results) == 4
    assert [a for a, _, _ in timed] == list(plan.actions)
    spans = [(start, end) for _, start, end in timed]
    assert before <= spans[0][0] and spans[-1][1] <= time.perf_counter()
    assert all(b[0] == a[1] for a, b in itertools.pairwise(spans))  # one after the other
    shares = {a: end - start for a, start, end in timed}
    forwards = [t for a, t in shares.items() if a.kind == schedule.Kind.FORWARD]
    assert len(forwards) == 4 and forwards == pytest.approx([forwards[0]] * 4)
    assert forwards[0] > 0
    # each backward ran with its forward, as on any last stage
    assert [t for a, t in shares.items() if a.kind == schedule.Kind.BACKWARD] == [0.0] * 4


def test_an_executor_is_freed_without_the_cycle_collector() -> None:
    gc.disable()
    try:
        plan = types.SimpleNamespace(actions=(), comm=types.SimpleNamespace(wait=lambda: None))
        executor = Executor(plan, None, [])  # type: ignore[arg-type]
        alive = weakref.ref(executor)
        del executor
        assert alive() is None
    finally:
        gc.enable()


def test_the_handler_table_names_a_method_for_every_action_kind() -> None:
    assert set(executor_module._HANDLERS) == set(schedule.Kind)
    for name in executor_module._HANDLERS.values():
        assert callable(getattr(Executor, name))
