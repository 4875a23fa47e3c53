"""One rank of a benchmark on the conv chain: ``MODE CONFIG_JSON`` (``MODES``), one compute
thread. Letters: K stages, M microbatches, B the global batch.
"""

from __future__ import annotations

import tensorflow as tf

import tfsift  # before mpi4py starts MPI, as a user's script does (tfsift's MPI defaults)

# One compute thread per rank, fixed before any TensorFlow op runs.
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # type: ignore[import-untyped]  # noqa: E402
from mpi4py import MPI  # noqa: E402

from bench.harness import write_rank  # noqa: E402
from partitioner.plan import Plan, make_plan  # noqa: E402
from tfsift.pipeline.split import SplitBackward  # noqa: E402
from tfsift.pipeline.stage import Stage, microbatch_seconds  # noqa: E402
from tfsift.planning.graph import trace  # noqa: E402
from tfsift.planning.profiler import profile  # noqa: E402

Config = dict[str, Any]
Step = Callable[[], None]
LOSS = keras.losses.MeanSquaredError()
LM_LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
LINK = Path("/sys/class/net/tfsift0/statistics")  # the simulated hosts' link


def chain_layers(cfg: Config) -> list[keras.layers.Layer]:
    """``layers`` equal layers, relu: Conv2D(width, 3x3, same) on side x side x width images
    (``model="conv"``) or Dense(width)."""
    if cfg["model"] == "conv":
        return [keras.layers.Conv2D(cfg["width"], 3, padding="same", activation="relu")
                for _ in range(cfg["layers"])]  # fmt: skip
    return [keras.layers.Dense(cfg["width"], activation="relu") for _ in range(cfg["layers"])]


def sample_shape(cfg: Config) -> tuple[int, ...]:
    """One sample's shape, the chain's input's and output's (a transformer's: its tokens)."""
    if cfg["model"] == "transformer":
        return (cfg["side"],)
    return (cfg["side"], cfg["side"], cfg["width"]) if cfg["model"] == "conv" else (cfg["width"],)


