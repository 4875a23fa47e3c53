"""Whether two cores of this machine stand in for two devices: one rank's compute alone,
against the same compute while another process computes on the other core.

With overlap, stage 0 scores in its waits for gradients, that is while stage 1
computes. On two devices that costs stage 1 nothing; on two cores of one machine the
processes share caches and memory bandwidth (and, on a virtual machine, perhaps a host
core), so stage 1 may compute slower while stage 0 scores. Process A runs the training
forward and backward of one microbatch through stage 1 of ``bench_overlap.py``'s
4-convolution model on the cut made for sifting (three convolutions, Dense 128 and 10;
B/4 = 32 rows); process B, on the other core, either sleeps or runs overlap's unit as fast
as it can (the first convolution on a source batch of 128 rows, and a Dense head).
Each process has one compute thread and is pinned to its core. The phases alternate,
``--rounds`` times each, so that drift hits both alike; each phase times A's calls for
``--seconds``.

usage: .venv/bin/python scripts/bench_cores.py [--rounds N] [--seconds S]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from typing import Any

B, M = 128, 4  # bench_overlap's batch and microbatches


def pin(core: int) -> None:
    """One core, one compute thread: a rank standing in for a device."""
    os.sched_setaffinity(0, {core})
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)


def stage_1() -> Any:
    """A compiled training forward and backward of stage 1, on one microbatch."""
    import keras
    import tensorflow as tf

    layers = [keras.layers.Conv1D(32, 5, padding="same", activation="relu") for _ in range(3)]
    model = keras.Sequential([*layers, keras.layers.Flatten(), keras.layers.Dense(128),
                              keras.layers.Dense(10)])  # fmt: skip
    x = tf.random.normal((B // M, 40, 32))
    model(x)

    @tf.function
    def step() -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    return step


def unit() -> Any:
    """A compiled scoring call of stage 0 on the cut made for sifting: conv0 and a head."""
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.layers.Conv1D(32, 5, padding="same", activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(10)])  # fmt: skip
    x = tf.random.normal((B, 40, 1))
    model(x)
    return tf.function(lambda: model(x))


def timed(core: int, busy: Any, stop: Any, phase: Any, out: Any, seconds: float) -> None:
    """Process A: in each phase, A's seconds per call (median) after ``phase`` is set."""
    pin(core)
    step = stage_1()
    for _ in range(20):
        step()
    while True:
        phase.wait()
        phase.clear()
        if stop.is_set():
            return
        times, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            step()[0].numpy()
            times.append(time.perf_counter() - start)
        out.put((busy.is_set(), statistics.median(times)))


def neighbour(core: int, busy: Any, stop: Any) -> None:
    """Process B: runs units back to back while ``busy`` is set, else sleeps."""
    pin(core)
    call = unit()
    call()
    while not stop.is_set():
        if busy.is_set():
            call().numpy()
        else:
            time.sleep(0.001)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit(f"needs two cores. Received: cores={cores}")
    ctx = mp.get_context("spawn")
    busy, stop, phase, out = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    a = ctx.Process(target=timed, args=(cores[0], busy, stop, phase, out, args.seconds))
    b = ctx.Process(target=neighbour, args=(cores[1], busy, stop))
    a.start()
    b.start()
    time.sleep(15)  # both import TensorFlow, build and warm up
    results: dict[bool, list[float]] = {False: [], True: []}
    for r in range(2 * args.rounds):
        if r % 2:
            busy.set()
        else:
            busy.clear()
        time.sleep(0.2)
        phase.set()
        was_busy, seconds = out.get()
        results[was_busy].append(seconds)
    stop.set()
    phase.set()
    a.join()
    b.join()
    alone, beside = (statistics.median(results[k]) * 1e3 for k in (False, True))
    print(f"cores {cores[0]} and {cores[1]}, {args.rounds} rounds of {args.seconds:g} s each")
    print("| stage 1's microbatch forward and backward | ms (median of rounds) | per round |")
    print("| --- | --- | --- |")
    for label, key, value in (("alone", False, alone), ("beside units", True, beside)):
        rounds = ", ".join(f"{s * 1e3:.2f}" for s in results[key])
        print(f"| {label} | {value:.2f} | {rounds} |")
    print(f"\nbeside units / alone: {beside / alone:.2f}x")


if __name__ == "__main__":
    main()
