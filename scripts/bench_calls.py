"""What does one call of the runtime cost, and a batch of input?

One process, one compute thread; each time the median of ``rounds`` rounds of ``calls``
calls (input: of epochs). Tables: the executor's calls on a model so small that a call's
time is almost all fixed cost (4 x Conv2D(8, 3x3) on one 4x4x8 sample); the optimizer's
update of bench_small.py's MLP; the input per batch on MNIST-1D-sized arrays (24,000 x 40
floats, B=64) through tf.data or ``tfsift.from_arrays``, plain and sifted by InfoBatch,
alone and with each batch trained; and the same samples one file each on disk.

usage: .venv/bin/python scripts/bench_calls.py [--quick] [--no-docs] [--json F] [--render F]
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench import report
from bench.harness import Result
from bench.main import Benchmark, run

LAYERS, CHANNELS, SIDE = 4, 8, 4  # the dispatch model
ROWS, FEATURES, INPUT_B = 24000, 40, 64  # the input model: MNIST-1D's training set
MLP_WIDTH, MLP_LAYERS = 256, 4  # the update's model: bench_small.py's MLP


@dataclasses.dataclass(frozen=True)
class Settings:
    dispatch_calls: int = 2000
    update_calls: int = 500
    rounds: int = 5
    trained_steps: int = 300  # of each loop of the trained-input table, per round


def per_call_s(
    fn: Callable[[], Any], calls: int, rounds: int, before: Callable[[], Any] | None = None
) -> float:
    """Median over ``rounds`` of the mean time of ``calls`` calls of ``fn``, after 20 warm-up
    calls; with ``before``, each call follows an untimed call of ``before``."""
    for _ in range(20):
        if before is not None:
            before()
        fn()
    means = []
    for _ in range(rounds):
        total = 0.0
        for _ in range(calls):
            if before is not None:
                before()
            start = time.perf_counter()
            fn()
            total += time.perf_counter() - start
        means.append(total / calls)
    return statistics.median(means)


def single_thread() -> Any:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf


def dispatch_cases() -> dict[str, Callable[[], Any]]:
    """The executor's calls, by table row."""
    tf = single_thread()
    import keras

    from tfsift.pipeline.compiled import Compiled

    model = keras.Sequential(
        [keras.Input((SIDE, SIDE, CHANNELS))]
        + [keras.layers.Conv2D(CHANNELS, 3, padding="same") for _ in range(LAYERS)]
    )
    variables = list(model.trainable_variables)
    x = tf.ones((1, SIDE, SIDE, CHANNELS))
    dy = tf.ones_like(x)
    grads = [tf.identity(v.value) for v in variables]

    def add(a: list[Any], b: list[Any], c: Any) -> list[Any]:
        return [p + q for p, q in zip(a, b, strict=True)] + [c]

    polymorphic, compiled = tf.function(add), Compiled(add)
    concrete = polymorphic.get_concrete_function(grads, grads, x)
    forward = Compiled(lambda x: model(x, training=True))

    def fused(x: Any, dy: Any) -> list[Any]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = model(x, training=True)
        return list(tape.gradient(y, [*variables, x], output_gradients=dy))

    fused_call = Compiled(fused)

    def taped() -> Any:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = forward(x)
        return tape.gradient(y, [*variables, x], output_gradients=dy)

    n = 2 * len(grads) + 1
    return {
        f"`tf.function`, {n} tensor arguments": lambda: polymorphic(grads, grads, x),
        "`tfsift.pipeline.compiled.Compiled`, the same function": lambda: compiled(grads, grads, x),
        "its concrete function, called directly": lambda: concrete(grads, grads, x),
        f"stage forward + backward joined by a tape ({LAYERS} tiny layers)": taped,
        f"one compiled forward + backward, as in the last stage ({LAYERS} tiny layers)": (
            lambda: fused_call(x, dy)
        ),
    }


def applying(optimizer: Any, variables: list[Any]) -> Callable[[list[Any]], Any]:
    """``optimizer.apply`` on ``variables``: their closure, not arguments a trace converts."""
    return lambda grads: optimizer.apply(grads, variables)


