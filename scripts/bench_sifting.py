"""Benchmarks data sifting: training seconds to a held-out target, against no sifting.

Per task and seed one job (``scripts/_bench_sifting_worker.py``) trains a fresh model with
every method in turn from the same initial weights, no sifting first and last; per seed the
target is the first no-sifting run's final metric within a margin, and a method's speed-up
is no sifting's training seconds to it over the method's (``how_text`` says it in full).

usage: .venv/bin/python scripts/bench_sifting.py [--quick] [--no-docs] [--json P] [--render P]
       .venv/bin/python scripts/bench_sifting.py --pipeline-only [--methods NAME ...] [--seeds N]
           (the 2-stage jobs alone, printed; no sifting runs first and last in each anyway)
       .venv/bin/python scripts/bench_sifting.py --epochs [--quick] [--no-docs] [--json P]
           [--tasks NAME ...] [--seeds N]
           (a fixed epoch budget: every method trains for the same epochs as no sifting, on
           one process and on the 2-stage pipeline, every task; the docs' section
           ``sifting-epochs``; a subset of tasks or other seeds print only: add --no-docs)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import harness, report
from bench.harness import Result, say
from bench.main import Benchmark, parser, run

WORKER = harness.ROOT / "scripts" / "_bench_sifting_worker.py"
PLOT = harness.ROOT / "docs" / "sifting_time_to_target.png"
CACHE = Path.home() / ".cache" / "tfsift" / "bench_sifting"
PARTIAL = CACHE / "partial-jobs.json"  # the jobs done so far, rewritten after each
ACCURACY_SLACK, MSE_SLACK = 0.005, 0.02  # the target's distance from the no-sifting run's final
TARGET_SPEEDUP, TARGET_TASKS = 1.3, 2  # the bar: >= 1.3x on >= 2 tasks, within 0.5 point
QUESTION = (
    f"Does data sifting reach no sifting's held-out metric in fewer training seconds, by "
    f">= {TARGET_SPEEDUP}x on >= {TARGET_TASKS} tasks (the issue's bar)?"
)


@dataclasses.dataclass(frozen=True)
class Task:
    """A data set, a model and how long the run without sifting trains."""

    name: str
    title: str
    data: str  # mnist1d, digits or friedman (see the worker's loaders)
    loss: str  # "ce" (accuracy is the metric) or "mse" (the held-out MSE is)
    model: tuple[str, int, int, int]  # (cnn|mlp, width, layers, hidden)
    samples: int = 30000  # generated, 80% train (mnist1d, friedman)
    noise: float = 0.0  # fraction of training labels flipped to another class
    batch: int = 64
    lr: float = 2e-3
    epochs: int = 3  # the run without sifting
    delay: int = 0  # source batches each sifting run trains on unsifted first
    # Evaluated every this many optimizer steps, the same steps for every method, so
    # that a rerun of the same trajectory is evaluated at the same points and its ratio
    # to the first run measures the speed of its steps alone (the noise floor); on a
    # grid of training seconds the two runs also met the target at different steps.
    eval_every: int = 100

    def worker_config(self) -> Result:
        kind, width, layers, hidden = self.model
        config = dataclasses.asdict(self) | {"data_seed": 0}
        return config | {
            "model": {"kind": kind, "width": width, "layers": layers, "hidden": hidden}
        }

    def model_text(self) -> str:
        kind, width, layers, hidden = self.model
        if kind == "cnn":
            return f"{layers} x Conv1D({width}, 5) + Dense({hidden})"
        return f"{layers} x Dense({width})"


@dataclasses.dataclass(frozen=True)
class Method:
    """One sifting setting, the same on every task. ``keep="kept:<name>"``: what that run kept."""

    name: str
    policy: str  # a SiftConfig policy, or "none"
    beta: float = 1.0
    keep: float | str = 0.5
    scorer: str = "full"
    exit_after: str | None = None  # early exit: None is SiftConfig's default exit
    stale: int | str = 0  # epochs a sample's loss is reused (Stale-SB); "epochs": the task's
    overlap: bool = False  # early exit on a pipeline: score in stage 0's waits
    leftover: str = "score"  # overlap: "keep" keeps unscored what no wait had room for
    scores: str = "forward"  # "training": the loss each sample had when last trained
    rescale: str | None = None  # the sample weights the training step applies
    prune: float = 0.5  # infobatch (whose epochs are the task's)
    anneal: float = 0.125  # infobatch
    # the input: "tf.data" (shard, shuffle, batch) or "arrays" (tfsift.from_arrays: by row)
    source: str = "tf.data"
    # added to the data order's seed (the initial weights stay the seed's): no sifting in
    # another order shows how far the end moves with the order alone
    order: int = 0

    def setting(self) -> str:
        return self._setting() + (", from_arrays" if self.source == "arrays" else "")

    def _setting(self) -> str:
        if self.name == AGAIN:
            return "no sifting, again after the others"
        if self.name == NONE_TF_DATA:
            return "no sifting, tf.data input (shard, shuffle, batch)"
        if self.name == NONE_ORDER:
            return "no sifting, another data order (the same initial weights)"
        if self.policy == "none":
            return "no sifting"
        if self.policy == "relative":
            text = f"relative, beta={self.beta:g}"
        elif self.policy == "infobatch":
            text = f"infobatch, prune={self.prune:g}, anneal={self.anneal:g}"
        elif isinstance(self.keep, str):
            text = f"{self.policy}, keep = {self.keep.split(':', 1)[1]}'s kept fraction"
        else:
            text = f"{self.policy}, keep={self.keep:g}"
        if self.scorer == "early_exit":
            text += f", early exit after {self.exit_after}" if self.exit_after else ", early exit"
        text += ", overlap" if self.overlap else ""
        text += ", leftover kept" if self.leftover == "keep" else ""
        text += ", training scores" if self.scores == "training" else ""
        text += f", rescale={self.rescale}" if self.rescale else ""
        return text + (f", stale={self.stale}" if self.stale else "")


AGAIN = "none-again"  # no sifting once more, last in each job: the baselines' own spread
NONE_TF_DATA = "none-tf.data"  # the epoch budget's: no sifting on the tf.data input
NONE_ORDER = "none-order"  # the epoch budget's: no sifting in another data order
NONE = Method("none", "none")
# scores="training" needs stale >= 1; infobatch also rescale, and stale = its epochs keeps
# every score it ever recorded (the reference's table)
TRAINING = Method("relative-1-training", "relative", beta=1.0, stale=1, scores="training")
INFOBATCH = Method("infobatch", "infobatch", stale="epochs", scores="training",
                   rescale="unbiased", prune=0.5, anneal=0.125)  # fmt: skip
METHODS = (
    NONE,
    Method("relative-1", "relative", beta=1.0),
    Method("relative-3", "relative", beta=3.0),
    Method("relative-1-exit", "relative", beta=1.0, scorer="early_exit"),
    Method("relative-3-exit", "relative", beta=3.0, scorer="early_exit"),
    Method("adaptive", "adaptive", keep=0.5),
    Method("uniform", "uniform", keep="kept:relative-1"),
    Method("relative-1-stale", "relative", beta=1.0, stale=1),
    TRAINING,
    INFOBATCH,
    Method(AGAIN, "none"),
)
OVERLAP = Method("relative-1-exit-overlap", "relative", scorer="early_exit", overlap=True)
OVERLAP_KEEP = dataclasses.replace(OVERLAP, name="relative-1-exit-overlap-keep", leftover="keep")
PIPELINE_METHODS = (
    NONE, METHODS[1], METHODS[3], OVERLAP, OVERLAP_KEEP, TRAINING, INFOBATCH, METHODS[-1]
)  # fmt: skip
SMALL_CNN = ("cnn", 32, 2, 128)
# fmt: off
TASKS = (
    Task("mnist1d", "MNIST-1D", "mnist1d", "ce", SMALL_CNN, epochs=5, delay=188, eval_every=100),
    Task("mnist1d-noisy", "MNIST-1D, 20% labels flipped", "mnist1d", "ce", SMALL_CNN, noise=0.2,
         epochs=5, delay=188, eval_every=100),
    Task("digits", "digits (8x8)", "digits", "ce", ("mlp", 128, 1, 0), batch=32, epochs=30,
         delay=45, eval_every=20),
    Task("friedman", "Friedman #1 regression", "friedman", "mse", ("mlp", 64, 2, 0),
         samples=20000, epochs=8, delay=125, eval_every=50),
    Task("mnist1d-wide", "MNIST-1D, wide CNN", "mnist1d", "ce", ("cnn", 64, 3, 256), epochs=2,
         delay=188, eval_every=50),
)
# fmt: on


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one benchmark run measures."""

    tasks: tuple[Task, ...] = TASKS
    methods: tuple[Method, ...] = METHODS
    seeds: tuple[int, ...] = (0, 1, 2)
    pipeline_task: str = "mnist1d"  # "" skips the 2-stage runs
    one_process: bool = True  # False: the 2-stage runs alone (--pipeline-only)
    pipeline_methods: tuple[Method, ...] = PIPELINE_METHODS
    partitions: int = 2
    microbatches: int = 4
    score_batches: int = 8  # g: source batches scored in one call, every sifting method
    budget_factor: float = 1.25  # a sifting run trains this x the no-sifting run's seconds
    max_epochs: int = 200  # a cap on a sifting run's source epochs, far above any here
    fixed_epochs: bool = False  # True: every method trains for the task's epochs
    pipeline_tasks: tuple[str, ...] = ()  # with fixed_epochs: these run on the pipeline too

    def jobs(self) -> list[Result]:
        """Every job, in the order they run: per seed, each task, then the pipeline."""
        K, M, out = self.partitions, self.microbatches, []
        for seed in self.seeds:
            out += [self.job(t, seed, self.methods, 1, 1) for t in self.tasks if self.one_process]
            names = self.pipeline_tasks or (self.pipeline_task,)
            pipeline = [t for t in self.tasks if t.name in names]
            out += [self.job(t, seed, self.pipeline_methods, K, M) for t in pipeline]
        return out

    def job(self, task: Task, seed: int, methods: tuple[Method, ...], K: int, M: int) -> Result:
        """What the worker reads: the task, the seed, the methods in order, the layout."""
        keys = ("score_batches", "budget_factor", "max_epochs", "fixed_epochs")
        config = {k: getattr(self, k) for k in keys}
        return config | {
            "task": task.worker_config(),
            "seed": seed,
            "methods": [dataclasses.asdict(m) for m in methods],
            "partitions": K,
            "microbatches": M,
            "cache": str(CACHE),
        }


