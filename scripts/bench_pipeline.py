"""How fast is a K=2 pipeline against one process, and what does it cost in memory?

Also the @tfsift.step overhead in one process and 2-rank data parallelism. The reference
is one process running a plain Keras 3 train step (GradientTape, the same loss, SGD, in one
tf.function) on the whole batch B. Each configuration runs in its own ``mpirun`` job, so
that peak RSS is per configuration; each step is timed between barriers (slowest rank),
after warm-up steps, and the median of the timed steps is reported.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from bench import harness, report
from bench.harness import ROOT, Result, say
from bench.main import Benchmark, run
from bench.report import median_ms, table

WORKER = ROOT / "scripts" / "_bench_pipeline_worker.py"
PLOT = ROOT / "docs" / "pipeline_speedup.png"
TIMELINE = ROOT / "docs" / "pipeline_timeline.png"
SPEED_TARGET, OVERHEAD_TARGET, TARGET_M = 0.90, 0.05, 8
CASE_PIPELINE = "interleaved"  # the schedule of the "where we lose" comparisons
TIMELINE_ROW = (TARGET_M, "interleaved", "speed")  # (M, pipeline, optimize) drawn step by step


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one benchmark run measures."""

    model: str = "conv"  # Conv2D(width, 3x3, same) on side x side x width images
    layers: int = 8
    width: int = 128
    side: int = 16
    batch: int = 128  # 8 samples per microbatch at M=16 (see small_batch)
    K: int = 2
    microbatches: tuple[int, ...] = (1, 2, 4, 8, 16)
    pipelines: tuple[str, ...] = ("simple", "interleaved")
    optimizes: tuple[str, ...] = ("speed", "memory")
    warmup: int = 3
    steps: int = 10
    repeats: int = 3  # pipeline jobs per target row (optimize=speed, M >= TARGET_M); odd
    profile_repeats: int = 10
    dense_width: int = 1024  # the memory-bound comparison: Dense(dense_width) x layers
    dense_batch: int = 256
    dense_M: int = 8
    small_batch: int = 64  # the small-microbatch comparison: the same chain, B/M = 4
    small_M: int = 16

    def worker_config(self, **extra: Any) -> Result:
        base = {k: v for k, v in dataclasses.asdict(self).items()
                if k != "repeats" and not k.startswith(("dense_", "small_"))}  # fmt: skip
        return base | {"collect": True} | extra

    def comparisons(self) -> dict[str, Result]:
        """Where we lose (interleaved, optimize=speed): ``dense``, a memory-bound chain of
        Dense layers; ``small``, the main chain with few samples per microbatch."""
        fixed = {"pipeline": CASE_PIPELINE, "optimize": "speed"}
        dense = {"width": self.dense_width, "batch": self.dense_batch, "M": self.dense_M}
        small = {"batch": self.small_batch, "M": self.small_M}
        return {"dense": self.worker_config(model="dense", **dense, **fixed),
                "small": self.worker_config(**small, **fixed)}  # fmt: skip

    def param_bytes(self) -> int:
        """The main chain's float32 weights and biases."""
        per_layer = (9 if self.model == "conv" else 1) * self.width**2 + self.width
        return 4 * self.layers * per_layer


QUICK = Settings(width=32, microbatches=(1, 8), pipelines=("interleaved",), warmup=1, steps=3,
                 repeats=2, dense_width=256, dense_batch=64, small_batch=32, small_M=8)  # fmt: skip


def run_job(np: int, mode: str, config: Result, **options: Any) -> list[Result]:
    """A job of ``WORKER`` on ``np`` ranks (``options``: ``harness.run_job``'s)."""
    return harness.run_job(WORKER, [mode, json.dumps(config)], np, **options)