def update_cases() -> dict[str, Callable[[], Any]]:
    """The optimizer's update of bench_small.py's MLP, by table row."""
    tf = single_thread()
    import keras

    import tfsift

    tfsift.init({"partitions": 1})
    rows: dict[str, Callable[[], Any]] = {}
    for name, make in (("Adam", keras.optimizers.Adam), ("SGD", keras.optimizers.SGD)):
        model = keras.Sequential(
            [keras.Input((MLP_WIDTH,))]
            + [keras.layers.Dense(MLP_WIDTH, activation="relu") for _ in range(MLP_LAYERS)]
        )
        variables = model.trainable_variables
        grads = [tf.fill(v.shape, 1e-6) for v in variables]
        eager, function, compiled = make(1e-3), make(1e-3), make(1e-3)
        for optimizer in (eager, function, compiled):
            optimizer.build(variables)
        in_function = tf.function(applying(function, variables))
        update = tfsift.compiled_update(compiled, model)
        n = len(variables)
        rows |= {
            f"{name}, {n} variables: `optimizer.apply_gradients`, eager": (
                lambda o=eager, g=grads, v=variables: o.apply_gradients(zip(g, v, strict=True))
            ),
            f"{name}: a `tf.function` of `optimizer.apply`": lambda f=in_function, g=grads: f(g),
            f"{name}: `tfsift.compiled_update`": lambda u=update, g=grads: u(g),
        }
    return rows


