"""Does pipelining a small model pay, and does tfsift predict its step?

An MLP as a user would try it (the issue's: Dense(256) x 4, relu, on 256 features, MSE,
SGD, B=128; one compute thread per rank, ranks bound to cores), in one job each:

- one process: a plain Keras step, ``@tfsift.step`` with M=1, the simulator's predicted
  K=2 step for each M, and the runtime's cost per action the profiler charges (the time
  of a microbatch through the runtime's stage code beyond its layers' times);
- one process, ``@tfsift.step`` with M microbatches: what microbatching alone costs, and
  from it the cost per action, ``(t_M - t_1) / (2 (M - 1))`` (the same compute in M
  forwards and M backwards instead of one each; one stage runs them in one compiled call,
  a pipeline's stage makes a call per action); in turn with it, the same
  microbatching written by hand in TensorFlow against the whole-batch Keras step, one
  tf.function call a microbatch and all of them in one call: what the same formula gives
  without tfsift, since a call per microbatch and smaller matrix products cost TensorFlow
  itself (the second is the floor of tfsift's one stage, which runs them in one call);
- K=2 stages, M microbatches: the measured step against the prediction of the plan line
  printed at start-up (which also charges the latency of a message between the stages,
  timed by the two stages there), and its spread
  (median, 90th and 99th percentiles, maximum) over many steps without forced garbage
  collections, as a training loop runs.

usage: .venv/bin/python scripts/bench_small.py [--quick] [--no-docs] [--json F] [--render F]
"""

from __future__ import annotations

import dataclasses
import json
import statistics

import numpy as np
from bench_pipeline import WORKER
from bench_pipeline import Settings as ChainSettings

from bench import harness, report
from bench.harness import Result, say
from bench.main import Benchmark, run


@dataclasses.dataclass(frozen=True)
class Settings:
    chain: ChainSettings = dataclasses.field(
        default_factory=lambda: ChainSettings(
            model="dense", layers=4, width=256, batch=128, microbatches=(4,),
            pipelines=("simple", "interleaved"), optimizes=("speed",), warmup=20, steps=300,
        )
    )  # fmt: skip
    M: int = 4
    pipeline_steps: int = 1000
    fit_batches: int = 20  # an epoch of fit: its time / fit_batches is fit's step
    # the K=2 runs: "memory" recomputes the forward inside one compiled backward, which on
    # stages this small costs less than the eager tape; "speed" then recomputes too
    optimizes: tuple[str, ...] = ("speed", "memory")


QUICK = Settings(
    chain=ChainSettings(
        model="dense", layers=4, width=64, batch=32, microbatches=(4,),
        pipelines=("interleaved",), optimizes=("speed",), warmup=3, steps=20, profile_repeats=2,
    ),
    pipeline_steps=50,
    fit_batches=2,
)  # fmt: skip


def measure(s: Settings) -> Result:
    c = s.chain
    say("one process: Keras, @tfsift.step M=1, the predictions")
    single_cfg = c.worker_config() | {"fit_batches": s.fit_batches}
    single = harness.run_job(WORKER, ["single", json.dumps(single_cfg)], 1, timeout=900)[0]
    say(f"one process: @tfsift.step M={s.M}")
    micro = harness.run_job(
        WORKER,
        ["microbatched", json.dumps(c.worker_config(M=s.M) | {"floor": True})],
        1,
        timeout=900,
    )[0]
    pipelines, calls, startup = {}, {}, {}
    for optimize in s.optimizes:
        for pipeline in c.pipelines:
            key = pipeline if optimize == "speed" else f"{pipeline}, optimize={optimize}"
            say(f"K=2, M={s.M}, {key}: {s.pipeline_steps} steps")
            cfg = c.worker_config(
                M=s.M,
                pipeline=pipeline,
                optimize=optimize,
                steps=s.pipeline_steps,
                collect=False,
                time_call=True,
            )
            ranks = harness.run_job(WORKER, ["pipeline", json.dumps(cfg)], 2, timeout=900)
            pipelines[key] = ranks[0]["times"]
            calls[key] = ranks[0]["call_times"]
            startup[key] = ranks[0]["startup_predicted_s"]
    return {
        "keras": single["times"]["keras"],
        "tfsift_m1": single["times"]["tfsift"],
        "tfsift_m1_eager_update": single["times"]["tfsift_eager_update"],
        "keras_fit": single["times"]["keras_fit"],
        "tfsift_fit": single["times"]["tfsift_fit"],
        "tfsift_m": micro["times"],
        "keras_again": micro["keras"],
        "keras_m": micro["keras_microbatched"],
        "keras_m_fused": micro["keras_microbatched_fused"],
        "predictions": single["predictions"],
        "pipelines": pipelines,
        "pipeline_calls": calls,
        "startup_predicted": startup,
    }