def quick_task(task: Task) -> Task:
    """The same task on a few thousand samples for about one epoch: a smoke test."""
    return dataclasses.replace(
        task,
        samples=3000,
        epochs=1 if task.data != "digits" else 3,
        delay=min(task.delay, 8),
        eval_every=10,
    )


QUICK = Settings(tasks=tuple(quick_task(t) for t in TASKS), seeds=(0,))
FULL = Settings()


# ---------------------------------------------------------------- measuring


def measure(settings: Settings) -> Result:
    """Every job, one at a time; a failed job is tried once more."""
    jobs, out = settings.jobs(), []
    for i, job in enumerate(jobs):
        K = job["partitions"]
        say(f"[{i + 1}/{len(jobs)}] {job['task']['name']}, seed {job['seed']}, K={K}")
        try:
            ranks = harness.run_job(WORKER, [json.dumps(job)], K, mpi=K > 1)
        except RuntimeError as error:
            say(f"{error}\ntrying the job once more")
            ranks = harness.run_job(WORKER, [json.dumps(job)], K, mpi=K > 1)
        out.append({"job": job, "ranks": ranks})
        PARTIAL.write_text(json.dumps({"jobs": out}))  # what a cut-short run measured
    return {"jobs": out}


def jobs_of(raw: Result | list[Result]) -> list[Result]:
    """The jobs' reports (a --json file from before the harness holds the list itself)."""
    return raw if isinstance(raw, list) else list(raw["jobs"])


# ---------------------------------------------------------------- summarising (pure)


def target(final: float, regression: bool) -> float:
    """The no-sifting run's final metric, less 0.5 point of accuracy or plus 2% of MSE."""
    return final * (1 + MSE_SLACK) if regression else final - ACCURACY_SLACK


def reached(metric: float, goal: float, regression: bool) -> bool:
    return metric <= goal if regression else metric >= goal


def first_reach(curve: list[list[float]], goal: float, regression: bool) -> list[float] | None:
    """The first ``[seconds, steps, samples, metric]`` point that reaches ``goal``."""
    return next((p for p in curve if reached(p[3], goal, regression)), None)


def metric_at(curve: list[list[float]], seconds: float) -> float:
    """The metric of the last evaluation at or before ``seconds`` of training."""
    return [p for p in curve if p[0] <= seconds + 1e-9][-1][3]


def seed_rows(ranks: list[Result], regression: bool) -> dict[str, Result]:
    """Per method of one job (rank 0's records): its target, when it reached it, and more."""
    results = {r["method"]: r for r in ranks[0]["results"]}
    base = results["none"]["curve"]
    goal = target(base[-1][3], regression)
    first = first_reach(base, goal, regression) or base[-1]  # reached by construction
    # No sifting's time to target: the mean of its two runs, first and last in the job,
    # so that a drift of the machine's speed during the job (or a slow first run) does not
    # favour the methods; the repeat's own row compares it with the first run.
    again = first_reach(results.get(AGAIN, {}).get("curve", []), goal, regression)
    mean = [(a + b) / 2 for a, b in zip(first, again, strict=True)] if again else first
    job = (goal, base[-1][0], base[-1][0] / max(1, base[-1][1]), regression)
    return {n: seed_row(r, first if n == AGAIN else mean, *job) for n, r in results.items()}


