"""Measures the calls the early-exit scorer makes per round, and where overlap puts them.

With ``overlap=True`` stage 0 scores a round one source batch per call inside its waits
for gradients; each call also computes the exit head's gradient on one source batch of
the round before, and the round's first call applies the update (``exit_head.py``); what
no wait had room for is scored in one call at the round, where every stage waits. This script
times those calls on ``scripts/bench_overlap.py``'s 4-convolution model (exit after the
first convolution, as there), in one process with one compute thread, B=128, g=8: the
costs ``tfsift/sift/overlap.py``'s ``WaitModel`` estimates and the comments in
``tfsift/sift/early_exit.py`` cite. It calls the scorer's compiled functions directly.
Each time is the median of ``rounds`` rounds of ``calls`` calls (a first call of a new
size: the median over the sizes).

usage: .venv/bin/python scripts/bench_exit_calls.py [--no-docs] [--calls N]
"""

from __future__ import annotations

import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import datetime  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_dispatch import per_call_us, publish, timing_args  # noqa: E402
from bench_overlap import ConvNet, load  # noqa: E402

import tfsift  # noqa: E402
from tfsift.parallel import runtime  # noqa: E402
from tfsift.sift.early_exit import EarlyExitScorer  # noqa: E402
from tfsift.sift.replicas import ReplicaGroup  # noqa: E402

BEGIN, END = "<!-- exit-calls:begin -->", "<!-- exit-calls:end -->"
B, G, CONVS = 128, 8, 4


def median_ms(fn: Callable[[], Any], calls: int, rounds: int) -> float:
    """``bench_dispatch.per_call_us`` (warm-up calls, then the median round), in ms."""
    return per_call_us(fn, calls, rounds) / 1e3


def scored_round() -> tuple[EarlyExitScorer, np.ndarray, np.ndarray, Any]:
    """The scorer after one round of g source batches scored in one call, the data, and
    the per-sample loss."""
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
    return scorer, x, y, per_sample