def own_cost(seconds: float) -> str:
    """tfsift's own cost per action in one process: beyond the hand-written floor."""
    if seconds > 0:
        return f"tfsift's own cost per action in one process is {1e6 * seconds:.0f} us"
    return (
        "tfsift adds nothing measurable per action in one process (its step took "
        f"{-1e6 * seconds:.0f} us an action less)"
    )


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.2f}"


def render(raw: Result, meta: Result, s: Settings) -> str:
    c = s.chain
    keras_s = statistics.median(raw["keras"])
    m1, mm = statistics.median(raw["tfsift_m1"]), statistics.median(raw["tfsift_m"])
    k1, km = statistics.median(raw["keras_again"]), statistics.median(raw["keras_m"])
    # M=1 and M ran in two jobs, whose speeds differ by a few percent here (as much as the
    # difference sought): M's step is taken at the first job's speed, each job's own Keras
    # step (timed in turn with it) the yardstick
    per_action = (mm * keras_s / k1 - m1) / (2 * (s.M - 1))
    by_hand = (km - k1) / (2 * (s.M - 1))
    fused = statistics.median(raw["keras_m_fused"])
    floor = (fused - k1) / (2 * (s.M - 1))
    predicted = {p["pipeline"]: p for p in raw["predictions"] if p["M"] == s.M}
    eager = statistics.median(raw["tfsift_m1_eager_update"])
    keras_fit, tfsift_fit = (
        statistics.median(raw[k]) / s.fit_batches for k in ("keras_fit", "tfsift_fit")
    )
    one_process = [
        ("one process, Keras", _ms(keras_s)),
        ("one process, @tfsift.step M=1", _ms(m1)),
        ("one process, @tfsift.step M=1, the update eager (`apply_gradients`)", _ms(eager)),
        (f"one process, Keras `fit` (an epoch of {s.fit_batches} batches / {s.fit_batches})",
         _ms(keras_fit)),
        ("one process, tfsift `fit` (partitions=1, the same)", _ms(tfsift_fit)),
        (f"one process, @tfsift.step M={s.M}", _ms(mm)),
        (f"one process, a hand-written TensorFlow loop, M={s.M} (and its Keras step)",
         f"{_ms(km)} ({_ms(k1)})"),
        (f"one process, the same M={s.M} microbatches in one hand-written tf.function",
         _ms(fused)),
    ]  # fmt: skip
    rows = [[name, value, "", "", "", "", "", ""] for name, value in one_process]
    lines = []
    for pipeline, times in raw["pipelines"].items():
        t = np.asarray(times)
        med, p90, p99 = (float(np.percentile(t, q)) for q in (50, 90, 99))
        # the @tfsift.step call alone, which the plan line predicts (earlier runs timed the
        # whole step only)
        calls = raw.get("pipeline_calls", {}).get(pipeline)
        call = statistics.median(calls) if calls else med
        # the start-up plan line's step (earlier runs saved the one-process profile's only)
        pred = (
            raw.get("startup_predicted", {}).get(pipeline)
            or predicted[pipeline.split(",")[0]]["predicted_step_s"]
        )
        rows.append(
            [
                f"K=2, M={s.M}, {pipeline}",
                _ms(med),
                _ms(call),
                _ms(pred),
                f"{call / pred:.2f}",
                _ms(p90),
                f"{_ms(p99)} ({p99 / med:.2f}x)",
                _ms(float(t.max())),
            ]
        )
        lines.append(
            f"{pipeline}: the step call measured {call / pred:.2f}x the prediction (target: "
            f"within 25%; the whole step, the update included, {med / pred:.2f}x), "
            f"p99 {p99 / med:.2f}x the median (target <= 2x), against one process's Keras "
            f"step {keras_s / med:.2f}x as fast"
        )
    overhead = next(iter(predicted.values()))["action_overhead_s"]
    return "\n\n".join(
        [
            "## Small models: predicted and measured",
            report.provenance(meta, BENCH.command),
            f"Dense({c.width}) x {c.layers}, relu, on {c.width} features, MSE, SGD, B={c.batch}; "
            "one compute thread per rank, ranks bound to cores. One-process rows: median of "
            f"{c.steps} steps after {c.warmup} warm-up steps, each after a garbage collection; "
            f"K=2 rows: {s.pipeline_steps} steps with no forced collection, the slowest rank's "
            "time of steps started together; the optimizer's update is compiled and follows "
            "the `@tfsift.step` call, which *the step call alone* times again as many "
            "times. *predicted*: the step the plan line printed at the K=2 run's start "
            "predicts, the `@tfsift.step` call's forwards and backwards: rank 0 fitted the "
            "runtime's cost per action (its message included) and the layers' times to "
            "prefixes of the model timed through the runtime's stage, and charged a "
            "message's latency between the stages, timed there. *optimize=memory*: each "
            "stage keeps only its inputs and recomputes its forward inside one compiled "
            "backward, instead of running the backward through "
            "the eager tape it kept; optimize=speed does so too where rank 0 timed a "
            "microbatch through the stage faster that way (the plan line says "
            "`optimize=speed with recompute (timed faster)`), as on this model.",
            report.table(
                [
                    "configuration",
                    "median ms",
                    "the step call alone, median ms",
                    "predicted ms",
                    "step call / predicted",
                    "p90 ms",
                    "p99 ms",
                    "max ms",
                ],
                rows,
            ),
            f"What microbatching costs per action (a forward or backward of one microbatch) "
            f"in one process, where one compiled call runs all of a step's microbatches: "
            f"**{1e6 * per_action:.0f} us** (target: <= 150 us; the M={s.M} row's job ran "
            f"its Keras step {k1 / keras_s:.2f}x as long as the first row's, and its step "
            f"is scaled back by that); a hand-written TensorFlow "
            f"loop of one tf.function call a microbatch, by the same formula (its M={s.M} row "
            f"against its Keras step, timed in turn with the row above): "
            f"{1e6 * by_hand:.0f} us; the same microbatches in one hand-written tf.function, "
            f"as tfsift's stage runs them: {1e6 * floor:.0f} us, what the smaller matrix "
            f"products cost TensorFlow itself, so {own_cost(per_action - floor)}. "
            f"On a pipeline's stage each action is a call of its own and a message: the "
            f"one-process job's profile puts their cost at {1e6 * overhead:.0f} us (each "
            f"K=2 job's plan line fits its own at its start). " + "; ".join(lines) + ".",
            f"The optimizer's update: every row above makes it one compiled call, as Keras' "
            f"step, tfsift's `fit` and the README loop (`tfsift.compiled_update`) do; left "
            f"eager, `optimizer.apply_gradients` updates each of the "
            f"{2 * c.layers} variables in Python: {_ms(eager)} ms a step against {_ms(m1)} "
            f"({eager / m1:.2f}x). `fit` per step, the reading of batches and the callbacks "
            f"included: Keras {_ms(keras_fit)} ms, tfsift {_ms(tfsift_fit)} ms "
            f"({tfsift_fit / keras_fit:.2f}x).",
        ]
    )


BENCH = Benchmark(
    name="small",
    question=__doc__.splitlines()[0],
    full=Settings(),
    quick=QUICK,
    measure=measure,
    render=render,
)


if __name__ == "__main__":
    run(BENCH)