def seed_row(
    r: Result, reference: list[float], goal: float, base_end: float, base_step: float, reg: bool
) -> Result:
    """One run against the target and the no-sifting ``reference`` point that reached it."""
    if "curve" not in r or r.get("status"):
        return {"status": r.get("status", "failed")}
    hit = first_reach(r["curve"], goal, reg) or [math.inf] * 4
    end = r["curve"][-1]
    return {
        "regression": reg,
        "target": goal,
        "seconds": hit[0],
        "steps": hit[1],
        "samples": hit[2],
        "speedup": reference[0] / hit[0] if hit[0] > 0 else 0.0,  # 0: never
        "steps_ratio": hit[1] / reference[1] if reference[1] else math.inf,
        "at_base_end": metric_at(r["curve"], base_end),
        "final": end[3],
        "train_s": end[0],
        "step_s": end[0] / max(1, end[1]),
        "sift": r.get("sift", {}),
        "extra_ms": [1000 * x for x in extra_per_step(r, base_step)],
        "flipped": r.get("flipped", math.nan),
        "off_clock": sum(r.get("off_clock_s", [])),
    }


def extra_per_step(result: Result, base_step: float) -> list[float]:
    """Seconds per optimizer step beyond no sifting's: [scoring, selecting + refilling, rest]."""
    steps = max(1, result["curve"][-1][1])
    sift = result.get("sift", {})
    extra = result["curve"][-1][0] / steps - base_step
    scoring = sift.get("time_scoring", 0.0) / steps
    selecting = (sift.get("time_selecting", 0.0) + sift.get("time_accumulating", 0.0)) / steps
    return [scoring, selecting, extra - scoring - selecting]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def summarise(raw: list[Result]) -> dict[str, list[Result]]:
    """Per ``task`` (``task@K2`` for the pipeline): one row per method, medians over seeds."""
    return {key: method_rows(entries) for key, entries in by_task(raw).items()}


def by_task(raw: list[Result]) -> dict[str, list[Result]]:
    """The jobs (one a seed) of each ``task`` (``task@K2`` for the pipeline)."""
    groups: dict[str, list[Result]] = {}
    for entry in raw:
        groups.setdefault(job_key(entry["job"]), []).append(entry)
    return groups


def job_key(job: Result) -> str:
    """The task's name, with ``@K<partitions>`` for a pipeline job."""
    name = str(job["task"]["name"])
    return name + (f"@K{job['partitions']}" if job["partitions"] > 1 else "")


def method_rows(entries: list[Result]) -> list[Result]:
    regression = entries[0]["job"]["task"]["loss"] == "mse"
    per_seed = [seed_rows(e["ranks"], regression) for e in entries]
    rows = []
    for method in entries[0]["job"]["methods"]:
        name = method["name"]
        seeds = [s[name] for s in per_seed if "seconds" in s.get(name, {})]
        if seeds:
            base_step = median([s["none"]["step_s"] for s in per_seed])
            rows.append(aggregate(seeds, base_step) | {"method": name, "definition": method})
        else:
            status = next((s[name]["status"] for s in per_seed if name in s), "failed")
            rows.append({"method": name, "status": status, "definition": method})
    for row in rows:
        row["regression"] = regression
    return rows


def aggregate(seeds: list[Result], base_step: float) -> Result:
    """Medians over seeds of one method's per-seed rows."""
    sift = [s["sift"] for s in seeds if s["sift"]]

    def pick(key: str) -> list[Any]:
        return [s[key] for s in seeds]

    def from_sift(key: str) -> float:
        return median([s[key] for s in sift if key in s])

    medians = {k: median(pick(k)) for k in MEDIANS}
    return medians | {
        "speedups": pick("speedup"),
        "margin": median([margin(s) for s in seeds]),
        "step_cost": medians["step_s"] / base_step,
        "kept": from_sift("kept_fraction") if sift else 1.0,
        "scoring_s": from_sift("time_scoring") if sift else 0.0,
        "spearman": from_sift("exit_spearman"),
        "flipped": median([f for f in pick("flipped") if not math.isnan(f)]),
        "extra_ms": [median([s["extra_ms"][i] for s in seeds]) for i in range(3)],
    }


MEDIANS = ("target", "seconds", "speedup", "steps", "steps_ratio", "samples", "at_base_end",
           "final", "train_s", "step_s", "off_clock")  # fmt: skip


def margin(row: Result) -> float:
    """How far the metric at no sifting's last second is past the target (>= 0: reached)."""
    at, goal = float(row["at_base_end"]), float(row["target"])
    return goal - at if row["regression"] else at - goal


def sifting_rows(summary: dict[str, list[Result]], pipeline: bool = False) -> list[Result]:
    """The rows of sifting methods that ran, each with its ``task``."""
    return [
        r | {"task": task}
        for task, rows in summary.items()
        if ("@" in task) == pipeline
        for r in rows
        if r["method"] not in ("none", AGAIN) and "seconds" in r
    ]


def verdict(summary: dict[str, list[Result]]) -> Result:
    """The issue's bar, per task: methods >= 1.3x to target whose metric at the no-sifting
    run's final second is within the target (0.5 point, or 2% of MSE)."""
    passing: dict[str, list[str]] = {}
    for row in sifting_rows(summary):
        if row["speedup"] >= TARGET_SPEEDUP and row["margin"] >= 0:
            passing.setdefault(row["task"], []).append(row["method"])
    return {"passing": passing, "met": len(passing) >= TARGET_TASKS}


# ---------------------------------------------------------------- Markdown


def finite(value: float, spec: str) -> str:
    """``value`` formatted, or *never* for the infinity of a target never reached."""
    return "never" if math.isinf(value) else format(value, spec)


def metric_text(value: float, regression: bool) -> str:
    return f"{value:.4f}" if regression else f"{100 * value:.2f}%"


def speedup_text(row: Result) -> str:
    if row["method"] == "none":
        return "1"
    each = ", ".join(speedup_value(s) for s in row["speedups"])
    return f"**{speedup_value(row['speedup'])}** ({each})"


def steps_speedup_text(row: Result) -> str:
    """The speed-up in optimizer steps to the target, median then per seed."""
    each = ", ".join(speedup_value(x) for x in row["steps_speedups"])
    return f"{speedup_value(row['steps_speedup'])} ({each})"


def speedup_value(value: float) -> str:
    """A speed-up; 0 stands for a run that never reached the target."""
    return "never" if value == 0 else f"{value:.2f}"


def samples_text(value: float) -> str:
    return "never" if math.isinf(value) else f"{value / 1000:.0f}k"