def input_samples() -> tuple[Any, Any, Any]:
    """The input tables' samples: MNIST-1D-sized float32 features whose first column is
    the row (a batch's rows are found from its features), int labels, and a recorded loss
    per row, which a sifted batch hands back as a training step would."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    y = rng.integers(0, 10, ROWS)
    losses = rng.exponential(size=ROWS)
    x[:, 0] = np.arange(ROWS)
    return x, y, losses


def infobatch(dataset: Any, rounds: int, g: int | None = None) -> Any:
    """``dataset`` sifted by InfoBatch on recorded losses, pruning in every epoch after the
    first (no annealing) for the ``rounds`` timed epochs."""
    import tfsift

    config = tfsift.SiftConfig(policy="infobatch", epochs=rounds + 1, anneal=0.0, score_batches=g)
    return dataset.apply(tfsift.sift(config=config))


def passes(dataset: Any, losses: Any, rounds: int, record: bool) -> Iterator[tuple[float, int]]:
    """Seconds and batches of each of ``rounds + 1`` passes over ``dataset`` (callers time
    all but the first: InfoBatch's first prunes nothing); with ``record`` each batch's
    losses go back, found by the rows in its features' first column."""
    import numpy as np

    for _ in range(rounds + 1):
        start, n = time.perf_counter(), 0
        for element in dataset:
            n += 1
            if record:
                dataset.record(losses[np.asarray(element[0])[:, 0].astype(np.int64)])
        yield time.perf_counter() - start, n


def input_cases(rounds: int) -> dict[str, float]:
    """Microseconds per batch the loop reads, by table row: the median over ``rounds``
    epochs, after one untimed epoch (InfoBatch's first, which prunes nothing); sifted
    batches are recorded with a fixed loss per sample, as a training step would hand
    them back, so that every timed epoch prunes."""
    tf = single_thread()
    import tfsift

    tfsift.init({})
    x, y, losses = input_samples()

    def streamed() -> Any:
        source = tf.data.Dataset.from_tensor_slices((x, y))
        return tfsift.shard(source, ROWS, 0).batch(INPUT_B, drop_remainder=True).prefetch(2)

    def per_batch_us(dataset: Any, record: bool) -> float:
        timed = list(passes(dataset, losses, rounds, record))[1:]
        return statistics.median(1e6 * seconds / max(n, 1) for seconds, n in timed)

    arrays = lambda: tfsift.from_arrays((x, y), INPUT_B)  # noqa: E731
    return {
        "tf.data: `tfsift.shard` (full shuffle), `.batch`, `.prefetch(2)`": per_batch_us(
            streamed(), False
        ),
        "`tfsift.from_arrays`": per_batch_us(arrays(), False),
        "InfoBatch on tf.data, `score_batches=1`": per_batch_us(
            infobatch(streamed(), rounds, 1), True
        ),
        "InfoBatch on tf.data, the default (8 with training scores)": per_batch_us(
            infobatch(streamed(), rounds), True
        ),
        "InfoBatch on `tfsift.from_arrays` (by row)": per_batch_us(
            infobatch(arrays(), rounds), True
        ),
    }


def trained_cases(rounds: int, steps: int) -> dict[str, dict[str, float]]:
    """Microseconds per step of each part of a training loop on ``from_arrays``, plain and
    sifted by InfoBatch (its first epoch: every batch weighted and recorded): ``next()``,
    the ``@tfsift.step`` call with the update, and ``record`` of the step's per-sample
    losses; the median over ``rounds`` rounds of ``steps`` steps of each loop in turn.
    After a training step Python's own calls cost several times what they cost in a loop
    of them alone, which the input table above times."""
    single_thread()
    import keras

    import tfsift

    tfsift.init({})
    x, y, _ = input_samples()

    class Classifier(tfsift.DistributedModel):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = keras.layers.Dense(128, activation="relu")
            self.out = keras.layers.Dense(10)

        def call(self, inputs: Any) -> Any:
            return self.out(self.hidden(inputs))

    model = Classifier()
    losses = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    update = tfsift.compiled_update(keras.optimizers.Adam(1e-3), model)

    @tfsift.step
    def plain(xb: Any, yb: Any) -> Any:
        loss = keras.ops.mean(losses(yb, model(xb, training=True)))
        return tfsift.gradients(loss, model.trainable_variables), loss

    @tfsift.step
    def weighted(xb: Any, yb: Any, wb: Any) -> Any:
        per_sample = losses(yb, model(xb, training=True))
        mean = keras.ops.mean(per_sample * wb)
        return tfsift.gradients(mean, model.trainable_variables), per_sample

    config = tfsift.SiftConfig(policy="infobatch", epochs=10)

    def loop(sifted: bool) -> dict[str, float]:
        dataset = tfsift.from_arrays((x, y), INPUT_B, seed=0)
        if sifted:
            dataset = dataset.apply(tfsift.sift(config=config))
        batches, took = iter(dataset), {"next()": 0.0, "step and update": 0.0, "record": 0.0}
        for _ in range(steps):
            start = time.perf_counter()
            element = next(batches)
            read = time.perf_counter()
            grads, out = (weighted if sifted else plain)(*element)
            update(tfsift.allreduce(grads))
            stepped = time.perf_counter()
            if sifted:
                dataset.record(out)
            took["next()"] += read - start
            took["step and update"] += stepped - read
            took["record"] += time.perf_counter() - stepped
        return {k: 1e6 * v / steps for k, v in took.items()}

    names = {False: "`from_arrays`, plain", True: "`from_arrays`, InfoBatch (its first epoch)"}
    loop(False), loop(True)  # traces both steps
    rounds_of: dict[str, list[dict[str, float]]] = {name: [] for name in names.values()}
    for _ in range(rounds):
        for sifted, name in names.items():
            rounds_of[name].append(loop(sifted))
    return {
        name: {k: statistics.median(r[k] for r in parts) for k in parts[0]}
        for name, parts in rounds_of.items()
    }


def disk_cases(rounds: int) -> dict[str, list[float]]:
    """Per table row: milliseconds per epoch (the median over ``rounds`` after an untimed
    one), files read and batches per epoch, reading one file per sample (the input
    table's samples, their features as raw float32): through tf.data, and through
    ``tfsift.from_rows``, plain and sifted by InfoBatch."""
    tf = single_thread()
    import tempfile

    import numpy as np

    import tfsift

    tfsift.init({})
    x, y, losses = input_samples()
    reads = [0]
    with tempfile.TemporaryDirectory() as folder:
        paths = [f"{folder}/{i}.bin" for i in range(ROWS)]
        for path, row in zip(paths, x, strict=True):
            row.tofile(path)

        def read(path: Any, label: Any) -> Any:
            features = tf.io.decode_raw(tf.io.read_file(path), tf.float32)
            return tf.reshape(features, (FEATURES,)), label

        def streamed() -> Any:
            source = tf.data.Dataset.from_tensor_slices((paths, y))
            source = tfsift.shard(source, ROWS, 0).map(read)
            return source.batch(INPUT_B, drop_remainder=True).prefetch(2)

        def load(rows: Any) -> Any:
            reads[0] += len(rows)
            return np.stack([np.fromfile(paths[r], np.float32) for r in rows]), y[rows]

        def by_row() -> Any:
            return tfsift.from_rows(load, ROWS, INPUT_B)

        def per_epoch(dataset: Any, record: bool, read_all: bool) -> list[float]:
            times, files, batches = [], [], []
            for epoch, (seconds, n) in enumerate(passes(dataset, losses, rounds, record)):
                if epoch:
                    times.append(1e3 * seconds)
                    files.append(ROWS if read_all else reads[0])
                    batches.append(n)
                reads[0] = 0  # the next epoch's reads (the first's include the spec's read)
            return [statistics.median(times), statistics.median(files), statistics.median(batches)]

        return {
            "tf.data: `tfsift.shard`, `.map` (read the file), `.batch`, `.prefetch(2)`": (
                per_epoch(streamed(), False, True)
            ),
            "`tfsift.from_rows` (`load` reads a batch's files)": per_epoch(by_row(), False, False),
            "InfoBatch on that tf.data input": per_epoch(infobatch(streamed(), rounds), True, True),
            "InfoBatch on `tfsift.from_rows` (by row)": per_epoch(
                infobatch(by_row(), rounds), True, False
            ),
        }


def measure(s: Settings) -> Result:
    dispatch = {
        k: 1e6 * per_call_s(f, s.dispatch_calls, s.rounds) for k, f in dispatch_cases().items()
    }
    updates = {k: 1e6 * per_call_s(f, s.update_calls, s.rounds) for k, f in update_cases().items()}
    return {
        "dispatch": dispatch,
        "update": updates,
        "input": input_cases(s.rounds),
        "trained": trained_cases(s.rounds, s.trained_steps),
        "disk": disk_cases(s.rounds),
    }


def render(raw: Result, meta: Result, s: Settings) -> str:
    def us(name: str) -> list[list[str]]:
        return [[row, f"{value:.0f}"] for row, value in raw.get(name, {}).items()]

    trained = [
        [name, *(f"{t:.0f}" for t in parts.values()), f"{sum(parts.values()) / 1e3:.2f}"]
        for name, parts in raw.get("trained", {}).items()
    ]
    disk = [
        [name, f"{ms:.0f}", f"{files:.0f}", f"{batches:.0f}"]
        for name, (ms, files, batches) in raw.get("disk", {}).items()
    ]
    parts = ["next()", "step and update", "record", "whole step (ms)"]
    return "\n\n".join(
        [
            report.provenance(meta, BENCH.command),
            "### The executor's calls",
            report.table(["call", "microseconds"], us("dispatch")),
            "### The optimizer's update",
            report.table(["update", "microseconds"], us("update")),
            "### Input per batch",
            report.table(["input", "microseconds per batch"], us("input")),
            report.table(["loop, each batch trained", *parts], trained),
            "### Data on disk",
            report.table(["input", "ms per epoch", "files read per epoch", "batches"], disk),
        ]
    )


BENCH = Benchmark(
    name="calls",
    question=__doc__.splitlines()[0],
    full=Settings(),
    quick=Settings(
        dispatch_calls=50,
        update_calls=5,
        rounds=2,
        trained_steps=20,
    ),
    measure=measure,
    render=render,
)

if __name__ == "__main__":
    run(BENCH)