def cases(calls: int, rounds: int) -> dict[str, float]:
    scorer, x, y, per_sample = scored_round()
    assert scorer._last is not None
    (features,), (labels,) = scorer._last
    head = scorer._head
    mask = tf.constant((np.arange(G * B) % 2).astype(np.float32))  # half kept
    xb, yb = tf.constant(x[:B]), tf.constant(y[:B])
    xg, yg = tf.constant(x[: G * B]), tf.constant(y[: G * B])
    parts = [tf.identity(features[i * B : (i + 1) * B]) for i in range(G)]
    bounds = tf.constant([0, B], tf.int32)
    chunk = (parts[0], labels[:B], mask[:B], bounds)  # one source batch of the round before
    sums, scale = head.grads(features, labels, mask), tf.constant(1 / (G * B // 2))
    out = {
        "score one source batch (exit layers and head)": median_ms(
            lambda: head._score(xb, yb)[1].numpy(), calls, rounds
        ),
        "score one source batch and learn one of the round before (a unit)": median_ms(
            lambda: head._learn_and_score(xb, yb, *chunk)[1].numpy(), calls, rounds
        ),
        "the same, after the head's update (a round's first unit)": median_ms(
            lambda: head._apply_learn_and_score(xb, yb, sums, scale, *chunk)[1].numpy(),
            calls,
            rounds,
        ),
        f"the head's gradient on {G} source batches, half kept, in one call": median_ms(
            lambda: head.grads(features, labels, mask)[0].numpy(), calls, rounds
        ),
        f"score {G} source batches in one call": median_ms(
            lambda: head._score(xg, yg)[1].numpy(), calls, rounds
        ),
        f"join {G} source batches' exit features (tf.concat)": median_ms(
            lambda: tf.concat(parts, 0).numpy(), calls, rounds
        ),
        "the full model's losses of one source batch (the Spearman check)": median_ms(
            lambda: scorer.full((x[:B], y[:B])), calls, rounds
        ),
        f"the full model's losses of {G} source batches": median_ms(
            lambda: scorer.full((x[: G * B], y[: G * B])), calls, rounds
        ),
    }
    # Stage 0 makes its units between its own forwards and backwards: the same unit
    # right after a training forward and backward of one microbatch (B / 4 samples,
    # microbatches=4 as in bench_overlap) of the same layers, as a plain Keras model
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
    def train(xm: tf.Tensor, ym: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(per_sample(ym, twin(xm, training=True)))
        return list(tape.gradient(loss, twin.trainable_variables))

    xm, ym = tf.constant(x[: B // 4]), tf.constant(y[: B // 4])
    microbatch = lambda: [g.numpy() for g in train(xm, ym)]  # noqa: E731
    unit = lambda: head._learn_and_score(xb, yb, *chunk)[1].numpy()  # noqa: E731
    out["a training forward and backward of one microbatch (B/4 samples)"] = median_ms(
        microbatch, calls, rounds
    )
    out["a unit (row 2) right after that forward and backward, the unit alone timed"] = after_ms(
        unit, microbatch, calls, rounds
    )
    out[
        "a unit through the scorer's path (ExitHead.score): row 2, learning one source "
        "batch of a round scored in one call"
    ] = through_score(head, features, labels, xb, yb, rounds * calls // G)
    firsts = []
    for batches in range(2, G):  # sizes the scorer has not met (it met 1 and G)
        xs, ys = tf.constant(x[: batches * B]), tf.constant(y[: batches * B])
        start = time.perf_counter()
        head._score(xs, ys)[1].numpy()
        firsts.append(time.perf_counter() - start - median_ms_once(scorer, xs, ys))
    out["first call of a new size, less a later call of it (2 to 7 batches)"] = (
        statistics.median(firsts) * 1e3
    )
    out["traces of the scoring function after those sizes"] = float(
        head._score.function.experimental_get_tracing_count()
    )
    return out


def through_score(
    head: Any, features: tf.Tensor, labels: tf.Tensor, xb: tf.Tensor, yb: tf.Tensor, rounds: int
) -> float:
    """The median ``ExitHead.score`` call of one source batch that learns one of a round
    scored in one call (half its rows kept), as overlap's units make them; each round's
    first call, which also applies the head's update, is left out."""
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


def after_ms(fn: Callable[[], Any], before: Callable[[], Any], calls: int, rounds: int) -> float:
    """Like ``median_ms``, but each call of ``fn`` follows a call of ``before`` (untimed)."""
    for _ in range(20):
        before()
        fn()
    means = []
    for _ in range(rounds):
        total = 0.0
        for _ in range(calls):
            before()
            start = time.perf_counter()
            fn()
            total += time.perf_counter() - start
        means.append(total / calls)
    return statistics.median(means) * 1e3


def median_ms_once(scorer: EarlyExitScorer, xs: tf.Tensor, ys: tf.Tensor) -> float:
    """Seconds of a later call of the same size (the median of 5)."""
    times = []
    for _ in range(5):
        start = time.perf_counter()
        scorer._head._score(xs, ys)[1].numpy()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def markdown(results: dict[str, float], calls: int, rounds: int) -> str:
    rows = "\n".join(
        f"| {name} | {value:.0f} |" if name.startswith("traces") else f"| {name} | {value:.2f} |"
        for name, value in results.items()
    )
    return "\n\n".join(
        [
            "## Early-exit scoring calls",
            f"Measured {datetime.date.today().isoformat()} at commit {commit()} by "
            "`.venv/bin/python scripts/bench_exit_calls.py`: "
            f"one process, one compute thread, `bench_overlap.py`'s {CONVS}-convolution "
            f"model, exit after the first convolution, B={B}, g={G}. Median of {rounds} "
            f"rounds of {calls} calls.",
            "| call | milliseconds (or count) |\n|---|---|\n" + rows,
            "With overlap, stage 0 makes the unit calls (rows 2 and 3, for one source "
            "batch) inside its waits for gradients, which is why `WaitModel` prices the "
            "round's first unit apart; a unit learns as many source batches of the round "
            "before as it scores, where the head's update used to learn all of them in "
            "the first unit (row 4 is that gradient alone). Most of a call's cost is "
            "fixed (8 batches in one call, row 5, against one, row 1), so a unit "
            "scores as many source batches as the wait has room for, and what no wait "
            "had room for is one call at the round (row 5, or fewer batches); row 6 is "
            "what joining a round's features at the round cost. The Spearman check runs "
            "the full model on one source batch every 100 rounds (row 7, not row 8). A "
            "call of a size the scorer has not met costs a lookup, not a trace: each "
            "scoring call is traced once, for any batch size, before the first call. "
            "In a pipeline stage 0 makes its units between its own forwards and "
            "backwards, not back to back: row 10 times row 2's unit right after a "
            "training forward and backward of one microbatch of the same layers (row 9"
            "), which leaves less of the unit's state in the caches. Row 11 is row 2's "
            "call as overlap makes it, through ``ExitHead.score``: the arguments built "
            "from the queue of the round to learn, the compiled call, the losses read.",
        ]
    )


def commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


def main() -> None:
    args = timing_args(__doc__.splitlines()[0], 50)
    results = cases(args.calls, args.rounds)
    publish(markdown(results, args.calls, args.rounds), args, (BEGIN, END))


if __name__ == "__main__":
    main()