def result_rows(task: str, rows: list[Result]) -> list[list[str]]:
    out = []
    for row in rows:
        name = f"{task}: {Method(**row['definition']).setting()}"
        if "seconds" not in row:
            out.append([name, *["n/a"] * 8, row["status"]])
            continue
        reg, seconds = row["regression"], finite(row["seconds"], ".1f")
        if row["method"] == "none":
            seconds += f" (target {metric_text(row['target'], reg)})"
        spearman = "" if math.isnan(row["spearman"]) else f"Spearman {row['spearman']:.2f}"
        out.append([
            name, f"{row['kept']:.2f}", seconds, speedup_text(row),
            metric_text(row["at_base_end"], reg), metric_text(row["final"], reg),
            samples_text(row["samples"]), f"{row['step_cost']:.2f}",
            f"{row['scoring_s']:.1f} / {row['train_s']:.1f}", spearman,
        ])  # fmt: skip
    return out


RESULT_HEADER = (
    "task: method | kept | time to target: s | speed-up (per seed) | metric at no sifting's "
    "last second | metric at the end | samples backpropagated to target | s per step / no "
    "sifting's | scoring s / training s | note"
).split(" | ")


def results_table(summary: dict[str, list[Result]], pipeline: bool) -> str:
    return layout_table(summary, pipeline, RESULT_HEADER, result_rows)


def layout_table(
    summary: dict[str, list[Result]],
    pipeline: bool,
    header: list[str],
    rows_of: Callable[[str, list[Result]], list[list[str]]],
) -> str:
    """One table of the tasks run on one layout."""
    rows = []
    for task, task_rows in on_layout(summary, pipeline):
        rows += rows_of(task, task_rows)
    return report.table(header, rows)


def on_layout(summary: dict[str, list[Result]], pipeline: bool) -> list[tuple[str, list[Result]]]:
    """``(task, rows)`` of the tasks run on one layout (keyed ``task@K2`` on the pipeline)."""
    return [(key.split("@")[0], rows) for key, rows in summary.items() if ("@" in key) == pipeline]


def cost_table(summary: dict[str, list[Result]]) -> str:
    """Why each speed-up is what it is: fewer steps to target against dearer steps."""
    header = (
        "task: method | steps to target | steps to target / no sifting's | ms per step (/ no "
        "sifting's) | extra ms per step: scoring / selecting and refilling / rest | one-time s "
        "off the clock | flipped labels among samples backpropagated"
    ).split(" | ")
    rows = [
        [
            f"{task}: {r['method']}",
            finite(r["steps"], ".0f"),
            finite(r["steps_ratio"], ".2f"),
            f"{1000 * r['step_s']:.1f} ({r['step_cost']:.2f})",
            " / ".join(f"{x:.1f}" for x in r["extra_ms"]),
            f"{r['off_clock']:.2f}",
            "" if math.isnan(r["flipped"]) else f"{r['flipped']:.1%}",
        ]
        for task, task_rows in summary.items()
        for r in task_rows
        if "seconds" in r
    ]
    return report.table(header, rows)


def verdict_table(summary: dict[str, list[Result]]) -> str:
    v = verdict(summary)
    bar = (
        f">= {TARGET_SPEEDUP}x to target on >= {TARGET_TASKS} tasks, the metric at no "
        "sifting's last second within the target"
    )
    passing = "; ".join(f"{task}: {', '.join(m)}" for task, m in v["passing"].items()) or "none"
    return report.table(["bar", "met", "passing"], [[bar, "yes" if v["met"] else "no", passing]])


def settings_table(settings: Settings) -> str:
    header = "task | data | model | B | Adam lr | no-sifting epochs | delay: source batches | "
    header += "evaluated every"
    rows = [
        [t.name, data_text(t), t.model_text(), str(t.batch), f"{t.lr:g}", str(t.epochs),
         f"{t.delay} ({t.delay * t.batch / train_size(t):.2f} epoch)", f"{t.eval_every} steps"]
        for t in settings.tasks
    ]  # fmt: skip
    return report.table(header.split(" | "), rows)


def train_size(task: Task) -> int:
    return 1437 if task.data == "digits" else int(0.8 * task.samples)


def data_text(task: Task) -> str:
    if task.data == "digits":
        return "scikit-learn `load_digits`, 1437 / 360, pixels / 16"
    split = f"{train_size(task)} / {task.samples - train_size(task)}"
    if task.data == "friedman":
        return f"`make_friedman1(noise=1.0)`, {split}, y standardised"
    noise = f", {task.noise:.0%} of training labels flipped" if task.noise else ""
    return f"`mnist1d` `make_dataset`, {split}{noise}"


def methods_table(settings: Settings) -> str:
    """Every method once, those of the pipeline alone last."""
    methods = {m.name: m for m in (*settings.methods, *settings.pipeline_methods)}
    rows = [[f"`{name}`", m.setting()] for name, m in methods.items()]
    return report.table(["method", "setting"], rows)


def how_text(settings: Settings) -> str:
    return (
        "Per task and seed one job trains a fresh model with each method in turn, from the "
        "same initial weights (Adam, `tfsift.shard(...).batch(B)` with a full shuffle each "
        "epoch, one compute thread per rank): no sifting for the task's epochs, each sifting "
        f"method for {settings.budget_factor:g}x the seconds that took, no sifting again last. "
        "The clock stops while the held-out metric (accuracy, or mean squared error for "
        "regression) is evaluated, every *evaluated every* optimizer steps; tracing and the "
        "first batch request and scoring round are off the clock (*one-time s*). Per seed, "
        f"target = the first no-sifting run's final accuracy - {100 * ACCURACY_SLACK:g} point "
        f"(or its MSE x {1 + MSE_SLACK:g}); *time to target* = the first evaluation that "
        "reaches it; *speed-up* = no sifting's time (the mean of its two runs; for *again*, "
        "the first run's) / the method's, *never* if not reached; medians over seeds "
        f"(here {len(settings.seeds)}). Sifting scores g={settings.score_batches} source "
        "batches per call (`score_batches`), with the task's `delay`, the run's seed and "
        "`SiftConfig`'s defaults otherwise; `uniform` keeps the fraction the same seed's "
        "`relative-1` run kept; `stale=1` reuses a sample's loss every other epoch. With "
        '*training scores* (`scores="training"`) no scoring forward runs: a sample\'s score '
        "is the per-sample loss (unweighted) its last training step handed back with "
        "`record`; `infobatch` takes the task's epochs as `epochs` (and `stale`), and its "
        "step applies the weights (mean of w x loss)."
    )


