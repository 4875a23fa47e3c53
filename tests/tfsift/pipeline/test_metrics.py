"""Keras metrics updated inside a step: found, never hit by the probe, shared and combined."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import mpi
import tfsift
from tfsift.parallel import watchdog
from tfsift.pipeline import metrics, step

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(3, kernel_initializer="ones")

    def call(self, x: tf.Tensor) -> tf.Tensor:
        return self.dense(x)


def batch() -> tuple[tf.Tensor, tf.Tensor]:
    x = tf.constant([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])
    return x, tf.constant([0, 1, 2, 0])


def batch_of(M: int) -> tuple[tuple[tf.Tensor, ...], dict[str, Any]]:
    """The first of M microbatches of ``batch()``, as a step passes it on."""
    x, y = batch()
    return (x[: 4 // M], y[: 4 // M]), {}


def ids(variables: Any) -> list[int]:
    """Variables compare by identity here (``==`` on a Keras variable is elementwise)."""
    return [id(v) for v in variables]


def fake_runtime(K: int = 1, R: int = 1, rank: int = 0) -> Any:
    topology = SimpleNamespace(partitions=K, replicas=R)
    return SimpleNamespace(
        topology=topology,
        rank=rank,
        stage=0,
        replica=0,
        pipe_comm=None,
        dp_set=None,
        config=SimpleNamespace(timeout=5.0),
    )


@pytest.mark.parametrize("M", [1, 2])
def test_the_probe_on_zeros_never_reaches_a_metric(M: int) -> None:
    tfsift.init({"microbatches": M})
    model = Net()
    acc, mean = keras.metrics.SparseCategoricalAccuracy(), keras.metrics.Mean()

    @tfsift.step
    def evaluate(x: tf.Tensor, y: tf.Tensor) -> Any:
        acc.update_state(y, model(x))  # the probe runs this on zeros: it must not count
        return 0.0

    @tfsift.step
    def train(x: tf.Tensor, y: tf.Tensor) -> Any:
        loss = LOSS(y, model(x, training=True))
        mean.update_state(loss)  # before tfsift.gradients: the probe gets here too
        return tfsift.gradients(loss, model.trainable_variables), loss

    x, y = batch()
    evaluate(x, y)
    # The kernel of ones gives equal logits, so argmax is class 0: samples 0 and 3.
    assert (float(acc.total.numpy()), float(acc.count.numpy())) == (2.0, 4.0)
    _, loss = train(x, y)
    assert float(mean.count.numpy()) == M
    assert float(mean.total.numpy()) == pytest.approx(float(loss.reduce_sum()), rel=1e-6)


def test_the_model_call_inside_the_probe_keeps_its_weights() -> None:
    tfsift.init({})
    model = Net()

    @tfsift.step
    def predict(x: tf.Tensor) -> Any:
        return model(x)

    out = predict(tf.constant([[1.0, 2.0]])).concat()
    np.testing.assert_array_equal(out.numpy(), [[3.0, 3.0, 3.0]])  # built and partitioned


def test_the_probe_lists_the_variables_a_step_updates_in_order_and_changes_none() -> None:
    tfsift.init({})
    model = Net()
    acc, mean = keras.metrics.SparseCategoricalAccuracy(), keras.metrics.Mean()
    counter = keras.Variable(0.0, name="counter")

    def fn(x: tf.Tensor, y: tf.Tensor) -> Any:
        counter.assign_add(1.0)
        predictions = model(x, training=True)
        loss = LOSS(y, predictions)
        grads = tfsift.gradients(loss, model.trainable_variables)
        acc.update_state(y, predictions)  # after tfsift.gradients: found too
        mean.update_state(loss)
        return grads, loss

    model_called, backward, training, assigned = step._probe(fn, batch_of(2))
    assert (model_called, backward, training) == (model, True, True)
    assert [v.path for v in assigned] == [
        "counter",
        "sparse_categorical_accuracy/total",
        "sparse_categorical_accuracy/count",
        "mean/total",
        "mean/count",
    ]
    assert [float(v.numpy()) for v in assigned] == [0.0] * 5
    assert metrics.describe(assigned[1:2]) == [
        "sparse_categorical_accuracy/total () float32 aggregation=sum"
    ]


def test_the_models_own_variables_are_not_shared() -> None:
    tfsift.init({})
    model, acc = Net(), keras.metrics.SparseCategoricalAccuracy()

    def fn(x: tf.Tensor, y: tf.Tensor) -> Any:
        predictions = model(x)
        model.dense.kernel.assign(tf.zeros((2, 3)))  # a stage's weight, not a metric
        acc.update_state(y, predictions)
        return predictions

    *_, assigned = step._probe(fn, batch_of(1))
    assert ids(assigned) == ids([model.dense.kernel, *acc.variables])
    shared = metrics.find(assigned, model, fake_runtime(R=2), "fn")
    assert ids(shared.variables) == ids(acc.variables) and shared.combines
    assert float(model.dense.kernel.numpy()[0, 0]) == 1.0  # the probe changed nothing


def test_one_rank_shares_nothing() -> None:
    counter = keras.Variable(0.0, name="counter")
    assert metrics.find([counter], Net(), fake_runtime(), "fn") is metrics.NONE


def test_a_replica_local_variable_is_named_in_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    tfsift.init({})
    model = Net()
    counter = keras.Variable(0.0, name="counter")

    def fn(x: tf.Tensor, y: tf.Tensor) -> Any:
        counter.assign_add(1.0)
        return model(x)

    *_, assigned = step._probe(fn, batch_of(1))
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        shared = metrics.find(assigned, model, fake_runtime(R=2), "fn")
    assert ids(shared.variables) == [id(counter)] and not shared.combines
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "the @tfsift.step function 'fn' updates 'counter', whose aggregation is 'none': each "
        "replica keeps its own value (shared along its pipeline). Give it aggregation='sum', "
        "'mean' or 'only_first_replica' to combine the replicas"
    ]


class Last(keras.metrics.Metric):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__(name="last")
        self.value = self.add_variable((), "zeros", aggregation="none", name="value")

    def update_state(self, value: Any) -> None:
        self.value.assign(value)

    def result(self) -> Any:
        return self.value.value


def test_a_metric_replicas_cannot_combine_is_refused_with_the_way_out() -> None:
    variables = [*keras.metrics.Mean().variables, *Last().variables]
    metrics.check_combinable(variables, 1, "fn")  # one replica: nothing to combine
    with pytest.raises(RuntimeError) as err:
        metrics.check_combinable(variables, 2, "fn")
    assert str(err.value) == (
        "the @tfsift.step function 'fn' updates metric variables that its 2 replicas cannot "
        "combine: a metric variable's aggregation must be one of 'sum', 'mean', "
        "'only_first_replica' (Metric.add_variable's default is 'sum'). Create them so, or "
        "return what the metric needs from the step and update the metric after it, e.g. "
        "metric.update_state(labels, predictions.concat()) (that sees this replica's samples "
        "only). Received: 'last/value' (aggregation='none')"
    )


def test_stages_that_found_other_variables_all_fail() -> None:
    metrics.check_agree([["a () float32 aggregation=sum"]] * 3, "fn")
    with pytest.raises(RuntimeError) as err:
        metrics.check_agree([[], ["a () float32 aggregation=sum"]], "fn")
    assert str(err.value) == (
        "the stages found different Keras variables updated by the @tfsift.step function 'fn', "
        "so its metrics cannot be shared along the pipeline; it must update the same metrics "
        "on every rank (no branch on the rank or stage). Received: stage 0: []; stage 1: "
        "[a () float32 aggregation=sum]"
    )


def test_replicas_combine_changes_by_each_variables_aggregation() -> None:
    old = [np.float32(10), np.float32(10), np.float32(10), np.int64(4), np.float32(10)]
    new = [np.float32(13), np.float32(13), np.float32(13), np.int64(6), np.float32(7)]
    aggregations = ["sum", "mean", "only_first_replica", "sum", "none"]
    sent: list[list[np.ndarray]] = []

    def allreduce(changes: list[np.ndarray]) -> list[np.ndarray]:
        sent.append(changes)  # the other replica changed each combined variable by +5
        return [c + 5 for c in changes]

    got = metrics.combine(new, old, aggregations, 1, 2, allreduce)
    assert [c.dtype for c in sent[0]] == [np.float64, np.float64, np.float64, np.int64]
    assert [float(c) for c in sent[0]] == [3.0, 3.0, 0.0, 2.0]  # replica 1 sends no first-only
    assert [v.item() for v in got] == [18.0, 14.0, 15.0, 11, 7.0]
    assert [v.dtype for v in got] == [np.float32] * 3 + [np.int64, np.float32]


def test_summed_changes_are_exact_for_counts() -> None:
    old, new = [np.float32(2**23)], [np.float32(2**23 + 3)]  # float32 counts stay exact
    got = metrics.combine(new, old, ["sum"], 0, 4, lambda xs: [x * 4 for x in xs])
    assert got[0].item() == 2**23 + 12


class Pipe:
    """The pipeline communicator's Ibcast, seen from one rank: it completes at once.

    ``root_values`` None: this rank is the root (its buffers are recorded); else the
    values the root sends, one per call, written into the receiving buffers."""

    def __init__(self, root_values: Any) -> None:
        self.root_values, self.calls = root_values, []  # type: ignore[var-annotated]

    def Ibcast(self, buffer: np.ndarray, root: int) -> Any:
        if self.root_values is None:
            self.calls.append((buffer.copy(), root))
        else:
            buffer[...] = self.root_values[len(self.calls)]
            self.calls.append((None, root))
        return MPI.REQUEST_NULL

    def Get_rank(self) -> int:
        return 1 if self.root_values is None else 0  # the root: the last of 2 stages


def test_other_stages_take_the_last_stages_values_after_a_step() -> None:
    mean = keras.metrics.Mean()
    pipe = Pipe([np.float32(6.0), np.float32(2.0)])
    shared = metrics.SharedMetrics(tuple(mean.variables), K=2, s=0, pipe=pipe)
    with shared.sharing():
        pass
    assert pipe.calls == [(None, 1), (None, 1)]  # one non-blocking broadcast per variable
    assert float(mean.result()) == 3.0


def test_the_last_stage_sends_its_values_combined_over_replicas() -> None:
    mean = keras.metrics.Mean()
    mean.update_state([1.0, 1.0])  # before the step: total 2, count 2 on every replica
    pipe = Pipe(None)

    def allreduce(changes: list[np.ndarray]) -> list[np.ndarray]:
        return [c + other for c, other in zip(changes, [9.0, 3.0], strict=True)]

    shared = metrics.SharedMetrics(
        tuple(mean.variables), K=2, s=1, R=2, replica=0, pipe=pipe, allreduce=allreduce
    )
    with shared.sharing():
        mean.update_state([4.0])  # this replica's step: +4, +1
    assert [float(v.numpy()) for v in mean.variables] == [15.0, 6.0]
    assert [float(value.item()) for value, _ in pipe.calls] == [15.0, 6.0]
    assert {root for _, root in pipe.calls} == {1}


def test_a_step_that_raised_shares_nothing() -> None:
    mean = keras.metrics.Mean()
    pipe = Pipe([np.float32(6.0), np.float32(2.0)])
    shared = metrics.SharedMetrics(tuple(mean.variables), K=2, s=0, pipe=pipe)
    with pytest.raises(ValueError), shared.sharing():
        raise ValueError("step failed")
    assert pipe.calls == [] and float(mean.count.numpy()) == 0.0


ON_2X2 = mpi.CLUSTER_2X2.scenario("metrics_check.py", "2", "2", "2")


@pytest.mark.mpi
@pytest.mark.slow
@mpi.CLUSTER_2X2.mark
def test_metrics_inside_steps_equal_one_process_on_every_rank_of_two_by_two() -> None:
    got = ON_2X2()
    assert sorted(got) == [0, 1, 2, 3]
    want = got[0]["want"]
    assert want["acc"][1] == 2 * 2 * 8 and want["mean"][1] == 2 * 2 * 2  # steps*R*(B or M)
    for rank, data in got.items():
        assert (data["stage"], data["replica"]) == (rank % 2, rank // 2)
        # exact: correct predictions and counts are integers, on every rank
        assert data["acc"] == want["acc"], rank
        assert data["eval_acc"] == want["eval_acc"] == [want["eval_acc"][0], 16.0], rank
        assert data["mean"][1] == want["mean"][1], rank
        # the loss sum: the same additions in another order, so equal up to float rounding
        assert data["mean"][0] == pytest.approx(want["mean"][0], rel=1e-6), rank
        assert data["mean"] == got[0]["mean"] and data["results"] == got[0]["results"], rank
        assert data["error"] == (
            "the @tfsift.step function 'main.<locals>.track_last' updates metric variables "
            "that its 2 replicas cannot combine: a metric variable's aggregation must be one "
            "of 'sum', 'mean', 'only_first_replica' (Metric.add_variable's default is 'sum'). "
            "Create them so, or return what the metric needs from the step and update the "
            "metric after it, e.g. metric.update_state(labels, predictions.concat()) (that "
            "sees this replica's samples only). Received: 'last/value' (aggregation='none')"
        )


def test_a_stage_that_waits_too_long_for_the_values_ends_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Stalled:  # the last stage never sends: the broadcast never completes
        def __init__(self) -> None:
            self.comm = MPI.COMM_SELF.Dup()

        def Ibcast(self, buffer: np.ndarray, root: int) -> Any:
            return self.comm.Irecv(np.zeros(1), source=0, tag=7)

        def Get_rank(self) -> int:
            return 0

    def abort(message: str, code: int = 1) -> None:
        raise RuntimeError(message)

    monkeypatch.setattr(watchdog, "abort", abort)
    monkeypatch.setattr(watchdog, "world_rank", lambda comm, rank: rank)
    mean = keras.metrics.Mean()
    shared = metrics.SharedMetrics(tuple(mean.variables), K=2, s=0, pipe=Stalled(), timeout=0.2)
    with pytest.raises(RuntimeError) as err, shared.sharing():
        pass
    assert str(err.value) == (
        "stage 0 (rank 0) waited 0.2 s for stage 1 (rank 1) to broadcast the step's metric values"
    )