class Chain(tfsift.DistributedModel):
    """The benchmark's chain as a tfsift model."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.blocks = chain_layers(cfg)

    def call(self, x: Any) -> Any:
        for block in self.blocks:
            x = block(x)
        return x


class Halves(tfsift.DistributedModel):
    """``layers`` Dense(width) layers, the first half on stage 0."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.names = [f"dense{i}" for i in range(cfg["layers"])]
        for i, name in enumerate(self.names):  # placed as assigned, one attribute each
            with tfsift.partition(0 if i < cfg["layers"] // 2 else 1):
                setattr(self, name, keras.layers.Dense(cfg["width"], activation="relu"))

    def call(self, x: Any) -> Any:
        for name in self.names:
            x = getattr(self, name)(x)
        return x


def model_of(cfg: Config) -> Any:
    """The chain, ``Halves`` (``model="halves"``) or (``model="transformer"``)
    examples/decoder_lm.py's decoder: ``layers`` blocks of ``width`` on ``side`` tokens, its
    embedding tied to the head."""
    if cfg["model"] == "halves":
        return Halves(cfg)
    if cfg["model"] != "transformer":
        return Chain(cfg)
    from examples.decoder_lm import DecoderLM

    return DecoderLM(cfg["side"], cfg["width"], 4, cfg["layers"])


def plain_chain(cfg: Config) -> keras.Model:
    """The same chain as a plain Keras model (no tfsift)."""
    return keras.Sequential([keras.Input(sample_shape(cfg)), *chain_layers(cfg)])


def data(cfg: Config) -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(0)
    shape = (cfg["batch"], *sample_shape(cfg))
    if cfg["model"] == "transformer":
        from examples.decoder_lm import VOCAB

        ids = rng.integers(0, VOCAB, shape).astype("int32")
        return tf.constant(ids), tf.constant(np.roll(ids, -1, axis=1))
    x = rng.normal(size=shape).astype("float32")
    return tf.constant(x), tf.constant(rng.normal(size=shape).astype("float32"))


def keras_step(cfg: Config, x: tf.Tensor, y: tf.Tensor) -> Step:
    """The reference: a plain Keras 3 train step (tape, loss, SGD) in one tf.function."""
    model = plain_chain(cfg)
    optimizer = keras.optimizers.SGD(1e-3)
    optimizer.build(model.trainable_variables)

    def train(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    compiled = tf.function(train)
    return lambda: compiled(x, y)


def keras_microbatched_step(
    cfg: Config, x: tf.Tensor, y: tf.Tensor, M: int, fused: bool = False
) -> Step:
    """Microbatching written by hand: the reference's work in M tf.function calls (forward,
    backward, the running gradient sum), then the mean and the update in one call; with
    ``fused``, the M microbatches in one call (the loop unrolled in its graph), as tfsift's
    one stage runs them: what the smaller matrix products alone cost."""
    model = plain_chain(cfg)
    optimizer = keras.optimizers.SGD(1e-3)
    variables = model.trainable_variables
    optimizer.build(variables)

    def microbatch(x: tf.Tensor, y: tf.Tensor, total: list[tf.Tensor]) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        grads = tape.gradient(loss, variables)
        return [t + g for t, g in zip(total, grads, strict=True)]

    def microbatches(x: tf.Tensor, y: tf.Tensor, call: Any, total: list[tf.Tensor]) -> Any:
        for xm, ym in zip(tf.split(x, M), tf.split(y, M), strict=True):
            total = call(xm, ym, total)
        return total

    def zeros() -> list[tf.Tensor]:
        return [tf.zeros_like(v) for v in variables]

    update = tf.function(lambda total: optimizer.apply([t / M for t in total], variables))
    if fused:  # the zeros made inside the graph
        every = tf.function(lambda x, y: microbatches(x, y, microbatch, zeros()))
        return lambda: update(every(x, y))
    one, zeros_once = tf.function(microbatch), zeros()  # made once
    return lambda: update(microbatches(x, y, one, zeros_once))


def tfsift_step(
    cfg: Config, x: tf.Tensor, y: tf.Tensor, dp: bool = False, eager_update: bool = False
) -> tuple[Step, Any]:
    """A ``@tfsift.step`` train step (its first, partitioning call made here), updated by
    ``tfsift.compiled_update`` or, with ``eager_update``, ``optimizer.apply_gradients``
    (Keras updates each variable in Python). Also returns the model, the allreduce's times
    and the step call alone (no accumulation, allreduce nor update)."""
    model = model_of(cfg)
    loss_fn = LM_LOSS if cfg["model"] == "transformer" else LOSS

    @tfsift.step
    def forward_backward(x: tf.Tensor, y: tf.Tensor) -> Any:
        loss = loss_fn(y, model(x, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    forward_backward(x, y)
    optimizer, variables = keras.optimizers.SGD(1e-3), model.trainable_variables
    if eager_update:

        def update(grads: list[tf.Tensor]) -> None:
            optimizer.apply_gradients(zip(grads, variables, strict=True))
    else:
        update = tfsift.compiled_update(optimizer, model)
    timings: dict[str, list[float]] = {"allreduce": []}

    def train() -> None:
        grads, _ = forward_backward(x, y)
        accumulated = [g.accumulate() for g in grads]
        if dp:
            start = time.perf_counter()
            accumulated = tfsift.allreduce(accumulated)
            timings["allreduce"].append(time.perf_counter() - start)
        update(accumulated)

    def call() -> None:  # the @tfsift.step call alone: what the plan line predicts
        forward_backward(x, y)

    return train, (model, timings, call)


def fit_step(cfg: Config, x: tf.Tensor, y: tf.Tensor, distributed: bool) -> Step:
    """An epoch of ``fit``, Keras' or tfsift's, on ``cfg["fit_batches"]`` copies of the
    batch: its time over that count is a step of ``fit``, reading and callbacks included."""
    model = Chain(cfg) if distributed else plain_chain(cfg)
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss=LOSS)
    xs, ys = (np.concatenate([t.numpy()] * cfg["fit_batches"]) for t in (x, y))
    return lambda: model.fit(xs, ys, batch_size=cfg["batch"], epochs=1, verbose=0, shuffle=False)


def synced_time(step: Step, collect: bool) -> float:
    """Seconds of one step started together on every rank; the slowest rank's time. With
    ``collect`` a full garbage collection runs first, outside the timed window; the
    benchmark also runs without it, to show that no step's tensors outlive the step."""
    if collect:
        gc.collect()
    MPI.COMM_WORLD.Barrier()
    start = time.perf_counter()
    step()
    return float(max(MPI.COMM_WORLD.allgather(time.perf_counter() - start)))


def thread_cpu() -> dict[str, float]:
    """CPU seconds used so far by the main thread, TensorFlow's pools and every other thread."""
    main = threading.get_native_id()
    out = {"main": 0.0, "tensorflow": 0.0, "other": 0.0}
    for thread in psutil.Process().threads():
        try:
            name = Path(f"/proc/self/task/{thread.id}/comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        kind = "main" if thread.id == main else "tensorflow" if name.startswith("tf_") else "other"
        out[kind] += thread.user_time + thread.system_time
    return out


def timed(step: Step, cfg: Config) -> dict[str, Any]:
    """Times ``cfg["steps"]`` steps; also the CPU each kind of thread used over that wall time."""
    before, start = thread_cpu(), time.perf_counter()
    times = [synced_time(step, cfg["collect"]) for _ in range(cfg["steps"])]
    wall, after = time.perf_counter() - start, thread_cpu()
    cpu = {k: after[k] - before[k] for k in before}
    return {"times": times, "thread_cpu_s": cpu, "timed_wall_s": wall}


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def tensor_bytes() -> dict[str, int] | None:
    """TensorFlow's CPU allocator's bytes in use and their peak since the last reset (the
    tensors alone, not what the heap keeps after they are freed), where the job runs it with
    statistics (``TF_CPU_ALLOCATOR_USE_BFC=true``); else None."""
    try:
        return dict(tf.config.experimental.get_memory_info("CPU:0"))
    except ValueError:  # "Allocator stats not available": the default allocator
        return None


def time_steps(steps: dict[str, Step], cfg: Config) -> dict[str, list[float]]:
    """Warms each step up, then times them in alternating rounds (drift hits all alike)."""
    for _ in range(cfg["warmup"]):
        for step in steps.values():
            synced_time(step, cfg["collect"])
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(cfg["steps"]):
        for name, step in steps.items():
            times[name].append(synced_time(step, cfg["collect"]))
    return times


def predictions(cfg: Config, model: Chain, x: tf.Tensor) -> list[dict[str, Any]]:
    """The simulator's K-stage step time for every M, schedule and mode, profiled at B/M."""
    out = []
    for M in cfg["microbatches"]:
        costs = profile_at(model, x, M, cfg)
        for pipeline in cfg["pipelines"]:
            for optimize in cfg["optimizes"]:
                plan = make_plan(costs, cfg["K"], M, optimize=optimize, pipeline=pipeline)
                out.append({
                    "M": M, "pipeline": pipeline, "optimize": optimize,
                    "action_overhead_s": float(costs.action_overhead),
                    "predicted_step_s": plan.predicted_step_time,
                    "predicted_peak_bytes": list(plan.peak_memory),
                })  # fmt: skip
    return out


def profile_at(model: Chain, x: tf.Tensor, M: int, cfg: Config) -> Any:
    """The cost model of the traced chain for microbatches of B/M samples."""
    part = model.partitioned
    assert part is not None, "the model is partitioned by its first step"
    return profile(part.graph, [x[: cfg["batch"] // M]], cfg["profile_repeats"], microbatch_seconds)


def run_single(cfg: Config) -> dict[str, Any]:
    """One process: plain Keras vs @tfsift.step (K=1, M=1), then the simulator's predictions."""
    tfsift.init({"partitions": 1, "microbatches": 1})
    x, y = data(cfg)
    tfsift_train, (model, _, _) = tfsift_step(cfg, x, y)
    steps = {"keras": keras_step(cfg, x, y), "tfsift": tfsift_train}
    if cfg.get("fit_batches"):  # what the update left eager and fit cost
        steps["tfsift_eager_update"] = tfsift_step(cfg, x, y, eager_update=True)[0]
        steps["keras_fit"] = fit_step(cfg, x, y, distributed=False)
        steps["tfsift_fit"] = fit_step(cfg, x, y, distributed=True)
    times = time_steps(steps, cfg)
    whole = float(profile_at(model, x, 1, cfg).prefix.compute[-1])
    return {
        "times": times, "whole_batch_compute_s": whole, "predictions": predictions(cfg, model, x),
        "microbatched": {str(M): microbatched(cfg, M, x, y) for M in cfg["microbatches"]},
    }  # fmt: skip


def microbatched(cfg: Config, M: int, x: tf.Tensor, y: tf.Tensor) -> list[float]:
    """Step times of @tfsift.step with K=1 and M microbatches: the microbatching cost alone."""
    tfsift.init({"partitions": 1, "microbatches": M})
    train, _ = tfsift_step(cfg, x, y)
    return time_steps({"tfsift": train}, cfg)["tfsift"]


def run_pipeline(cfg: Config) -> dict[str, Any]:
    """K ranks, one stage each (``virtual_stages`` chunks each, if given): times the
    pipelined train step. Rank 0 also reports the step its start-up plan line predicted
    (read back from a fresh plan file)."""
    plan_file = Path(tempfile.mkdtemp(prefix="tfsift-bench-plan-")) / "plan.json"
    keras.mixed_precision.set_global_policy(cfg.get("precision", "float32"))
    options = {k: cfg[k] for k in ("virtual_stages", "memory_cap") if cfg.get(k)}
    tfsift.init({"partitions": cfg["K"], "microbatches": cfg["M"], "pipeline": cfg["pipeline"],
                 "optimize": cfg["optimize"], "profile_repeats": cfg["profile_repeats"],
                 "plan_file": str(plan_file), **options})  # fmt: skip
    x, y = data(cfg)
    train, (model, _, call) = tfsift_step(cfg, x, y)
    for _ in range(cfg["warmup"]):
        synced_time(train, cfg["collect"])
    whole = maxrss_mib()
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # the kernel's peak-RSS mark reset to now
    resting = psutil.Process().memory_info().rss / 2**20
    if (tensors := tensor_bytes()) is not None:
        tf.config.experimental.reset_memory_stats("CPU:0")
    with tfsift.timeline() as recorded:  # one step: each kind of action's seconds, the events
        synced_time(train, True)
    measured = recorded.steps[-1]
    action_s = measured.seconds(tfsift.mp_rank())
    events = [[e.stage, str(e.action), e.start, e.end] for e in measured.events]
    # the step call alone as many times again, where asked (bench_small: the prediction's
    # scope, which the user's update is outside of)
    repeat = cfg["steps"] if cfg.get("time_call") else 0
    calls = [synced_time(call, cfg["collect"]) for _ in range(repeat)]
    plan = Plan.load(plan_file) if plan_file.exists() else None
    shutil.rmtree(plan_file.parent, ignore_errors=True)  # each rank made its own folder
    result = timed(train, cfg)
    if tensors is not None:
        now = tensor_bytes()
        assert now is not None
        result["tensor_resting_bytes"] = tensors["current"]
        result["tensor_peak_bytes"] = now["peak"]
    return result | {
        "predicted_peak_bytes": list(plan.peak_memory) if plan else None,
        "deferred": list(plan.deferred) if plan and plan.deferred is not None else None,
        "sent_bytes": sent_bytes(model, cfg), "call_times": calls,
        "action_s": action_s, "events": events,
        "bounds": list(model.partitioned.bounds),
        "startup_predicted_s": plan.predicted_step_time if plan else None,
        "maxrss_whole_mib": whole, "maxrss_timed_mib": maxrss_mib(),
        "rss_reset_mib": resting,
    }  # fmt: skip


def sent_bytes(model: Any, cfg: Config) -> int:
    """Bytes this stage sends a step: its activations forward (not the last stage) and the
    gradients of its float inputs backward (not the first), for the whole batch."""
    part, K = model.partitioned, cfg["K"]

    def size(specs: list[Any], floats: bool) -> int:
        return sum(int(np.prod(shape)) * tf.as_dtype(dtype).size for shape, dtype in specs
                   if not floats or tf.as_dtype(dtype).is_floating)  # fmt: skip

    forward = size(part.out_specs, False) if part.stage.index < K - 1 else 0
    backward = size(part.in_specs, True) if part.stage.index > 0 else 0
    return (forward + backward) * cfg["batch"]


def run_dp(cfg: Config) -> dict[str, Any]:
    """Data parallel on every rank (partitions=1): B / size samples each, grads allreduced."""
    tfsift.init({"partitions": 1, "microbatches": 1})
    x, y = data(cfg)
    share = cfg["batch"] // tfsift.size()
    part = slice(tfsift.rank() * share, (tfsift.rank() + 1) * share)
    train, (_, timings, _) = tfsift_step(cfg, x[part], y[part], dp=True)
    for _ in range(cfg["warmup"]):
        synced_time(train, cfg["collect"])
    timings["allreduce"].clear()
    return timed(train, cfg) | {"allreduce": timings["allreduce"]}


def run_mwms(cfg: Config) -> dict[str, Any]:
    """The peer of ``dp``: tf.distribute's MultiWorkerMirroredStrategy (ring collectives),
    B / size samples per worker, gradients averaged by the replica context, plain SGD."""
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    workers = [f"127.0.0.1:{port}" for port in cfg["ports"]]
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
    )
    ring = tf.distribute.experimental.CommunicationImplementation.RING
    options = tf.distribute.experimental.CommunicationOptions(implementation=ring)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    x, y = data(cfg)
    share = cfg["batch"] // size
    x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
    with strategy.scope():
        model = plain_chain(cfg)

    def replica() -> None:
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        variables = model.trainable_variables
        grads = tape.gradient(loss, variables)
        grads = tf.distribute.get_replica_context().all_reduce("MEAN", grads)
        for v, g in zip(variables, grads, strict=True):
            v.assign_sub(1e-3 * g)  # SGD, as the other rows

    compiled = tf.function(lambda: strategy.run(replica))
    step = lambda: compiled()  # noqa: E731
    for _ in range(cfg["warmup"]):
        synced_time(step, cfg["collect"])
    return timed(step, cfg)


def run_reference(cfg: Config) -> dict[str, Any]:
    """One process: the plain Keras step alone (for models other than the main one)."""
    x, y = data(cfg)
    return {"times": time_steps({"keras": keras_step(cfg, x, y)}, cfg)["keras"]}


def run_microbatched(cfg: Config) -> dict[str, Any]:
    """One process: @tfsift.step with K=1 and cfg["M"] microbatches; with ``floor``, the
    same microbatching in TensorFlow alone and the whole-batch reference, timed in turn."""
    x, y = data(cfg)
    M = cfg["M"]
    if not cfg.get("floor"):
        return {"times": microbatched(cfg, M, x, y)}
    tfsift.init({"partitions": 1, "microbatches": M})
    train, _ = tfsift_step(cfg, x, y)
    steps = {
        "tfsift": train, "keras": keras_step(cfg, x, y),
        "keras_microbatched": keras_microbatched_step(cfg, x, y, M),
        "keras_microbatched_fused": keras_microbatched_step(cfg, x, y, M, fused=True),
    }  # fmt: skip
    times = time_steps(steps, cfg)
    return {"times": times.pop("tfsift")} | times


def run_split(cfg: Config) -> dict[str, Any]:
    """One process: the chain's second half as a later stage (its input gradients needed)
    on a microbatch of B/M samples, its backward fused (the tape, as 1F1B runs it) and
    split into B then W (as the zero-bubble schedule runs it), each action timed alone, in
    alternating rounds; the gradient sum kept as a step does."""
    tfsift.init({"partitions": 1, "microbatches": 1})
    x, _ = data(cfg)
    example = x[: cfg["batch"] // cfg["M"]]
    graph = trace(Chain(cfg), [example])
    half = len(graph) // 2
    h = Stage(graph.stage(0, half), 0, recompute=False).forward_call([example], True)
    stage = Stage(graph.stage(half, len(graph)), 1, recompute=False)
    split = SplitBackward(stage)
    grads = [tf.ones_like(y) for y in stage.forward_call(h, True)]
    total = [tf.zeros_like(v) for v in stage.variables]
    names = ("F", "B_fused", "F_split", "B", "W")
    times: dict[str, list[float]] = {k: [] for k in names}
    for round_ in range(cfg["warmup"] + cfg["steps"]):
        clock = [time.perf_counter()]
        _, saved = stage.forward(h, True, keep=True)
        clock.append(time.perf_counter())
        assert saved is not None
        stage.backward(saved, grads, total)
        clock.append(time.perf_counter())
        _, kept = split.forward(h, True)
        clock.append(time.perf_counter())
        _, pending = split.backward_input(kept, grads)
        clock.append(time.perf_counter())
        split.backward_weights(pending, total)
        clock.append(time.perf_counter())
        if round_ >= cfg["warmup"]:  # the first calls trace
            for name, begin, end in zip(names, clock[:-1], clock[1:], strict=True):
                times[name].append(end - begin)
    return {"times": times}


def run_hosts(cfg: Config) -> dict[str, Any]:
    """bench_hosts: a 2-stage x 2-replica step of a chain of Dense layers cut in the middle
    (every placement cuts it at the same place) on the simulated hosts, timed; the bytes
    this rank's host sent and received on their link meanwhile (its counters, which a
    process in a simulated host's namespace sees as its host's), and the host's name."""
    tfsift.init({"partitions": 2, "microbatches": cfg["M"], "placement_strategy": cfg["placement"],
                 "auto_partition": False, "timeout": 600})  # fmt: skip
    rng = np.random.default_rng(tfsift.dp_rank())
    x, y = (tf.constant(rng.normal(size=(cfg["batch"], cfg["width"])).astype("float32"))
            for _ in range(2))  # fmt: skip
    train, _ = tfsift_step(cfg | {"model": "halves"}, x, y, dp=True)

    def counters() -> dict[str, int]:  # none on a machine without the simulated link
        names = ("tx_bytes", "rx_bytes")
        return {n: int((LINK / n).read_text()) if LINK.exists() else 0 for n in names}

    for _ in range(cfg["warmup"]):
        synced_time(train, collect=False)
    MPI.COMM_WORLD.Barrier()
    before = counters()
    times = [synced_time(train, collect=False) for _ in range(cfg["steps"])]
    after = counters()
    bytes_ = {name: after[name] - before[name] for name in before}
    return {"host": socket.gethostname(), "times": times, "bytes": bytes_}


MODES: dict[str, Callable[[Config], dict[str, Any]]] = {
    "single": run_single, "pipeline": run_pipeline, "dp": run_dp, "mwms": run_mwms,
    "reference": run_reference, "microbatched": run_microbatched, "split": run_split,
    "hosts": run_hosts,
}  # fmt: skip

if __name__ == "__main__":
    mode, cfg = sys.argv[1], json.loads(sys.argv[2])
    result = MODES[mode](cfg)
    rank = MPI.COMM_WORLD.Get_rank()
    write_rank(rank, result | {"rank": rank, "mode": mode, "config": cfg})