def render(raw: Result, meta: Result, settings: Settings) -> str:
    """The docs section: question, answer, settings, results and costs tables, provenance."""
    summary = summarise(jobs_of(raw))
    provenance = report.provenance(meta, BENCH.command)
    if all("@" in key for key in summary):  # --pipeline-only
        return "\n\n".join([results_table(summary, pipeline=True), provenance])
    parts = [
        "## Data sifting: training seconds to a held-out target",
        QUESTION,
        verdict_table(summary),
        how_text(settings),
        settings_table(settings),
        methods_table(settings),
        "### One process",
        results_table(summary, pipeline=False),
        "*kept*: `kept_fraction` (delay included). *metric at no sifting's last second*: "
        "at the last evaluation within the seconds the no-sifting run trained (the bar "
        "uses it). *samples backpropagated*: optimizer steps x B.",
    ]
    if any("@" in key for key in summary):
        parts += [
            f"### {settings.partitions}-stage pipeline (microbatches={settings.microbatches}, "
            f"`mpirun -np {settings.partitions}`)",
            results_table(summary, pipeline=True),
            "Full scoring runs the candidates through every stage; early exit scores them on "
            "stage 0 alone; training scores run no scoring pass. Times are rank 0's.",
        ]
    return "\n\n".join(
        [
            *parts,
            "![held-out metric against training seconds](sifting_time_to_target.png)",
            "Faint: every seed; bold: the median over seeds; dashed: the median target.",
            "### Where the time goes",
            cost_table(summary),
            "Medians over seeds, whole runs, rank 0. *extra ms per step*: over no sifting's, "
            "split into `time_scoring`, `time_selecting` + `time_accumulating` (from "
            "`tfsift.sift_metrics()`) and the rest. Time to target ~ no sifting's x (steps to "
            "target / no sifting's) x (s per step / no sifting's).",
            provenance,
        ]
    )


# ---------------------------------------------------------------- plot


def figures(raw: Result, settings: Settings) -> None:
    entries = jobs_of(raw)
    plot(entries, summarise(entries), PLOT)