def run_all(settings: Settings) -> Result:
    """Every job of the benchmark, single-process reference first."""
    raw: Result = {"single": run_job(1, "single", settings.worker_config())[0]}
    raw["pipeline"] = run_grid(settings)
    raw["compare"] = {}
    for name, config in settings.comparisons().items():
        say(f"where we lose ({name}): {config['model']} chain, B={config['batch']}")
        raw["compare"][name] = {
            "reference": run_job(1, "reference", config)[0],
            "k1": run_job(1, "microbatched", config)[0],
            "pipeline": run_job(settings.K, "pipeline", config),
            "reference_after": run_job(1, "reference", config)[0],
        }
    raw["dp"] = run_job(2, "dp", settings.worker_config())
    raw["dp_alone"] = run_job(1, "dp", settings.worker_config(batch=settings.batch // 2))
    return raw


def run_grid(settings: Settings) -> list[Result]:
    """K-rank pipeline jobs, one per (M, schedule, optimize) and ``repeats`` per target row,
    each between two one-process reference jobs: the machine's speed drifts over a run (by
    up to 8% in 25 minutes here), so each speed-up compares a pipeline job with the mean of
    the reference jobs right before and after it (a linear drift cancels)."""
    jobs = []
    before = run_job(1, "reference", settings.worker_config())[0]
    for M in settings.microbatches:
        for pipeline in settings.pipelines:
            for optimize in settings.optimizes:
                config = settings.worker_config(M=M, pipeline=pipeline, optimize=optimize)
                target_row = optimize == "speed" and M >= TARGET_M
                for repeat in range(settings.repeats if target_row else 1):
                    say(f"K={settings.K} B={settings.batch} M={M} {pipeline} {optimize} #{repeat}")
                    ranks = run_job(settings.K, "pipeline", config)
                    after = run_job(1, "reference", settings.worker_config())[0]
                    jobs.append({"references": [before, after], "ranks": ranks})
                    before = after
    return jobs


def ideal(M: int, K: int) -> float:
    """The GPipe bound M*K/(M+K-1) on the speed-up of K equal stages."""
    return M * K / (M + K - 1)


def pipeline_rows(raw: Result, settings: Settings) -> list[Result]:
    """One row per (M, schedule, optimize): from its median-speed-up job if repeated
    (the lower of the middle two for an even number)."""
    groups: dict[tuple[Any, ...], list[Result]] = {}
    for job in raw["pipeline"]:
        cfg = job["ranks"][0]["config"]
        reference = statistics.fmean(median_ms(r["times"]) for r in job["references"])
        row = job_row(job["ranks"], reference, settings) | {"reference_ms": reference}
        groups.setdefault((cfg["M"], cfg["pipeline"], cfg["optimize"]), []).append(row)
    single, rows = raw["single"], []
    for key, repeated in groups.items():
        by_speed = sorted(repeated, key=lambda r: r["speedup"])
        row = by_speed[(len(by_speed) - 1) // 2]
        p = next(p for p in single["predictions"] if (p["M"], p["pipeline"], p["optimize"]) == key)
        rows.append(row | {
            "ratios": [r["speedup"] / r["ideal"] for r in repeated],
            "k1_ms": median_ms(single["microbatched"][str(row["M"])]),
            "predicted": single["whole_batch_compute_s"] / p["predicted_step_s"],
            "predicted_peak_mib": [b / 2**20 for b in p["predicted_peak_bytes"]],
        })  # fmt: skip
    return rows


def job_row(ranks: list[Result], reference_ms: float, settings: Settings) -> Result:
    cfg, step = ranks[0]["config"], median_ms(ranks[0]["times"])
    return {
        "M": cfg["M"], "pipeline": cfg["pipeline"], "optimize": cfg["optimize"],
        "step_ms": step, "speedup": reference_ms / step, "ideal": ideal(cfg["M"], settings.K),
        "bounds": ranks[0]["bounds"], "events": ranks[0]["events"],
        "rss_timed_mib": [r["maxrss_timed_mib"] for r in ranks],
        "rss_whole_mib": [r["maxrss_whole_mib"] for r in ranks],
        "busy_ms": [1000 * (r["action_s"].get("F", 0) + r["action_s"].get("B", 0)) for r in ranks],
    }  # fmt: skip


def summary(raw: Result, settings: Settings) -> Result:
    """What the tables read: the one-process steps, the pipeline rows, the comparisons,
    and the 2-rank data-parallel run against one rank doing half of the work alone."""
    keras_ms, tfsift_ms = (median_ms(raw["single"]["times"][k]) for k in ("keras", "tfsift"))
    per_step = zip(*(r["allreduce"] for r in raw["dp"]), strict=True)
    allreduce_ms = median_ms([max(ts) for ts in per_step])
    nbytes, alone = settings.param_bytes(), raw["dp_alone"][0]
    compare = {}
    for name, jobs in raw["compare"].items():
        reference = statistics.fmean(median_ms(jobs[k]["times"])
                                     for k in ("reference", "reference_after"))  # fmt: skip
        compare[name] = job_row(jobs["pipeline"], reference, settings) | {
            "reference_ms": reference, "k1_ms": median_ms(jobs["k1"]["times"]),
            "batch": jobs["pipeline"][0]["config"]["batch"],
        }  # fmt: skip
    return {
        "keras_ms": keras_ms, "tfsift_ms": tfsift_ms, "overhead": tfsift_ms / keras_ms - 1,
        "rows": pipeline_rows(raw, settings), "compare": compare,
        "dp_ms": median_ms(raw["dp"][0]["times"]), "allreduce_ms": allreduce_ms,
        "allreduce_gbps": nbytes / (allreduce_ms / 1000) / 1e9, "grad_mib": nbytes / 2**20,
        "alone_ms": median_ms(alone["times"]),
        "helper_cpu": max(r["thread_cpu_s"]["other"] / r["timed_wall_s"] for r in raw["dp"]),
        "alone_helper_cpu": alone["thread_cpu_s"]["other"] / alone["timed_wall_s"],
    }  # fmt: skip


def mib(values: list[float]) -> str:
    return report.listed(values, ".0f", " / ")


def ratio_text(row: Result) -> str:
    """measured / ideal of a row: the median job's, with every job's range if repeated."""
    text, ratios = f"{row['speedup'] / row['ideal']:.1%}", row["ratios"]
    if len(ratios) > 1:
        text += f" ({min(ratios):.1%} to {max(ratios):.1%} in {len(ratios)} jobs)"
    return text


def tables(s: Result, settings: Settings) -> tuple[str, ...]:
    """The speed-up, memory, comparison, overhead and data-parallel tables."""
    # fmt: off
    speed = table(
        ("schedule | M | step ms | Keras, before and after: ms | K=1, same M: ms | speed-up "
         "| ideal | predicted | measured / ideal | computing, rank 0 / 1: ms").split(" | "),
        [[r["pipeline"], str(r["M"]), f"{r['step_ms']:.1f}", f"{r['reference_ms']:.1f}",
          f"{r['k1_ms']:.1f}", f"{r['speedup']:.2f}", f"{r['ideal']:.2f}",
          f"{r['predicted']:.2f}", ratio_text(r), mib(r["busy_ms"])]
         for r in s["rows"] if r["optimize"] == "speed"],
    )
    memory = table(
        ("schedule | M | optimize | bounds | step ms | speed-up | peak RSS in steps, rank "
         "0 / 1 (MiB) | whole-run peak RSS, rank 0 / 1 (MiB) | simulator peak, stage 0 / 1 "
         "(MiB)").split(" | "),
        [[r["pipeline"], str(r["M"]), r["optimize"], str(tuple(r["bounds"])),
          f"{r['step_ms']:.1f}", f"{r['speedup']:.2f}", mib(r["rss_timed_mib"]),
          mib(r["rss_whole_mib"]), mib(r["predicted_peak_mib"])]
         for r in sorted(s["rows"], key=lambda r: (r["pipeline"], r["M"], r["optimize"]))],
    )
    cases = {"dense": f"{settings.layers} x Dense({settings.dense_width}): memory-bound"}
    compare = table(
        ("case | B | M | samples per microbatch | plain Keras, B: ms | K=1, same M: ms | K="
         f"{settings.K} ({CASE_PIPELINE}): ms | speed-up | ideal | measured / ideal").split(" | "),
        [[cases.get(name, "the main chain, small microbatches"), str(d["batch"]), str(d["M"]),
          str(d["batch"] // d["M"]), f"{d['reference_ms']:.1f}", f"{d['k1_ms']:.1f}",
          f"{d['step_ms']:.1f}", f"{d['speedup']:.2f}", f"{d['ideal']:.2f}",
          f"{d['speedup'] / d['ideal']:.0%}"]
         for name, d in s["compare"].items()],
    )
    overhead = table(
        ["plain Keras step ms", "@tfsift.step (K=1, M=1) ms", "overhead", "target"],
        [[f"{s['keras_ms']:.1f}", f"{s['tfsift_ms']:.1f}", f"{s['overhead']:+.1%}",
          f"<= {OVERHEAD_TARGET:.0%}"]],
    )
    dp = table(
        ("1 rank, B: ms | 2 ranks, B/2 each: ms | throughput ratio (ideal 2) | allreduce of "
         f"{s['grad_mib']:.1f} MiB: ms | share of step | allreduce bandwidth | 1 rank, B/2 "
         "alone: ms | helper threads' CPU, 2 ranks / 1 rank (share of a core)").split(" | "),
        [[f"{s['tfsift_ms']:.1f}", f"{s['dp_ms']:.1f}", f"{s['tfsift_ms'] / s['dp_ms']:.2f}",
          f"{s['allreduce_ms']:.1f}", f"{s['allreduce_ms'] / s['dp_ms']:.0%}",
          f"{s['allreduce_gbps']:.2f} GB/s", f"{s['alone_ms']:.1f}",
          f"{s['helper_cpu']:.0%} / {s['alone_helper_cpu']:.0%}"]],
    )
    # fmt: on
    return speed, memory, compare, overhead, dp


def targets_table(s: Result) -> str:
    """The issue's targets, met and missed."""
    met: list[str] = []
    missed: list[str] = []
    for r in s["rows"]:
        if r["optimize"] == "speed" and r["M"] >= TARGET_M:
            ok = r["speedup"] >= SPEED_TARGET * r["ideal"]
            (met if ok else missed).append(f"{r['pipeline']} M={r['M']}: {ratio_text(r)} of ideal")
    text = f"step overhead {s['overhead']:+.1%}"
    (met if s["overhead"] <= OVERHEAD_TARGET else missed).append(text)
    target = (f"speed-up >= {SPEED_TARGET:.0%} of ideal for M >= {TARGET_M}; step overhead <= "
              f"{OVERHEAD_TARGET:.0%}")  # fmt: skip
    return table(["target", "met", "missed"], [[target, "; ".join(met), "; ".join(missed)]])


def markdown(s: Result, settings: Settings, meta: Result) -> str:
    speed, memory, compare, overhead, dp = tables(s, settings)
    return BENCH.section(
        meta, targets_table(s), f"### K={settings.K} pipeline speed-up (optimize=speed)", speed,
        "![measured, ideal and predicted speed-up](pipeline_speedup.png)",
        "![a measured pipeline step](pipeline_timeline.png)",
        "### Memory: optimize=speed vs memory", memory, "### Where we lose", compare,
        "### @tfsift.step overhead", overhead, "### Data parallel: 2 ranks vs 1", dp,
    )  # fmt: skip


def plot(s: Result, settings: Settings, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Ms, K = list(settings.microbatches), settings.K
    fig, axes = plt.subplots(1, len(settings.pipelines), figsize=(5 * len(settings.pipelines), 4))
    for ax, pipeline in zip(list(getattr(axes, "flat", [axes])), settings.pipelines, strict=True):
        rows = sorted((r for r in s["rows"] if r["pipeline"] == pipeline), key=lambda r: r["M"])
        for optimize, style in (("speed", "o-"), ("memory", "s-")):
            mine = [r for r in rows if r["optimize"] == optimize]
            ax.plot([r["M"] for r in mine], [r["speedup"] for r in mine], style,
                    label=f"measured ({optimize})")  # fmt: skip
        speed = [r["predicted"] for r in rows if r["optimize"] == "speed"]
        ax.plot(Ms, speed, "^--", label="predicted (speed)")
        ax.plot(Ms, [ideal(M, K) for M in Ms], "k:", label="ideal M*K/(M+K-1)")
        ax.axhline(1.0, color="grey", linewidth=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xticks(Ms, [str(M) for M in Ms])
        ax.set_xlabel("microbatches M")
        ax.set_ylabel(f"speed-up over one process (K={K})")
        ax.set_title(f"{pipeline} schedule, B={settings.batch}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def figures(raw: Result, settings: Settings) -> None:
    """The speed-up plot, and the Gantt chart of the step recorded in the TIMELINE_ROW job."""
    from partitioner.schedule import Action
    from partitioner.simulator import Event
    from tfsift.pipeline.timeline import StepTimeline

    s = summary(raw, settings)
    plot(s, settings, PLOT)
    row = next(r for r in s["rows"] if (r["M"], r["pipeline"], r["optimize"]) == TIMELINE_ROW)
    events = tuple(Event(st, Action.parse(a), b, e) for st, a, b, e in row["events"])
    M, pipeline, optimize = TIMELINE_ROW
    title = f"K={settings.K}, M={M}, {pipeline}, optimize={optimize}"
    StepTimeline(events, settings.K).draw(TIMELINE, title=title)


BENCH = Benchmark(
    "pipeline", __doc__.splitlines()[0], Settings(), QUICK, run_all,
    lambda raw, meta, settings: markdown(summary(raw, settings), settings, meta), figures,
)  # fmt: skip

if __name__ == "__main__":
    run(BENCH)
