"""What does one call of the runtime cost? Fixed costs per action, early exit's calls, input.

Four tables, one process, one compute thread:

- *dispatch*: the calls the pipeline executor makes once per microbatch and action, on a
  model so small (4 x Conv2D(8, 3x3) on one 4x4x8 sample) that a call's time is almost
  all fixed cost: argument handling, dispatch, the gradient tape. It decides how small a
  microbatch can usefully be.
- *early exit*: the calls the early-exit scorer makes per round, and where overlap puts
  them, on bench_overlap's 4-convolution model (exit after the first convolution, B=128,
  g=8): the costs ``tfsift/sift/experimental/overlap.py``'s ``WaitModel`` estimates and
  the comments in ``tfsift/sift/experimental/early_exit.py`` cite.
- *input*: what the training loop's ``next()`` costs per batch on MNIST-1D-sized data in
  memory (24,000 x 40 floats, B=64), read through tf.data or ``tfsift.from_arrays``, plain
  and sifted by InfoBatch from recorded losses: what a small model pays per step for its
  input, and what sifting adds to it.
- *epoch end*: how long a ``for`` loop over a shuffled tf.data dataset takes to end after
  its last batch, when each batch's step took 50 ms (a sleep) and every core is busy
  (one spinning process per core, as a job's other ranks computing), with tf.data's
  autotuner on (its default) and off (what ``tfsift.shard`` and ``fit`` choose,
  ``shard.prompt_end``).

Each time is the median of ``rounds`` rounds of ``calls`` calls (input: of epochs).

usage: .venv/bin/python scripts/bench_calls.py [--quick] [--no-docs] [--json F] [--render F]
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench import report
from bench.harness import Result
from bench.main import Benchmark, run

LAYERS, CHANNELS, SIDE = 4, 8, 4  # the dispatch model
B, G, CONVS = 128, 8, 4  # the early-exit model
ROWS, FEATURES, INPUT_B = 24000, 40, 64  # the input model: MNIST-1D's training set
MLP_WIDTH, MLP_LAYERS = 256, 4  # the update's model: bench_small.py's MLP
STEP_S = 0.05  # a step of the epoch-end loop
WAITED_S = 0.05  # an epoch end slower than this waited (the others take about 1 ms)


@dataclasses.dataclass(frozen=True)
class Settings:
    dispatch_calls: int = 2000
    exit_calls: int = 50
    update_calls: int = 500
    rounds: int = 5
    epoch_steps: int = 40  # the epoch-end loop's steps of STEP_S
    epochs: int = 15  # of the epoch-end loop, per dataset
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


def exit_cases(calls: int, rounds: int) -> dict[str, float]:
    """The early-exit scorer's calls, by table row, in ms (the last row a count)."""
    tf = single_thread()
    import keras
    import numpy as np
    from _bench_overlap_worker import ConvNet, load

    import tfsift
    from tfsift.parallel import runtime
    from tfsift.sift.experimental.early_exit import EarlyExitScorer
    from tfsift.sift.replicas import ReplicaGroup

    tfsift.init({})
    x, y, _, _ = load(4000, 0)
    keras.utils.set_random_seed(0)
    per_sample = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    config = tfsift.SiftConfig(scorer="early_exit", exit_after="first", score_batches=G)
    scorer = EarlyExitScorer(ConvNet(CONVS), per_sample, config, False)
    scorer.bind(ReplicaGroup(runtime.get()))
    scorer.batch_size = B
    scorer((x[: G * B], y[: G * B]))  # builds the model, the exit and the head
    assert scorer._last is not None
    (features,), (labels,) = scorer._last
    head = scorer._head
    mask = tf.constant((np.arange(G * B) % 2).astype(np.float32))  # half kept
    xb, yb = tf.constant(x[:B]), tf.constant(y[:B])
    xg, yg = tf.constant(x[: G * B]), tf.constant(y[: G * B])
    parts = [tf.identity(features[i * B : (i + 1) * B]) for i in range(G)]
    chunk = (parts[0], labels[:B], mask[:B], tf.constant([0, B], tf.int32))
    sums, scale = head.grads(features, labels, mask), tf.constant(1 / (G * B // 2))
    # stage 0 makes its units between its own forwards and backwards: the same unit right
    # after a training forward and backward of one microbatch (B/4 samples) of the layers
    twin = keras.Sequential(
        [keras.Input(x.shape[1:]), keras.layers.Reshape((x.shape[1], 1))]
        + [keras.layers.Conv1D(32, 5, padding="same", activation="relu") for _ in range(CONVS)]
        + [
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ]
    )

    @tf.function
    def train(xm: Any, ym: Any) -> list[Any]:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(per_sample(ym, twin(xm, training=True)))
        return list(tape.gradient(loss, twin.trainable_variables))

    xm, ym = tf.constant(x[: B // 4]), tf.constant(y[: B // 4])
    microbatch = lambda: [g.numpy() for g in train(xm, ym)]  # noqa: E731
    unit = lambda: head._learn_and_score(xb, yb, *chunk)[1].numpy()  # noqa: E731
    timed = {
        "score one source batch (exit layers and head)": lambda: head._score(xb, yb)[1].numpy(),
        "score one source batch and learn one of the round before (a unit)": unit,
        "the same, after the head's update (a round's first unit)": (
            lambda: head._apply_learn_and_score(xb, yb, sums, scale, *chunk)[1].numpy()
        ),
        f"the head's gradient on {G} source batches, half kept, in one call": (
            lambda: head.grads(features, labels, mask)[0].numpy()
        ),
        f"score {G} source batches in one call": lambda: head._score(xg, yg)[1].numpy(),
        f"join {G} source batches' exit features (tf.concat)": lambda: tf.concat(parts, 0).numpy(),
        "the full model's losses of one source batch (the Spearman check)": (
            lambda: scorer.full((x[:B], y[:B]))
        ),
        f"the full model's losses of {G} source batches": lambda: scorer.full(
            (x[: G * B], y[: G * B])
        ),
        "a training forward and backward of one microbatch (B/4 samples)": microbatch,
    }
    out = {name: 1e3 * per_call_s(fn, calls, rounds) for name, fn in timed.items()}
    out["a unit (row 2) right after that forward and backward, the unit alone timed"] = (
        1e3 * per_call_s(unit, calls, rounds, before=microbatch)
    )
    out[
        "a unit through the scorer's path (ExitHead.score): row 2, learning one source "
        "batch of a round scored in one call"
    ] = through_score(head, features, labels, xb, yb, rounds * calls // G)
    out["first call of a new size, less a later call of it (2 to 7 batches)"] = first_call_ms(
        head, x, y
    )
    out["traces of the scoring function after those sizes"] = float(
        head._score.function.experimental_get_tracing_count()
    )
    return out


def through_score(head: Any, features: Any, labels: Any, xb: Any, yb: Any, rounds: int) -> float:
    """The median ``ExitHead.score`` call (ms) of one source batch that learns one of a round
    scored in one call (half its rows kept), as overlap's units make them; each round's
    first call, which also applies the head's update, is left out."""
    import numpy as np

    kept = np.arange(0, G * B, 2)
    times = []
    for r in range(rounds + 2):
        head.learn([features], [labels], kept, B)
        for call in range(G):
            start = time.perf_counter()
            head.score(xb, yb, 1)[1].numpy()
            if call and r >= 2:  # two rounds to warm up
                times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def first_call_ms(head: Any, x: Any, y: Any) -> float:
    """A call of a size the scorer has not met (it met 1 and G batches) less a later one."""
    import tensorflow as tf

    firsts = []
    for batches in range(2, G):
        xs, ys = tf.constant(x[: batches * B]), tf.constant(y[: batches * B])
        call = lambda xs=xs, ys=ys: head._score(xs, ys)[1].numpy()  # noqa: E731
        start = time.perf_counter()
        call()
        first = time.perf_counter() - start
        firsts.append(first - statistics.median(_once(call) for _ in range(5)))
    return statistics.median(firsts) * 1e3


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

    config = tfsift.SiftConfig(
        policy="infobatch", scores="training", stale=rounds + 1, epochs=rounds + 1,
        anneal=0.0, rescale="unbiased", score_batches=g,
    )  # fmt: skip
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

    config = tfsift.SiftConfig(
        policy="infobatch", scores="training", epochs=10, stale=10, rescale="unbiased"
    )

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


def epoch_end_cases(steps: int, epochs: int) -> dict[str, list[float]]:
    """Seconds from the end of a loop's last step to the loop's end (its last ``next()``
    and the iterator's deletion), for each of ``epochs`` epochs of ``steps`` steps of
    ``STEP_S``, by table row."""
    tf = single_thread()
    import numpy as np

    import tfsift

    tfsift.init({})
    x = np.zeros((steps * INPUT_B, FEATURES), np.float32)

    def ends_s(dataset: Any) -> list[float]:
        ends = []
        for _ in range(epochs):
            last = time.perf_counter()
            for _batch in dataset:
                time.sleep(STEP_S)
                last = time.perf_counter()
            ends.append(time.perf_counter() - last)
        return ends

    source, n = tf.data.Dataset.from_tensor_slices(x), len(x)
    with busy_cores():
        return {
            "tf.data: `.shuffle` (full), `.batch`, `.prefetch(2)`; the autotuner on (its "
            "default)": ends_s(source.shuffle(n, seed=0).batch(INPUT_B).prefetch(2)),
            "the same through `tfsift.shard(..., shuffle_buffer)`: the autotuner off": ends_s(
                tfsift.shard(source, n, 0).batch(INPUT_B).prefetch(2)
            ),
        }


@contextlib.contextmanager
def busy_cores() -> Iterator[None]:
    """One process spinning per core, as a job's other ranks computing their last step."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def _once(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(s: Settings) -> Result:
    dispatch = {
        k: 1e6 * per_call_s(f, s.dispatch_calls, s.rounds) for k, f in dispatch_cases().items()
    }
    updates = {k: 1e6 * per_call_s(f, s.update_calls, s.rounds) for k, f in update_cases().items()}
    exits = exit_cases(s.exit_calls, s.rounds)
    return {
        "dispatch": dispatch,
        "update": updates,
        "exit": exits,
        "input": input_cases(s.rounds),
        "trained": trained_cases(s.rounds, s.trained_steps),
        "disk": disk_cases(s.rounds),
        "epoch end": epoch_end_cases(s.epoch_steps, s.epochs),
    }


def render(raw: Result, meta: Result, s: Settings) -> str:
    dispatch = [[name, f"{us:.0f}"] for name, us in raw["dispatch"].items()]
    exits = [
        [name, f"{v:.0f}" if name.startswith("traces") else f"{v:.2f}"]
        for name, v in raw["exit"].items()
    ]
    updates = [[name, f"{us:.0f}"] for name, us in raw.get("update", {}).items()]
    inputs = [[name, f"{us:.0f}"] for name, us in raw.get("input", {}).items()]
    trained = [
        [name, *(f"{us:.0f}" for us in parts.values()), f"{sum(parts.values()) / 1e3:.2f}"]
        for name, parts in raw.get("trained", {}).items()
    ]
    disk = [
        [name, f"{ms:.0f}", f"{files:.0f}", f"{batches:.0f}"]
        for name, (ms, files, batches) in raw.get("disk", {}).items()
    ]
    ends = [
        [
            name,
            str(sum(e > WAITED_S for e in ends)),
            f"{max(ends):.3f}",
            f"{statistics.mean(ends):.3f}",
        ]
        for name, ends in raw.get("epoch end", {}).items()
    ]
    return "\n\n".join(
        [
            "## Fixed cost per call",
            report.provenance(meta, BENCH.command),
            f"One process, one compute thread. Median of {s.rounds} rounds.",
            "### The executor's calls",
            f"{s.dispatch_calls} calls a round. {LAYERS} x Conv2D({CHANNELS}, 3x3) on one "
            f"{SIDE}x{SIDE}x{CHANNELS} sample, so that a call's time is almost all fixed cost.",
            report.table(["call", "microseconds"], dispatch),
            "The executor makes one such call per microbatch and action: the stage forward "
            "and the gradient sum through `Compiled`; stages before the last add a tape "
            "(row 4); the last stage runs forward and backward as one compiled call (row 5).",
            "### The optimizer's update",
            f"{s.update_calls} calls a round. `bench_small.py`'s MLP: Dense({MLP_WIDTH}) x "
            f"{MLP_LAYERS}, relu, on {MLP_WIDTH} features; the same gradients each call.",
            report.table(["update", "microseconds"], updates),
            "Eagerly, Keras 3 runs each variable's update in Python. A `tf.function` of the "
            "update runs it as one graph, and pays TensorFlow's dispatch of every call "
            "(row 1 of the table above); `tfsift.compiled_update`, which `fit` uses, calls "
            "the same graph through `Compiled`.",
            "### Early-exit scoring calls",
            f"{s.exit_calls} calls a round. `bench_overlap.py`'s {CONVS}-convolution model, "
            f"exit after the first convolution, B={B}, g={G}.",
            report.table(["call", "milliseconds (or count)"], exits),
            "With overlap, stage 0 makes the unit calls (rows 2 and 3) inside its waits for "
            "gradients. Most of a call's cost is fixed (row 5 against row 1), so a unit scores "
            "as many source batches as the wait has room for, and what no wait had room for "
            "is one call at the round. A call of a new size costs a lookup, not a trace "
            "(last two rows). Row 10 times row 2's unit right after a training forward and "
            "backward of one microbatch (row 9), as stage 0 makes it between its own actions; "
            "row 11 is the same call through `ExitHead.score`.",
            "### Input per batch",
            f"{ROWS} x {FEATURES} float32 features and int labels in memory (MNIST-1D's "
            f"training set), B={INPUT_B}; microseconds per batch the loop reads, each the "
            f"median of {s.rounds} epochs after an untimed first one. Sifted batches are "
            "recorded (`train.record`) with a fixed loss per sample; InfoBatch prunes about a "
            "quarter of each epoch.",
            report.table(["input", "microseconds per batch"], inputs),
            "Through tf.data every sample passes its shuffle and batch one at a time; "
            "`from_arrays` gathers a batch with one NumPy index per array. A sifting round "
            "has a fixed cost (fingerprints, the table's lookup and merge, the buffer), so "
            "rounds of one source batch cost most per batch; on `from_arrays` InfoBatch plans "
            "the epoch once and never reads a pruned sample.",
            f"The same input, each batch trained: a Dense(128) + Dense(10) classifier, Adam "
            f"through `tfsift.compiled_update`, {s.trained_steps} steps a round of each loop "
            "in turn; microseconds per step of each part of the loop.",
            report.table(
                ["loop", "next()", "step and update", "record", "whole step (ms)"], trained
            ),
            "InfoBatch's step also weights its losses and returns them per sample, and "
            "`record` hands them back. Right after a training step each Python and NumPy "
            "call costs several times what it costs in a loop of them, so the table above "
            "understates what sifting adds to a small model's step: `record` keeps the "
            "step's loss tensors and converts them all at the next epoch's start, and "
            "InfoBatch on `from_arrays` makes an epoch's keys and weights once.",
            "### Data on disk",
            f"The same samples, one file each ({FEATURES} float32, raw), labels in memory; "
            f"B={INPUT_B}, one compute thread, the files in the page cache after the untimed "
            f"first epoch; the median of {s.rounds} epochs.",
            report.table(
                ["input", "milliseconds per epoch", "files read per epoch", "batches per epoch"],
                disk,
            ),
            "A sifted dataset reads its source, so InfoBatch on a tf.data input reads every "
            "file, pruned or not, and prunes after; on `from_rows` it plans the epoch by row "
            "and `load` reads only the rows it keeps. From a disk, rather than the page "
            "cache, each file read costs more and the difference grows with it.",
            "### The end of an epoch",
            f"A `for` loop over {s.epoch_steps} shuffled batches of {INPUT_B} x {FEATURES} "
            "float32, "
            f"each followed by a step of {1000 * STEP_S:.0f} ms (a sleep): an epoch of "
            f"{s.epoch_steps * STEP_S:g} s, {s.epochs} epochs per dataset, beside one "
            "spinning process per core (as the other ranks of a job, still computing). The "
            "wait is the time from the end of the last step to the end of the loop.",
            report.table(
                [
                    "dataset",
                    f"epochs that waited over {1000 * WAITED_S:.0f} ms",
                    "longest wait (s)",
                    "mean wait (s)",
                ],
                ends,
            ),
            "TensorFlow 2.21 can delete an iterator with the autotuner on only when the "
            "autotuner's thread next wakes, and that thread sleeps for periods that double "
            "from 10 ms to 60 s while the iterator lives, so the wait grows with the epoch. "
            "Whether an epoch's end waits is a race, so it is counted over many epochs. "
            "With several ranks, every rank waits for the slowest one's epoch end. "
            "`tfsift.shard`, `fit` and sifting's source reader turn the autotuner off "
            "unless the dataset's options set it.",
        ]
    )


BENCH = Benchmark(
    name="calls",
    question=__doc__.splitlines()[0],
    full=Settings(),
    quick=Settings(
        dispatch_calls=50,
        exit_calls=5,
        update_calls=5,
        rounds=2,
        epoch_steps=4,
        epochs=2,
        trained_steps=20,
    ),
    measure=measure,
    render=render,
)

if __name__ == "__main__":
    run(BENCH)