def plot(raw: list[Result], summary: dict[str, list[Result]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(summary)
    cols = 3
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        _panel(ax, key, [e for e in raw if job_key(e["job"]) == key], summary[key])
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _panel(ax: Any, key: str, entries: list[Result], rows: list[Result]) -> None:
    regression = entries[0]["job"]["task"]["loss"] == "mse"
    for i, method in enumerate(entries[0]["job"]["methods"]):
        curves = [
            r["curve"] for e in entries for r in e["ranks"][0]["results"]
            if r["method"] == method["name"] and "curve" in r and not r.get("status")
        ]  # fmt: skip
        if not curves:
            continue
        color = f"C{i}"
        for c in curves:
            ax.step(
                [p[0] for p in c], [p[3] for p in c], where="post", color=color, alpha=0.25, lw=0.7
            )
        grid, mid = median_curve(curves)
        ax.plot(grid, mid, color=color, lw=1.6, label=method["name"])
    goal = median([r["target"] for r in rows if r["method"] == "none"])
    ax.axhline(goal, color="k", ls="--", lw=0.8)
    title = entries[0]["job"]["task"]["title"]
    ax.set_title(title + (", 2-stage pipeline" if "@" in key else ""))
    ax.set_xlabel("training seconds")
    ax.set_ylabel("held-out MSE" if regression else "held-out accuracy")
    if regression:
        ax.set_yscale("log")
    else:
        ax.set_ylim(max(0.0, goal - 0.25), min(1.0, goal + 0.06))
    ax.legend(fontsize=7)


def median_curve(
    curves: list[list[list[float]]], points: int = 200
) -> tuple[list[float], list[float]]:
    """The median over curves of the last metric at or before each second, up to the
    shortest curve's end."""
    end = min(c[-1][0] for c in curves)
    grid = [end * i / (points - 1) for i in range(points)]
    return grid, [median([metric_at(c, t) for c in curves]) for t in grid]


# ---------------------------------------------------------------- a fixed epoch budget

EPOCH_QUESTION = (
    "With the epochs no sifting trains for (InfoBatch's own view), how much training time does "
    "sifting save, and does it end at no sifting's held-out metric?"
)
RECOMMENDED = "infobatch"  # the README's configuration
EPOCH_SPEEDUP, EPOCH_TASKS, EPOCH_FLOOR = 1.25, 3, 0.95  # the bar for it


def epoch_task(task: Task) -> Task:
    """``task`` for twice its epochs (InfoBatch prunes in every epoch but the first and the
    annealed last eighth: 8 of 10 on MNIST-1D), evaluated half as often."""
    return dataclasses.replace(task, epochs=2 * task.epochs, eval_every=2 * task.eval_every)


# InfoBatch on tfsift.from_arrays, which never reads a pruned sample; no sifting on the
# same input, once on the usual tf.data input (what the input alone costs) and once in
# another order of the same data (how far the final metric moves with the order alone: a
# sifted run trains on another order too, so a gap smaller than that is no evidence)
EPOCH_METHODS = (
    dataclasses.replace(NONE, source="arrays"),
    dataclasses.replace(INFOBATCH, source="arrays"),
    Method(NONE_TF_DATA, "none"),
    Method(NONE_ORDER, "none", source="arrays", order=1000),
    dataclasses.replace(METHODS[-1], source="arrays"),
)
EPOCHS_FULL = Settings(
    tasks=tuple(epoch_task(t) for t in TASKS),
    methods=EPOCH_METHODS,
    pipeline_methods=EPOCH_METHODS,
    fixed_epochs=True,
    pipeline_tasks=tuple(t.name for t in TASKS),
)
EPOCHS_QUICK = dataclasses.replace(
    QUICK, methods=EPOCH_METHODS, pipeline_methods=EPOCH_METHODS, fixed_epochs=True
)


LAST = 3  # evaluations averaged for a second view of the end


def gap(metric: float, base: float, regression: bool) -> float:
    """``metric`` against no sifting's ``base``: the difference of accuracies, or for MSE
    the ratio less 1."""
    return metric / base - 1 if regression else metric - base


def epoch_seed_rows(ranks: list[Result], regression: bool) -> dict[str, Result]:
    """``seed_rows``, and per run its end against no sifting's: *saved*, the share of no
    sifting's training seconds (the mean of its two runs; for *again*, the first run's) it
    did not need, and *delta*, its final metric less the first no-sifting run's (for MSE,
    the ratio less 1); *delta_last*, the same of the mean of the last ``LAST`` evaluations
    (one evaluation moves with the step it lands on). The speed-up to target splits into
    two factors: *steps_speedup*, no sifting's optimizer steps to the target over the
    run's (the same in every run of one seed: the runs are deterministic), and
    *step_cost*, the run's seconds per step over no sifting's (what the machine's speed
    moves); speed-up = steps_speedup / step_cost."""
    rows = seed_rows(ranks, regression)
    curves = {r["method"]: r["curve"] for r in ranks[0]["results"] if "curve" in r}
    ends = {name: curve[-1] for name, curve in curves.items()}
    lasts = {name: statistics.mean(p[3] for p in curve[-LAST:]) for name, curve in curves.items()}
    first = ends["none"]
    mean = (first[0] + ends[AGAIN][0]) / 2 if AGAIN in ends else first[0]
    none_steps = rows["none"]["steps"]
    for name, row in rows.items():
        if "seconds" in row:
            end = ends[name]
            base_s = first[0] if name == AGAIN else mean
            row["saved"] = 1 - end[0] / base_s
            row["end_samples"] = end[2]
            row["total_steps"] = end[1]
            row["delta"] = gap(end[3], first[3], regression)
            row["delta_last"] = gap(lasts[name], lasts["none"], regression)
            # 0: never reached (steps inf)
            row["steps_speedup"] = none_steps / row["steps"] if row["steps"] else math.inf
            row["step_cost"] = row["step_s"] / (base_s / max(1, first[1]))
    return rows


def prunes(epoch: int, epochs: int, anneal: float) -> bool:
    """tfsift.sift.infobatch.prunes, restated: this script imports no TensorFlow (a test
    holds the two equal)."""
    return epoch > 1 and epoch - 1 < round((1 - anneal) * epochs, 9)


def infobatch_epochs(through: float, k: float, epochs: int, anneal: float) -> float:
    """InfoBatch's optimizer steps, in epochs of the full data, to train ``through`` epochs,
    an epoch that prunes training the share ``k`` of the samples and any other all."""
    total, epoch = 0.0, 1
    while epoch - 1 < through:
        part = min(1.0, through - (epoch - 1))
        total += part * (k if prunes(epoch, epochs, anneal) else 1.0)
        epoch += 1
    return total


def pruning_model(rows: dict[str, Result], epochs: int, anneal: float) -> Result | None:
    """One seed's ``RECOMMENDED`` run against what its pruning alone predicts (docs/
    sifting.md, "Why epochs rather than a target"): *target_epoch* E, the epochs no sifting
    trained to reach the target; *k*, the share of the samples an epoch that prunes trained
    (from the run's steps over the budget); *expected*, E over InfoBatch's steps to epoch E:
    its speed-up in optimizer steps if a sifted epoch teaches what an unsifted one does.
    None where no sifting never reached the target or no epoch prunes."""
    none, run = rows.get("none", {}), rows.get(RECOMMENDED, {})
    pruning = sum(prunes(e, epochs, anneal) for e in range(1, epochs + 1))
    if not none.get("steps") or "total_steps" not in run or not pruning:
        return None
    per_epoch = none["total_steps"] / epochs
    target_epoch = none["steps"] / per_epoch
    k = (run["total_steps"] / per_epoch - (epochs - pruning)) / pruning
    expected = target_epoch / infobatch_epochs(target_epoch, k, epochs, anneal)
    return {"target_epoch": target_epoch, "k": k, "expected": expected}


def epoch_summary(raw: list[Result]) -> dict[str, list[Result]]:
    """Per ``task`` (``task@K2`` on the pipeline), per method: medians over seeds."""
    out: dict[str, list[Result]] = {}
    for key, entries in by_task(raw).items():
        regression = entries[0]["job"]["task"]["loss"] == "mse"
        per_seed = [epoch_seed_rows(e["ranks"], regression) for e in entries]
        models = [
            pruning_model(rows, e["job"]["task"]["epochs"], method["anneal"])
            for rows, e in zip(per_seed, entries, strict=True)
            for method in e["job"]["methods"]
            if method["name"] == RECOMMENDED
        ]
        out[key] = []
        for method in entries[0]["job"]["methods"]:
            seeds = [s[method["name"]] for s in per_seed if "saved" in s.get(method["name"], {})]
            if not seeds:
                out[key].append({"method": method["name"], "status": "failed"})
                continue
            sift = [s["sift"] for s in seeds if s["sift"]]
            out[key].append({
                "method": method["name"], "definition": method, "regression": regression,
                "saved": median([s["saved"] for s in seeds]),
                "saved_each": [s["saved"] for s in seeds],
                "speedup": median([s["speedup"] for s in seeds]),
                "speedups": [s["speedup"] for s in seeds],
                "steps_speedup": median([s["steps_speedup"] for s in seeds]),
                "steps_speedups": [s["steps_speedup"] for s in seeds],
                "step_cost": median([s["step_cost"] for s in seeds]),
                "step_costs": [s["step_cost"] for s in seeds],
                "delta": median([s["delta"] for s in seeds]),
                "delta_last": median([s["delta_last"] for s in seeds]),
                "delta_lasts": [s["delta_last"] for s in seeds],
                "final": median([s["final"] for s in seeds]),
                "train_s": median([s["train_s"] for s in seeds]),
                "end_samples": median([s["end_samples"] for s in seeds]),
                "kept": median([x["kept_fraction"] for x in sift]) if sift else 1.0,
                "scoring_s": median([x.get("time_scoring", 0.0) for x in sift]) if sift else 0.0,
            })  # fmt: skip
            if method["name"] == RECOMMENDED and models and all(models):
                keys = ("target_epoch", "k", "expected")
                out[key][-1]["model"] = {k: [m[k] for m in models] for k in keys}
    return out


def delta_ok(row: Result, key: str = "delta") -> bool:
    """The final metric within 0.5 point of no sifting's (or its MSE within 2%); with
    ``key="delta_last"``, the mean of the last ``LAST`` evaluations."""
    return row[key] <= MSE_SLACK if row["regression"] else row[key] >= -ACCURACY_SLACK


def epoch_verdict(summary: dict[str, list[Result]], pipeline: bool, key: str = "speedup") -> Result:
    """The issue's bar for the recommended method on one layout: >= 1.25x to target on >= 3
    tasks, >= 0.95x on every task, and every final metric within the target's slack; with
    ``key="steps_speedup"``, the same bar on optimizer steps to the target (the machine's
    speed aside)."""
    rows = [
        r | {"task": task}
        for task, task_rows in on_layout(summary, pipeline)
        for r in task_rows
        if r["method"] == RECOMMENDED and key in r
    ]
    fast = [r["task"] for r in rows if r[key] >= EPOCH_SPEEDUP]
    slow = [r["task"] for r in rows if r[key] < EPOCH_FLOOR]
    lossy = [r["task"] for r in rows if not delta_ok(r)]
    lossy_last = [r["task"] for r in rows if "delta_last" in r and not delta_ok(r, "delta_last")]
    met = bool(rows) and len(fast) >= EPOCH_TASKS and not slow and not lossy
    return {"tasks": len(rows), "fast": fast, "slow": slow, "lossy": lossy,
            "lossy_last": lossy_last, "met": met}  # fmt: skip


def epoch_verdict_table(summary: dict[str, list[Result]]) -> str:
    header = [
        "layout", f"`{RECOMMENDED}` >= {EPOCH_SPEEDUP}x to target", f"below {EPOCH_FLOOR}x",
        "final metric past the slack", f"met (>= {EPOCH_SPEEDUP}x on >= {EPOCH_TASKS} tasks, "
        f">= {EPOCH_FLOOR}x and the final within the slack on all)",
        f"in optimizer steps to target: >= {EPOCH_SPEEDUP}x, below {EPOCH_FLOOR}x, met",
        f"past the slack on the mean of the last {LAST} evaluations",
    ]  # fmt: skip
    rows = []
    for name, pipeline in (("one process", False), ("2-stage pipeline", True)):
        v = epoch_verdict(summary, pipeline)
        s = epoch_verdict(summary, pipeline, key="steps_speedup")
        if v["tasks"]:
            rows.append([
                name, f"{len(v['fast'])} of {v['tasks']}: {', '.join(v['fast']) or 'none'}",
                ", ".join(v["slow"]) or "none", ", ".join(v["lossy"]) or "none",
                "yes" if v["met"] else "no",
                f"{len(s['fast'])} of {s['tasks']}; {', '.join(s['slow']) or 'none'}; "
                + ("yes" if s["met"] else "no"),
                ", ".join(v["lossy_last"]) or "none",
            ])  # fmt: skip
    return report.table(header, rows)


def delta_text(value: float, regression: bool) -> str:
    return f"{100 * value:+.1f}%" if regression else f"{100 * value:+.2f} pt"


def epoch_floor(rows: list[Result]) -> Result | None:
    """``RECOMMENDED``'s end against the order's noise: its median gap to no sifting (the
    mean of the last ``LAST`` evaluations) and where that lies against the per-seed gaps
    of no sifting run in another data order: "worse" or "better" outside their range,
    "within" inside it; None without both rows."""
    by = {r["method"]: r for r in rows if "delta_lasts" in r}
    if RECOMMENDED not in by or NONE_ORDER not in by:
        return None
    gap_, spread = by[RECOMMENDED]["delta_last"], by[NONE_ORDER]["delta_lasts"]
    sign = -1 if by[RECOMMENDED]["regression"] else 1  # + is better for accuracy
    if sign * gap_ < min(sign * x for x in spread):
        where = "worse"
    elif sign * gap_ > max(sign * x for x in spread):
        where = "better"
    else:
        where = "within"
    return {"gap": gap_, "gaps": by[RECOMMENDED]["delta_lasts"], "spread": spread,
            "where": where, "regression": by[RECOMMENDED]["regression"]}  # fmt: skip


def epoch_floor_table(summary: dict[str, list[Result]]) -> str:
    header = [
        "layout: task",
        f"`{RECOMMENDED}`: the mean of the last {LAST} evaluations - no sifting's (per seed)",
        "no sifting in another data order: the same (per seed)",
        f"`{RECOMMENDED}` against that range",
    ]
    rows = []
    for name, pipeline in (("one process", False), ("2-stage pipeline", True)):
        for task, task_rows in on_layout(summary, pipeline):
            f = epoch_floor(task_rows)
            if f is None:
                continue
            reg = f["regression"]
            each = ", ".join(delta_text(x, reg) for x in f["gaps"])
            spread = ", ".join(delta_text(x, reg) for x in f["spread"])
            rows.append([f"{name}: {task}", f"{delta_text(f['gap'], reg)} ({each})",
                         spread, f["where"]])  # fmt: skip
    return report.table(header, rows)


MODEL_QUESTION = (
    f"Does `{RECOMMENDED}`'s speed-up in optimizer steps follow from when no sifting reaches "
    "the target? If a pruning epoch teaches what a full one does, a target no sifting "
    "reaches E epochs in comes after InfoBatch's steps to epoch E: the first epoch whole, "
    "each pruning epoch the share k it keeps."
)


def per_seed(values: list[float], spec: str = ".2f") -> str:
    """The median, then each seed's value."""
    return f"{median(values):{spec}} ({', '.join(f'{v:{spec}}' for v in values)})"


def model_table(summary: dict[str, list[Result]]) -> str:
    header = [
        "layout: task",
        "no sifting reaches the target in E epochs (per seed)",
        "k, the share a pruning epoch trains",
        "expected in optimizer steps: E / InfoBatch's steps to E (per seed)",
        "measured in optimizer steps (per seed)",
    ]
    rows = []
    for name, pipeline in (("one process", False), ("2-stage pipeline", True)):
        for task, task_rows in on_layout(summary, pipeline):
            row = next((r for r in task_rows if "model" in r), None)
            if row is None:
                continue
            model = row["model"]
            rows.append([
                f"{name}: {task}", per_seed(model["target_epoch"], ".1f"),
                f"{median(model['k']):.2f}", per_seed(model["expected"]), steps_speedup_text(row),
            ])  # fmt: skip
    return report.table(header, rows)


def epoch_rows(task: str, rows: list[Result]) -> list[list[str]]:
    out = []
    for row in rows:
        if "saved" not in row:
            out.append([f"{task}: {row['method']}", *["n/a"] * 10])
            continue
        name = f"{task}: {Method(**row['definition']).setting()}"
        reg = row["regression"]
        delta = "; ".join(delta_text(row[k], reg) for k in ("delta", "delta_last"))
        each = ", ".join(f"{100 * x:.0f}%" for x in row["saved_each"])
        none = row["method"] == "none"
        costs = ", ".join(f"{x:.2f}" for x in row["step_costs"])
        out.append([
            name, f"{row['kept']:.2f}", f"{row['train_s']:.1f}",
            "" if none else f"**{100 * row['saved']:.0f}%** ({each})",
            "1" if none else speedup_text(row),
            "1" if none else steps_speedup_text(row),
            "1" if none else f"{row['step_cost']:.2f} ({costs})",
            metric_text(row["final"], reg), "" if none else delta,
            samples_text(row["end_samples"]), f"{row['scoring_s']:.1f}",
        ])  # fmt: skip
    return out


EPOCH_HEADER = (
    f"task: method | kept | training s | training time saved (per seed) | speed-up to target "
    "(per seed) | of which: in optimizer steps | of which: seconds per step / no sifting's "
    f"| final metric | final - no sifting's; the mean of the last {LAST} evaluations' "
    "| samples backpropagated | scoring s"
).split(" | ")


def epoch_table(summary: dict[str, list[Result]], pipeline: bool) -> str:
    return layout_table(summary, pipeline, EPOCH_HEADER, epoch_rows)


def epoch_how_text(settings: Settings) -> str:
    return (
        "The same jobs as the section above, but every method trains for the task's epochs, "
        "twice those of the time-to-target section (so that InfoBatch, which never prunes in "
        "the first epoch nor in the last eighth, prunes in most of them), evaluated half as "
        "often; one process and the 2-stage pipeline "
        f"(microbatches={settings.microbatches}), every task. The input is "
        "`tfsift.from_arrays` (InfoBatch then plans each epoch by row and never reads a "
        "pruned sample), and once, for comparison, the tf.data input of the section above. "
        "*training time saved* = 1 - the "
        "method's training seconds / no sifting's (the mean of its two runs); *speed-up to "
        "target* as above (target: the first no-sifting run's final accuracy - "
        f"{100 * ACCURACY_SLACK:g} point, or its MSE x {1 + MSE_SLACK:g}); *final - no "
        "sifting's*: against the first no-sifting run (MSE: relative); medians over seeds "
        f"(here {len(settings.seeds)}); *samples backpropagated*: over the whole run. The "
        "speed-up to target is about the product of two factors: *in optimizer steps*, no "
        "sifting's steps to the target over the method's (the runs are deterministic, so this "
        "one does not depend on the machine's speed: no sifting's second run is at 1 exactly), "
        "and the inverse of *seconds per step / no sifting's* over the whole run (what the "
        "machine's speed moves, and what the input and the sifting cost). *No sifting, "
        "another data order*: the same initial weights, the rows permuted with another seed; "
        "a sifted run trains on another order too, so its final metric can be told from no "
        "sifting's only where the gap lies outside what the order alone moves (the second "
        "table)."
    )


def epoch_render(raw: Result, meta: Result, settings: Settings) -> str:
    summary = epoch_summary(jobs_of(raw))
    parts = [
        "## Data sifting for a fixed epoch budget: training time saved at the final metric",
        EPOCH_QUESTION,
        epoch_verdict_table(summary),
        f"Is `{RECOMMENDED}`'s end told apart from the data order's own spread?",
        epoch_floor_table(summary),
        MODEL_QUESTION,
        model_table(summary),
        epoch_how_text(settings),
        settings_table(settings),
        methods_table(settings),
        "### One process",
        epoch_table(summary, pipeline=False),
    ]
    if any("@" in key for key in summary):
        parts += [
            f"### {settings.partitions}-stage pipeline (`mpirun -np {settings.partitions}`)",
            epoch_table(summary, pipeline=True),
        ]
    return "\n\n".join([*parts, report.provenance(meta, EPOCH_BENCH.command)])


class EpochBenchmark(Benchmark[Settings]):
    @property
    def command(self) -> str:
        return ".venv/bin/python scripts/bench_sifting.py --epochs"


EPOCH_BENCH = EpochBenchmark(
    "sifting-epochs", EPOCH_QUESTION, EPOCHS_FULL, EPOCHS_QUICK, measure, epoch_render
)


# ---------------------------------------------------------------- command line


def pipeline_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    every = {m.name: m for m in (*METHODS, *PIPELINE_METHODS)}
    names = [name for name in every if name not in (NONE.name, AGAIN)]
    p.add_argument("--pipeline-only", action="store_true", help="the 2-stage jobs alone, printed")
    p.add_argument(
        "--methods",
        nargs="+",
        choices=names,
        help="these only (no sifting runs first and last anyway); without --pipeline-only "
        "the docs keep the full table: add --no-docs (and --json)",
    )
    p.add_argument("--seeds", type=int, help="with --pipeline-only: seeds 0..N-1")
    return p


def pipeline_settings(args: argparse.Namespace) -> Settings:
    base = QUICK if args.quick else FULL
    names = (NONE.name, AGAIN, *(args.methods or [m.name for m in PIPELINE_METHODS]))
    methods = tuple(m for m in PIPELINE_METHODS if m.name in names)
    seeds = tuple(range(args.seeds)) if args.seeds else base.seeds
    return dataclasses.replace(base, one_process=False, pipeline_methods=methods, seeds=seeds)


def method_settings(args: argparse.Namespace) -> Settings:
    """``--methods`` for every job: those methods, with no sifting first and last."""
    base = QUICK if args.quick else FULL
    names = (NONE.name, AGAIN, *args.methods)
    return dataclasses.replace(
        base,
        methods=tuple(m for m in METHODS if m.name in names),
        pipeline_methods=tuple(m for m in PIPELINE_METHODS if m.name in names),
    )


def epoch_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--tasks", nargs="+", choices=[t.name for t in TASKS], help="these only")
    p.add_argument("--seeds", type=int, help="seeds 0..N-1 (the docs' table: 3)")
    return p


def epoch_settings(args: argparse.Namespace) -> Settings:
    """``--epochs``' jobs for ``--tasks`` (on both layouts) and ``--seeds``."""
    base = EPOCHS_QUICK if args.quick else EPOCHS_FULL
    names = args.tasks or [t.name for t in TASKS]
    tasks = tuple(t for t in base.tasks if t.name in names)
    # the quick run keeps its one pipeline task; the full one runs each task on both layouts
    pipeline = tuple(n for n in base.pipeline_tasks if n in names)
    seeds = tuple(range(args.seeds)) if args.seeds else base.seeds
    return dataclasses.replace(base, tasks=tasks, pipeline_tasks=pipeline, seeds=seeds)


def epoch_main(argv: list[str]) -> None:
    """``--epochs`` [``--tasks NAME ...``] [``--seeds N``]: a subset renders the same tables,
    so it needs ``--no-docs``, as ``--methods`` does, lest it overwrite the docs' full run."""
    own = epoch_options(argparse.ArgumentParser(add_help=False))
    cli = parser(EPOCH_BENCH, own)
    args = cli.parse_args(argv)
    if args.seeds is not None and args.seeds < 1:
        cli.error(f"--seeds must be at least 1. Received: --seeds {args.seeds}")
    if (args.tasks or args.seeds) and not args.no_docs:
        cli.error("--epochs with --tasks or --seeds needs --no-docs (the docs keep the full run)")
    # without a subset, as before: a --render of a --quick file renders the quick settings
    subset = epoch_settings(args) if args.tasks or args.seeds else None
    run(EPOCH_BENCH, argv, settings=subset, own=own)


def main(argv: list[str] | None = None) -> None:
    given = list(argv if argv is not None else sys.argv[1:])
    if "--epochs" in given:
        given.remove("--epochs")
        epoch_main(given)
        return
    own = pipeline_options(argparse.ArgumentParser(add_help=False))
    own.add_argument("--epochs", action="store_true", help="a fixed epoch budget (see above)")
    cli = parser(BENCH, own)
    args = cli.parse_args(given)
    if args.seeds and not args.pipeline_only:
        cli.error("--seeds goes with --pipeline-only")
    if args.methods and not args.pipeline_only:
        if not args.no_docs:
            cli.error("--methods without --pipeline-only needs --no-docs")
        run(BENCH, given, settings=method_settings(args), own=own)
        return
    if args.seeds is not None and args.seeds < 1:
        cli.error(f"--seeds must be at least 1. Received: --seeds {args.seeds}")
    if not args.pipeline_only:
        run(BENCH, given, own=own)
        return
    run(BENCH, [*given, "--no-docs"], settings=pipeline_settings(args), own=own)


BENCH = Benchmark("sifting", QUESTION, FULL, QUICK, measure, render, figures)

if __name__ == "__main__":
    main()
