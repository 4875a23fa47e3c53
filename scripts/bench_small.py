"""Does pipelining a small model pay, and does tfsift predict its step?

An MLP (Dense(256) x 4, B=128) in one process (Keras, ``@tfsift.step`` with M=1 and M, the
same microbatching by hand, Keras' and tfsift's ``fit``), and on K=2 stages over many steps
against the step the start-up plan line predicts. The cost per action is
``(t_M - t_1) / (2 (M - 1))``: the same compute in M forwards and backwards, not one each.
"""

from __future__ import annotations

import dataclasses
from statistics import median

import numpy as np
from bench_pipeline import Settings as ChainSettings
from bench_pipeline import run_job

from bench import report
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
    single = run_job(1, "single", c.worker_config() | {"fit_batches": s.fit_batches})[0]
    micro = run_job(1, "microbatched", c.worker_config(M=s.M) | {"floor": True})[0]
    pipelines, calls, startup = {}, {}, {}
    for optimize in s.optimizes:
        for pipeline in c.pipelines:
            key = pipeline if optimize == "speed" else f"{pipeline}, optimize={optimize}"
            say(f"K=2, M={s.M}, {key}: {s.pipeline_steps} steps")
            cfg = c.worker_config(M=s.M, pipeline=pipeline, optimize=optimize)
            cfg |= {"steps": s.pipeline_steps, "collect": False, "time_call": True}
            rank0 = run_job(2, "pipeline", cfg)[0]
            pipelines[key], calls[key] = rank0["times"], rank0["call_times"]
            startup[key] = rank0["startup_predicted_s"]
    times = single["times"]
    return {
        "keras": times["keras"], "tfsift_m1": times["tfsift"],
        "tfsift_m1_eager_update": times["tfsift_eager_update"], "keras_fit": times["keras_fit"],
        "tfsift_fit": times["tfsift_fit"], "tfsift_m": micro["times"],
        "keras_again": micro["keras"], "keras_m": micro["keras_microbatched"],
        "keras_m_fused": micro["keras_microbatched_fused"],
        "predictions": single["predictions"], "pipelines": pipelines, "pipeline_calls": calls,
        "startup_predicted": startup,
    }  # fmt: skip


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.2f}"


def render(raw: Result, meta: Result, s: Settings) -> str:
    keras_s, m1, mm, k1, km, fused, eager = (median(raw[k]) for k in (
        "keras", "tfsift_m1", "tfsift_m", "keras_again", "keras_m", "keras_m_fused",
        "tfsift_m1_eager_update"))  # fmt: skip
    # M=1 and M ran in two jobs, whose speeds differ by a few percent here (as much as the
    # difference sought): M's step is taken at the first job's speed, each job's own Keras
    # step (timed in turn with it) the yardstick
    actions = 2 * (s.M - 1)  # the same compute in M forwards and M backwards, not one each
    per_action = (mm * keras_s / k1 - m1) / actions
    by_hand, floor = (km - k1) / actions, (fused - k1) / actions
    predicted = {p["pipeline"]: p for p in raw["predictions"] if p["M"] == s.M}
    keras_fit, tfsift_fit = (median(raw[k]) / s.fit_batches for k in ("keras_fit", "tfsift_fit"))
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
    rows = [[name, value, *[""] * 8] for name, value in one_process]
    for pipeline, times in raw["pipelines"].items():
        t = np.asarray(times)
        med, p90, p99 = (float(np.percentile(t, q)) for q in (50, 90, 99))
        # runs before the step call was timed alone, or the start-up plan line's prediction
        # saved, stand for it with the whole step and the one-process profile's prediction
        calls = raw.get("pipeline_calls", {}).get(pipeline)
        call = median(calls) if calls else med
        pred = (raw.get("startup_predicted", {}).get(pipeline)
                or predicted[pipeline.split(",")[0]]["predicted_step_s"])  # fmt: skip
        rows.append([
            f"K=2, M={s.M}, {pipeline}", _ms(med), _ms(call), _ms(pred), f"{call / pred:.2f}",
            f"{med / pred:.2f}", _ms(p90), f"{_ms(p99)} ({p99 / med:.2f}x)", _ms(float(t.max())),
            f"{keras_s / med:.2f}",
        ])  # fmt: skip
    overhead = next(iter(predicted.values()))["action_overhead_s"]
    costs = [
        (f"@tfsift.step, M={s.M} in one compiled call (target <= 150; its job's Keras step "
         f"{k1 / keras_s:.2f}x the first's, scaled back)", per_action),
        ("a hand-written TensorFlow loop, one tf.function call a microbatch", by_hand),
        ("the same microbatches in one hand-written tf.function", floor),
        ("tfsift's own: the first row less the third", per_action - floor),
        ("a pipeline stage's action and its message (the one-process profile)", overhead),
    ]  # fmt: skip
    header = [
        "configuration", "median ms", "the step call alone, median ms", "predicted ms",
        "step call / predicted", "whole step / predicted", "p90 ms", "p99 ms", "max ms",
        "one process's Keras step / this",
    ]  # fmt: skip
    return BENCH.section(
        meta, report.table(header, rows),
        "### Cost per action (a forward or backward of one microbatch)",
        report.table(["where", "microseconds"], [[n, f"{1e6 * v:.0f}"] for n, v in costs]),
    )  # fmt: skip


BENCH = Benchmark("small", __doc__.splitlines()[0], Settings(), QUICK, measure, render)

if __name__ == "__main__":
    run(BENCH)
