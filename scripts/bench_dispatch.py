"""Measures the fixed cost of the calls the pipeline executor makes once per microbatch.

On a model so small that its kernels take a few microseconds, the time of a call is
its fixed cost: argument handling, dispatch, the gradient tape. The pipeline pays it
once per microbatch and action, so it decides how small a microbatch can usefully be.
One process, one compute thread; each time is the median of ``rounds`` rounds of
``calls`` calls.

usage: .venv/bin/python scripts/bench_dispatch.py [--no-docs] [--calls N]
"""

from __future__ import annotations

import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import argparse  # noqa: E402
import datetime  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_pipeline import write_section  # noqa: E402

from tfsift.pipeline.compiled import Compiled  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- dispatch:begin -->", "<!-- dispatch:end -->"
LAYERS, CHANNELS, SIDE = 4, 8, 4


def per_call_us(fn: Callable[[], Any], calls: int, rounds: int) -> float:
    """Median over ``rounds`` of the mean time of ``calls`` calls, in microseconds."""
    for _ in range(20):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return 1e6 * statistics.median(times)


def cases() -> dict[str, Callable[[], Any]]:
    """What to time, by table row."""
    model = keras.Sequential(
        [keras.Input((SIDE, SIDE, CHANNELS))]
        + [keras.layers.Conv2D(CHANNELS, 3, padding="same") for _ in range(LAYERS)]
    )
    variables = list(model.trainable_variables)
    x = tf.ones((1, SIDE, SIDE, CHANNELS))
    dy = tf.ones_like(x)
    grads = [tf.identity(v.value) for v in variables]

    def add(a: list[tf.Tensor], b: list[tf.Tensor], c: tf.Tensor) -> list[tf.Tensor]:
        return [p + q for p, q in zip(a, b, strict=True)] + [c]

    polymorphic, compiled = tf.function(add), Compiled(add)
    concrete = polymorphic.get_concrete_function(grads, grads, x)
    forward = Compiled(lambda x: model(x, training=True))

    def fused(x: tf.Tensor, dy: tf.Tensor) -> list[tf.Tensor]:
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


def markdown(results: dict[str, float], calls: int, rounds: int) -> str:
    rows = "\n".join(f"| {name} | {us:.0f} |" for name, us in results.items())
    return "\n\n".join(
        [
            "## Fixed cost per call",
            f"Measured {datetime.date.today().isoformat()} by `scripts/bench_dispatch.py`: "
            f"one process, one compute thread, {LAYERS} x Conv2D({CHANNELS}, 3x3) on one "
            f"{SIDE}x{SIDE}x{CHANNELS} sample, so that a call's time is almost all fixed "
            f"cost. Median of {rounds} rounds of {calls} calls.",
            "| call | microseconds |\n|---|---|\n" + rows,
            "The executor makes one such call per microbatch and action: the stage forward "
            "and the gradient sum through `Compiled`; stages before the last add a tape "
            "(row 4); the last stage runs forward and backward as one compiled call "
            "(row 5).",
        ]
    )


def timing_args(description: str, calls: int) -> argparse.Namespace:
    """The options of a script that times calls with ``per_call_us`` (``calls`` per round)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/")
    parser.add_argument("--calls", type=int, default=calls, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the median is kept")
    return parser.parse_args()


def publish(text: str, args: argparse.Namespace, markers: tuple[str, str]) -> None:
    """Prints ``text`` and, unless ``--no-docs``, writes it between ``markers`` of the docs."""
    print(text)
    if not args.no_docs:
        write_section(text, DOC, markers)


def main() -> None:
    args = timing_args(__doc__.splitlines()[0], 2000)
    results = {name: per_call_us(fn, args.calls, args.rounds) for name, fn in cases().items()}
    publish(markdown(results, args.calls, args.rounds), args, (BEGIN, END))


if __name__ == "__main__":
    main()
