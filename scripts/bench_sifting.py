"""Benchmarks data sifting: training seconds to a held-out target, against no sifting.

Per task and seed one job (``scripts/_bench_sifting_worker.py``, one compute thread per
rank) trains a fresh model with every method in turn, from the same initial weights:
first without sifting for the task's epochs, then each sifting method for
``budget_factor`` times the seconds that run took, and last without sifting once more.
Every ``eval_every_s`` training seconds the clock stops and the held-out metric is
recorded with the optimizer steps and samples backpropagated so far; one-time tracing is
kept off the clock (see the worker). Then, per seed, from that seed's first run without
sifting:

    target       = its final accuracy - 0.5 point   (classification)
                   its final mean squared error x 1.02   (regression)
    time to target = the first recorded training second at which the metric reaches it

and per method: the median time over seeds, the median of the per-seed speed-ups
(no-sifting time / method time, runs of the same job; the no-sifting time is the mean of
its two runs, whose ratio is reported as the noise floor), the metric at the no-sifting
run's final second, and the samples backpropagated to the target. The jobs of a seed
run one after another, all tasks and then the 2-stage pipeline (``mpirun -np 2``),
before the next seed's, so that a drift of the machine's speed spreads over methods.

usage: .venv/bin/python scripts/bench_sifting.py [--quick] [--no-docs] [--json PATH]
       .venv/bin/python scripts/bench_sifting.py --pipeline-only   (2-stage jobs, printed)
           [--methods NAME ...] [--seeds N]   (of them, these methods; seeds 0..N-1)
       .venv/bin/python scripts/bench_sifting.py --render PATH   (docs from a --json file)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_pipeline import ENV, say, table, write_section  # noqa: E402

from tfsift.parallel.launch import mpirun_command  # noqa: E402

WORKER = ROOT / "scripts" / "_bench_sifting_worker.py"
DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "sifting_time_to_target.png"
MARKERS = ("<!-- sifting:begin -->", "<!-- sifting:end -->")
CACHE = Path.home() / ".cache" / "tfsift" / "bench_sifting"
RERUN = ".venv/bin/python scripts/bench_sifting.py"
ACCURACY_SLACK, MSE_SLACK = 0.005, 0.02  # the target's distance from the no-sifting run's final
TARGET_SPEEDUP, TARGET_TASKS = 1.3, 2  # the bar: >= 1.3x on >= 2 tasks, within 0.5 point
Result = dict[str, Any]


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
    eval_every_s: float = 1.0

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

    @property
    def regression(self) -> bool:
        return self.loss == "mse"


@dataclasses.dataclass(frozen=True)
class Method:
    """One sifting setting, the same on every task. ``keep="kept:<name>"``: what that run kept."""

    name: str
    policy: str  # a SiftConfig policy, or "none"
    beta: float = 1.0
    keep: float | str = 0.5
    scorer: str = "full"
    exit_after: str | None = None  # early exit: None is SiftConfig's default exit
    stale: int = 0  # epochs a sample's loss is reused (Stale-SB)
    overlap: bool = False  # early exit on a pipeline: score in stage 0's waits
    leftover: str = "score"  # overlap: "keep" keeps unscored what no wait had room for

    def setting(self) -> str:
        if self.name == AGAIN:
            return "no sifting, again after the others"
        if self.policy == "none":
            return "no sifting"
        if self.policy == "relative":
            text = f"relative, beta={self.beta:g}"
        elif isinstance(self.keep, str):
            text = f"{self.policy}, keep = {self.keep.split(':', 1)[1]}'s kept fraction"
        else:
            text = f"{self.policy}, keep={self.keep:g}"
        if self.scorer == "early_exit":
            text += f", early exit after {self.exit_after}" if self.exit_after else ", early exit"
        text += ", overlap" if self.overlap else ""
        text += ", leftover kept" if self.leftover == "keep" else ""
        return text + (f", stale={self.stale}" if self.stale else "")


AGAIN = "none-again"  # no sifting once more, last in each job: the baselines' own spread
NONE = Method("none", "none")
METHODS = (
    NONE,
    Method("relative-1", "relative", beta=1.0),
    Method("relative-3", "relative", beta=3.0),
    Method("relative-1-exit", "relative", beta=1.0, scorer="early_exit"),
    Method("relative-3-exit", "relative", beta=3.0, scorer="early_exit"),
    Method("adaptive", "adaptive", keep=0.5),
    Method("uniform", "uniform", keep="kept:relative-1"),
    Method("relative-1-stale", "relative", beta=1.0, stale=1),
    Method(AGAIN, "none"),
)
OVERLAP = Method("relative-1-exit-overlap", "relative", scorer="early_exit", overlap=True)
OVERLAP_KEEP = dataclasses.replace(OVERLAP, name="relative-1-exit-overlap-keep", leftover="keep")
PIPELINE_METHODS = (NONE, METHODS[1], METHODS[3], OVERLAP, OVERLAP_KEEP, METHODS[-1])
SMALL_CNN = ("cnn", 32, 2, 128)
TASKS = (
    Task("mnist1d", "MNIST-1D", "mnist1d", "ce", SMALL_CNN, epochs=5, delay=188, eval_every_s=0.5),
    Task(
        "mnist1d-noisy",
        "MNIST-1D, 20% labels flipped",
        "mnist1d",
        "ce",
        SMALL_CNN,
        noise=0.2,
        epochs=5,
        delay=188,
        eval_every_s=0.5,
    ),
    Task(
        "digits",
        "digits (8x8)",
        "digits",
        "ce",
        ("mlp", 128, 1, 0),
        batch=32,
        epochs=30,
        delay=45,
        eval_every_s=0.15,
    ),
    Task(
        "friedman",
        "Friedman #1 regression",
        "friedman",
        "mse",
        ("mlp", 64, 2, 0),
        samples=20000,
        epochs=8,
        delay=125,
        eval_every_s=0.3,
    ),
    Task(
        "mnist1d-wide",
        "MNIST-1D, wide CNN",
        "mnist1d",
        "ce",
        ("cnn", 64, 3, 256),
        epochs=2,
        delay=188,
        eval_every_s=1.0,
    ),
)


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
    max_load: float = 1.5
    max_wait: float = 600.0

    def jobs(self) -> list[Result]:
        """Every job, in the order they run: per seed, each task, then the pipeline."""
        out = []
        for seed in self.seeds:
            for task in self.tasks if self.one_process else ():
                out.append(self.job(task, seed, self.methods, 1, 1))
            for task in self.tasks:
                if task.name == self.pipeline_task:
                    out.append(
                        self.job(
                            task, seed, self.pipeline_methods, self.partitions, self.microbatches
                        )
                    )
        return out

    def job(
        self, task: Task, seed: int, methods: tuple[Method, ...], partitions: int, M: int
    ) -> Result:
        return {
            "task": task.worker_config(),
            "seed": seed,
            "methods": [dataclasses.asdict(m) for m in methods],
            "partitions": partitions,
            "microbatches": M,
            "score_batches": self.score_batches,
            "budget_factor": self.budget_factor,
            "max_epochs": self.max_epochs,
            "cache": str(CACHE),
        }


def quick_task(task: Task) -> Task:
    """The same task on a few thousand samples for about one epoch: a smoke test."""
    return dataclasses.replace(
        task,
        samples=3000,
        epochs=1 if task.data != "digits" else 3,
        delay=min(task.delay, 8),
        eval_every_s=0.25,
    )


QUICK = Settings(tasks=tuple(quick_task(t) for t in TASKS), seeds=(0,), max_wait=0.0)


# ---------------------------------------------------------------- running jobs


def wait_for_quiet(settings: Settings) -> tuple[float, str]:
    """Polls every minute (up to ``max_wait`` s) until the 1-minute load is below ``max_load``;
    the load then, and a note for the docs if it never dropped."""
    start = time.monotonic()
    while os.getloadavg()[0] > settings.max_load and time.monotonic() < start + settings.max_wait:
        say(f"load {os.getloadavg()[0]:.2f} > {settings.max_load}; waiting")
        time.sleep(60)
    load, waited = os.getloadavg()[0], (time.monotonic() - start) / 60
    if load <= settings.max_load:
        return load, f"; it waited {waited:.0f} minutes" if waited >= 1 else ""
    return load, f"; this time it never did, and ran after {waited:.0f} minutes anyway"


def run_job(job: Result, timeout: float = 900) -> list[Result]:
    """Runs the worker (under ``mpirun`` for a pipeline); returns each rank's JSON, by rank.

    The worker's progress lines (indented) are shown as they come; the rest of its output
    only if it fails. A job still running after ``timeout`` seconds is terminated."""
    out = Path(tempfile.mkdtemp(prefix="tfsift-sift-"))
    argv = [str(WORKER), json.dumps(job), str(out)]
    np_ = job["partitions"]
    cmd = mpirun_command(np_, argv) if np_ > 1 else [sys.executable, *argv]
    env = dict(os.environ) | ENV | {"PYTHONPATH": str(ROOT)}
    kept: list[str] = []
    with subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        timer = threading.Timer(timeout, proc.terminate)
        timer.start()
        for line in proc.stdout:
            if line.startswith("  "):
                say(line.rstrip())
            kept = [*kept[-60:], line]
        timer.cancel()
    files = sorted(out.glob("rank*.json"))
    if proc.returncode != 0 or len(files) != np_:
        raise RuntimeError(
            f"sifting job failed (exit {proc.returncode}, {len(files)} of {np_} reports). "
            f"Received job: task={job['task']['name']}, seed={job['seed']}\n{''.join(kept)}"
        )
    return [json.loads(f.read_text()) for f in files]


def run_all(settings: Settings, progress: Path | None = None) -> list[Result]:
    """Every job, one at a time; a failed job is tried once more. With ``progress``, the
    reports so far are saved there after each job."""
    jobs = settings.jobs()
    raw = []
    for i, job in enumerate(jobs):
        where = "1 process" if job["partitions"] == 1 else f"K={job['partitions']}"
        say(f"[{i + 1}/{len(jobs)}] {job['task']['name']}, seed {job['seed']}, {where}")
        try:
            ranks = run_job(job)
        except RuntimeError as error:
            say(f"{error}\ntrying the job once more")
            ranks = run_job(job)
        raw.append({"job": job, "ranks": ranks})
        if progress is not None:
            progress.write_text(json.dumps({"raw": raw}))
    return raw


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
    goal, base_end = target(base[-1][3], regression), base[-1][0]
    first_hit = first_reach(base, goal, regression)
    base_step = base[-1][0] / max(1, base[-1][1])
    # No sifting's time to target: the mean of its two runs, first and last in the job,
    # so that a drift of the machine's speed during the job (or a slow first run) does not
    # favour the methods; the repeat's own row compares it with the first run.
    again = results.get(AGAIN, {}).get("curve")
    again_hit = first_reach(again, goal, regression) if again else None
    base_hit = first_hit
    if first_hit and again_hit:
        base_hit = [(a + b) / 2 for a, b in zip(first_hit, again_hit, strict=True)]
    rows = {}
    for name, r in results.items():
        if "curve" not in r or r.get("status"):
            rows[name] = {"status": r.get("status", "failed")}
            continue
        hit = first_reach(r["curve"], goal, regression)
        reference = first_hit if name == AGAIN else base_hit
        rows[name] = {
            "regression": regression,
            "target": goal,
            "seconds": hit[0] if hit else math.inf,
            "steps": hit[1] if hit else math.inf,
            "samples": hit[2] if hit else math.inf,
            "speedup": reference[0] / hit[0] if hit and reference and hit[0] > 0 else 0.0,
            "steps_ratio": hit[1] / reference[1]
            if hit and reference and reference[1]
            else math.inf,
            "at_base_end": metric_at(r["curve"], base_end),
            "final": r["curve"][-1][3],
            "train_s": r["curve"][-1][0],
            "step_s": r["curve"][-1][0] / max(1, r["curve"][-1][1]),
            "sift": r.get("sift", {}),
            "extra_ms": [1000 * x for x in extra_per_step(r, base_step)],
            "flipped": r.get("flipped", math.nan),
            "keep": r.get("resolved", {}).get("keep"),
        }
    return rows


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


def summarise(raw: list[Result], settings: Settings) -> dict[str, list[Result]]:
    """Per ``task`` (``task@K2`` for the pipeline): one row per method, medians over seeds."""
    groups: dict[str, list[Result]] = {}
    for entry in raw:
        groups.setdefault(job_key(entry["job"]), []).append(entry)
    return {key: method_rows(entries) for key, entries in groups.items()}


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

    keeps = [float(k) for k in pick("keep") if isinstance(k, int | float)]
    medians = {k: median(pick(k)) for k in MEDIANS}
    return medians | {
        "seeds": len(seeds),
        "speedups": pick("speedup"),
        "margin": median([margin(s) for s in seeds]),
        "step_cost": medians["step_s"] / base_step,
        "kept": from_sift("kept_fraction") if sift else 1.0,
        "keep": median(keeps),
        "scoring_s": from_sift("time_scoring") if sift else 0.0,
        "selecting_s": from_sift("time_selecting") if sift else 0.0,
        "spearman": from_sift("exit_spearman"),
        "flipped": median([f for f in pick("flipped") if not math.isnan(f)]),
        "extra_ms": [median([s["extra_ms"][i] for s in seeds]) for i in range(3)],
    }


MEDIANS = ("target", "seconds", "speedup", "steps", "steps_ratio", "samples", "at_base_end",
           "final", "train_s", "step_s")  # fmt: skip


def margin(row: Result) -> float:
    """How far the metric at no sifting's last second is past the target (>= 0: reached)."""
    at, goal = float(row["at_base_end"]), float(row["target"])
    return goal - at if row["regression"] else at - goal


def verdict(summary: dict[str, list[Result]]) -> Result:
    """The issue's bar, per task: methods >= 1.3x to target whose metric at the no-sifting
    run's final second is within the target (0.5 point, or 2% of MSE)."""
    passing: dict[str, list[str]] = {}
    for task, rows in summary.items():
        if "@" in task:
            continue
        for row in rows:
            if row["method"] in ("none", AGAIN) or "seconds" not in row:
                continue
            if row["speedup"] >= TARGET_SPEEDUP and row["margin"] >= 0:
                passing.setdefault(task, []).append(row["method"])
    return {"passing": passing, "met": len(passing) >= TARGET_TASKS}


# ---------------------------------------------------------------- Markdown


def seconds_text(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.1f}"


def metric_text(value: float, regression: bool) -> str:
    return f"{value:.4f}" if regression else f"{100 * value:.2f}%"


def speedup_text(row: Result) -> str:
    if row["method"] == "none":
        return "1"
    each = ", ".join(speedup_value(s) for s in row["speedups"])
    return f"**{speedup_value(row['speedup'])}** ({each})"


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
        reg = row["regression"]
        cell = seconds_text(row["seconds"])
        if row["method"] == "none":
            cell += f" (target {metric_text(row['target'], reg)})"
        out.append(
            [
                name,
                f"{row['kept']:.2f}",
                cell,
                speedup_text(row),
                metric_text(row["at_base_end"], reg),
                metric_text(row["final"], reg),
                samples_text(row["samples"]),
                f"{row['step_cost']:.2f}",
                f"{row['scoring_s']:.1f} / {row['train_s']:.1f}",
                "" if math.isnan(row["spearman"]) else f"Spearman {row['spearman']:.2f}",
            ]
        )
    return out


RESULT_HEADER = [
    "task: method",
    "kept",
    "time to target: s",
    "speed-up (per seed)",
    "metric at no sifting's last second",
    "metric at the end",
    "samples backpropagated to target",
    "s per step / no sifting's",
    "scoring s / training s",
    "note",
]


def results_table(summary: dict[str, list[Result]], pipeline: bool) -> str:
    rows = []
    for task, task_rows in summary.items():
        if ("@" in task) == pipeline:
            rows += result_rows(task.split("@")[0], task_rows)
    return table(RESULT_HEADER, rows)


def settings_table(settings: Settings) -> str:
    header = [
        "task",
        "data",
        "model",
        "B",
        "Adam lr",
        "no-sifting epochs",
        "delay: source batches",
        "evaluated every",
    ]
    rows = [
        [
            t.name,
            data_text(t),
            t.model_text(),
            str(t.batch),
            f"{t.lr:g}",
            str(t.epochs),
            f"{t.delay} ({t.delay * t.batch / train_size(t):.2f} epoch)",
            f"{t.eval_every_s:g} s",
        ]
        for t in settings.tasks
    ]
    return table(header, rows)


def train_size(task: Task) -> int:
    return 1437 if task.data == "digits" else int(0.8 * task.samples)


def data_text(task: Task) -> str:
    if task.data == "digits":
        return "scikit-learn `load_digits`, 1437 / 360, pixels / 16"
    if task.data == "friedman":
        split = f"{train_size(task)} / {task.samples - train_size(task)}"
        return f"`make_friedman1(noise=1.0)`, {split}, y standardised"
    noise = f", {task.noise:.0%} of training labels flipped" if task.noise else ""
    return (
        f"`mnist1d` `make_dataset`, {train_size(task)} / {task.samples - train_size(task)}{noise}"
    )


def methods_text(settings: Settings) -> str:
    names = ", ".join(f"`{m.name}` ({m.setting()})" for m in settings.methods)
    return (
        f"Methods, one setting each on every task: {names}. Every sifting method scores "
        f"g={settings.score_batches} source batches per call (`score_batches`), with "
        "`history=500`, the task's `delay` and the run's seed; early exit is "
        '`SiftConfig(scorer="early_exit")` with its default exit (`exit_after=None`) and '
        "head. `stale=1` scores a sample every other epoch and reuses its loss in between "
        "(Stale-SB; samples are recognised by content). "
        "`uniform` keeps, after the delay, the fraction the same seed's `relative-1` run "
        "kept after its delay: the control that tells selection from subsampling."
    )


def cost_table(summary: dict[str, list[Result]]) -> str:
    """Why each speed-up is what it is: fewer steps to target against dearer steps."""
    header = [
        "task: method",
        "steps to target",
        "steps to target / no sifting's",
        "s per step / no sifting's",
        "extra ms per step: scoring / selecting and refilling / rest",
        "flipped labels among samples backpropagated",
    ]
    rows = []
    for task, task_rows in summary.items():
        for r in task_rows:
            if "seconds" not in r:
                continue
            rows.append(
                [
                    f"{task}: {r['method']}",
                    "never" if math.isinf(r["steps"]) else f"{r['steps']:.0f}",
                    ratio_text(r["steps_ratio"]),
                    f"{r['step_cost']:.2f}",
                    " / ".join(f"{x:.1f}" for x in r["extra_ms"]),
                    "" if math.isnan(r["flipped"]) else f"{r['flipped']:.1%}",
                ]
            )
    return table(header, rows)


def ratio_text(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.2f}"


def sifting_rows(summary: dict[str, list[Result]], pipeline: bool = False) -> list[Result]:
    return [
        r | {"task": task}
        for task, rows in summary.items()
        if ("@" in task) == pipeline
        for r in rows
        if r["method"] not in ("none", AGAIN) and "seconds" in r
    ]


def reading(summary: dict[str, list[Result]], v: Result) -> str:
    rows = sifting_rows(summary)
    if not rows:
        return "No sifting run finished."
    losers = [r for r in rows if r["speedup"] < 1]
    best = max(rows, key=lambda r: r["speedup"])
    parts = [
        f"**Target** (>= {TARGET_SPEEDUP}x faster to target than no sifting on >= "
        f"{TARGET_TASKS} tasks, with the metric at no sifting's last second within the "
        f"target): **{'met' if v['met'] else 'not met'}**; passing: "
        + (", ".join(f"{t} ({', '.join(m)})" for t, m in v["passing"].items()) or "none")
        + f". The best median speed-up is {best['speedup']:.2f}x ({best['task']}, "
        f"{best['method']}). {len(losers)} of {len(rows)} (task, method) pairs are slower to "
        "target than no sifting, or never reach it.",
        noise_note(rows),
        repeat_sentence(summary),
    ]
    why = [loser_sentence(losers), scoring_sentence(rows), step_sentence(summary)]
    why.append(control_sentence(summary))
    why.append(noise_sentence(summary))
    paragraphs = [" ".join(parts), " ".join(w for w in why if w), pipeline_sentence(summary)]
    return "\n\n".join(p for p in paragraphs if p)


def scoring_sentence(rows: list[Result]) -> str:
    def share(scorer: str) -> str:
        mine = [r for r in rows if r["definition"]["scorer"] == scorer and r["train_s"] > 0]
        if not mine:
            return "n/a"
        shares = [r["scoring_s"] / r["train_s"] for r in mine]
        return f"{min(shares):.0%} to {max(shares):.0%}"

    spearman = ", ".join(
        f"{r['task']} {r['spearman']:.2f}"
        for r in rows
        if r["method"] == "relative-1-exit" and not math.isnan(r["spearman"])
    )
    return (
        f"Scoring takes {share('full')} of the training seconds with the full model and "
        f"{share('early_exit')} with early exit (`time_scoring` of `tfsift.sift_metrics()`, "
        "medians over seeds; the early-exit figure includes the head's own training step)"
        + (
            f"; the early-exit losses' Spearman correlation with the full ones "
            f"(`exit_spearman`, relative-1-exit): {spearman}."
            if spearman
            else "."
        )
    )


def step_sentence(summary: dict[str, list[Result]]) -> str:
    """What relative-1 adds to each optimizer step, and what early exit changes."""
    items, exits, ratios = [], [], []
    for task, rows in summary.items():
        by = {r["method"]: r for r in rows if "seconds" in r}
        if "relative-1" not in by or "none" not in by:
            continue
        score, select, rest = by["relative-1"]["extra_ms"]
        ratios.append(rest / score if score > 0 else math.nan)
        items.append(
            f"{task} {1000 * by['none']['step_s']:.1f} ms + {score:.1f} scoring + "
            f"{select:.1f} selecting + {rest:.1f} rest"
        )
        if "relative-1-exit" in by:
            exit_cost, full_cost = by["relative-1-exit"]["step_cost"], by["relative-1"]["step_cost"]
            exits.append(f"{task} {exit_cost:.2f}x against {full_cost:.2f}x")
    if not items:
        return ""
    text = (
        "Per optimizer step, no sifting's milliseconds and what `relative-1` adds to them "
        "(whole runs, delay included): " + "; ".join(items) + ". The rest (reading 1/kept "
        "source batches and the transform's own work outside its timers) is "
        f"{median([r for r in ratios if not math.isnan(r)]):.1f}x the scoring time in the "
        "median."
    )
    if exits:
        text += (
            " Early exit against full scoring, seconds per step over no sifting's: "
            + "; ".join(exits)
            + "."
        )
    return text


def noise_note(rows: list[Result]) -> str:
    """How far apart one method's seeds land: the scale below which differences are noise."""
    spread = [
        (max(r["speedups"]) - min(r["speedups"]), r)
        for r in rows
        if len(r["speedups"]) > 1 and min(r["speedups"]) > 0
    ]
    if not spread:
        return ""
    widths = sorted(w for w, _ in spread)
    widest = max(spread, key=lambda p: p[0])[1]
    return (
        f"The seeds of one method spread: the per-seed speed-ups of a (task, method) span "
        f"{median(widths):.2f} in the median and up to {widths[-1]:.2f} ({widest['task']}, "
        f"{widest['method']}: {', '.join(f'{x:.2f}' for x in widest['speedups'])}), so "
        "medians closer than that to 1 or to each other are not distinguishable here."
    )


def repeat_sentence(summary: dict[str, list[Result]]) -> str:
    """How fast no sifting's second run reached the target against its first one."""
    out = [
        f"{task} {speedup_text(r)}"
        for task, rows in summary.items()
        for r in rows
        if r["method"] == AGAIN and "seconds" in r
    ]
    if not out:
        return ""
    return (
        "No sifting, run once more at the end of each job, against its first run (the same "
        "training, so any difference is the machine's): " + "; ".join(out) + ". Every "
        "speed-up above divides the mean of the two runs' times to target."
    )


def control_sentence(summary: dict[str, list[Result]]) -> str:
    """relative-1 against uniform at the same kept fraction: selection or subsampling."""
    out = []
    for task, rows in summary.items():
        by = {r["method"]: r for r in rows if "seconds" in r}
        if "@" in task or not {"relative-1", "uniform"} <= set(by):
            continue
        rel, uni = by["relative-1"], by["uniform"]
        out.append(
            f"{task} {speedup_value(rel['speedup'])} against {speedup_value(uni['speedup'])}"
        )
    if not out:
        return ""
    return (
        "Selection or mere subsampling: the speed-up of `relative-1` against `uniform` at the "
        "same kept fraction: " + "; ".join(out) + "."
    )


def noise_sentence(summary: dict[str, list[Result]]) -> str:
    rows = [r for r in sifting_rows(summary) if not math.isnan(r["flipped"])]
    if not rows:
        return ""
    base = [
        r["flipped"]
        for task in {r["task"] for r in rows}
        for r in summary[task]
        if r["method"] == "none" and not math.isnan(r["flipped"])
    ]
    text = ", ".join(f"{r['method']} {r['flipped']:.0%}" for r in rows)
    relative = [r["flipped"] for r in rows if r["definition"]["policy"] == "relative"]
    more = relative and min(relative) > median(base)
    return (
        f"With flipped training labels, the samples backpropagated carry flipped labels at "
        f"these rates: {text} (no sifting: {median(base):.0%})"
        + (
            ": the large-loss samples the relative rule prefers are disproportionately the "
            "mislabelled ones."
            if more
            else "."
        )
    )


def loser_sentence(losers: list[Result]) -> str:
    if not losers:
        return ""
    by_task: dict[str, list[str]] = {}
    for r in sorted(losers, key=lambda r: r["speedup"]):
        by_task.setdefault(r["task"], []).append(loser_text(r))
    return (
        "**Where sifting loses, and why.** A sifted run reaches the target sooner only if it "
        "needs fewer optimizer steps by more than each step costs extra (scoring 1/kept "
        "candidates per kept sample, selecting, refilling). Slower than no sifting, with "
        "(steps to target, seconds per step) against no sifting's: "
        + "; ".join(f"{task}: {', '.join(items)}" for task, items in by_task.items())
        + "."
    )


def loser_text(r: Result) -> str:
    if math.isinf(r["steps_ratio"]):
        return f"{r['method']} never (each step {r['step_cost']:.2f}x)"
    return f"{r['method']} {r['speedup']:.2f}x ({r['steps_ratio']:.2f}x, {r['step_cost']:.2f}x)"


def pipeline_sentence(summary: dict[str, list[Result]]) -> str:
    rows = sifting_rows(summary, pipeline=True)
    if not rows:
        return ""
    items = [
        f"`{r['method']}` {speedup_value(r['speedup'])} (speed-up to target), each step "
        f"{r['step_cost']:.2f}x no sifting's, {r['extra_ms'][0]:.1f} ms of it scoring"
        for r in rows
    ]
    task = str(rows[0]["task"]).split("@")[0]
    return f"**2-stage pipeline** ({task}): " + "; ".join(items) + "."


def off_clock_text(raw: list[Result]) -> str:
    """The range of one-time seconds a run had taken off its clock."""
    runs = [r for e in raw for rank in e["ranks"] for r in rank["results"] if "off_clock_s" in r]
    if not runs:
        return "none"
    total = [sum(r["off_clock_s"]) for r in runs]
    return f"{min(total):.2f} to {max(total):.2f} s per run"


def markdown(
    summary: dict[str, list[Result]], settings: Settings, meta: Result, raw: list[Result]
) -> str:
    v = verdict(summary)
    pipeline = [t for t in summary if "@" in t]
    parts = [
        "## Data sifting: training seconds to a held-out target",
        f"Measured {meta['date']} on {meta['cores']} cores shared with other work "
        f"({commit_text(meta)}; 1-minute load {meta['load_start']:.2f} at start, "
        f"{meta['load_end']:.2f} at end, this benchmark's own processes included). "
        f"Rerun: `{RERUN}` (this run took {meta.get('seconds', 0) / 60:.0f} minutes for "
        f"{meta['jobs']} jobs; it first waits up to {settings.max_wait / 60:.0f} minutes for the "
        f"1-minute load to drop below {settings.max_load}{meta.get('wait_note', '')}).",
        "Per task and seed one job trains a fresh model with each method in turn, from the "
        "same initial weights, one compute thread per rank, Adam, "
        "`tfsift.shard(...).batch(B)` with a full shuffle each epoch: first without sifting "
        f"for the task's epochs, then each sifting method for {settings.budget_factor:g}x the "
        "seconds that run took, and last without sifting once more (*no sifting, again*). "
        "The training clock stops while the held-out metric "
        "(accuracy, or mean squared error for regression) is evaluated, every *evaluated "
        "every* training seconds and at the end; scoring, selection and refilling run inside "
        "the clock. One-time work is outside the clock for every method: tracing the training "
        "step and the Adam update (compiled with `tf.function` in every run), the first batch "
        "request (the shuffle buffer's fill; early exit also traces its scorer there) and the "
        "request that ran the first scoring round (tracing the scoring step): "
        f"{off_clock_text(raw)}. "
        "Per seed, target = that "
        "seed's first no-sifting run's final accuracy - 0.5 point (or "
        f"its final MSE x {1 + MSE_SLACK:g}); *time to target* = the first evaluation at which "
        f"the metric reaches it; medians over {len(settings.seeds)} seeds; *speed-up* = the "
        "median over seeds of no sifting's time (the mean of its two runs) / the method's "
        "(*never*: not reached within its seconds; for *no sifting, again*: the first run's "
        "time / its own). The jobs of a seed run one after another (every task, then the "
        "pipeline) before the next seed's.",
        settings_table(settings),
        methods_text(settings),
        "### One process",
        results_table(summary, pipeline=False),
        "*kept*: `kept_fraction` (delay included). *metric at no sifting's last second*: "
        "the method's held-out metric at the last evaluation within the seconds the "
        "no-sifting run trained (equal training time; the target test uses it). *metric at "
        "the end*: after its whole budget. *samples backpropagated*: optimizer steps x B.",
    ]
    if pipeline:
        parts += [
            f"### 2-stage pipeline (partitions={settings.partitions}, "
            f"microbatches={settings.microbatches}, `mpirun -np {settings.partitions}`)",
            results_table(summary, pipeline=True),
            "Full scoring runs the candidates forward through both stages; early exit "
            "scores them on stage 0 alone and broadcasts the losses. Times are rank 0's.",
        ]
    parts += [
        "![held-out metric against training seconds](sifting_time_to_target.png)",
        "Faint: every seed; bold: the median over seeds at each second; dashed: the median target.",
        "### Where the time goes",
        cost_table(summary),
        "Medians over seeds, whole runs, rank 0. *extra ms per step*: a method's training "
        "seconds per optimizer step less no sifting's, split into `time_scoring`, "
        "`time_selecting` + `time_accumulating` (from `tfsift.sift_metrics()`) per step, and "
        "the rest (reading 1/kept source batches per step, the transform's own work). Time "
        "to target ~ no sifting's x (steps to target / no sifting's) x (s per step / no "
        "sifting's).",
        "### Reading",
        reading(summary, v),
    ]
    return "\n\n".join(parts)


# ---------------------------------------------------------------- plot


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


# ---------------------------------------------------------------- main


def git(*args: str) -> str:
    run = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return run.stdout.rstrip("\n")


def head() -> str:
    return git("rev-parse", "--short", "HEAD") or "unknown"


def metadata(load_start: float, jobs: int, commit_start: str) -> Result:
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "tfsift", "scripts")
    changed = sorted({line[3:] for line in dirty.splitlines() if line.strip()})
    return {
        "date": datetime.date.today().isoformat(),
        "cores": os.cpu_count(),
        "commit_start": commit_start,
        "commit": head(),
        "dirty": f", with uncommitted changes to {', '.join(changed)}" if changed else "",
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "jobs": jobs,
    }


def commit_text(meta: Result) -> str:
    """HEAD, or HEAD at start and end when commits landed during the run."""
    start, end = str(meta.get("commit_start", meta["commit"])), str(meta["commit"])
    if start == end:
        return f"HEAD {end}{meta['dirty']}"
    changed = git("diff", "--stat", start, end, "--", "tfsift/sift").strip()
    sift = "some touched tfsift/sift" if changed else "none touched tfsift/sift"
    return (
        f"HEAD {start} when it started and {end} when it ended{meta['dirty']}: other work "
        f"was committed during the run, and {sift}"
    )


def measure(settings: Settings, progress: Path | None) -> tuple[list[Result], Result]:
    """Every job, after waiting for a quiet machine; the raw reports and the run's metadata."""
    load, note = wait_for_quiet(settings)
    start, commit = time.monotonic(), head()
    raw = run_all(settings, progress)
    return raw, metadata(load, len(raw), commit) | {
        "seconds": time.monotonic() - start,
        "wait_note": note,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test: small data, 1 seed")
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/")
    parser.add_argument("--json", type=Path, help="also save the raw results here")
    parser.add_argument("--render", type=Path, help="re-render the docs from a --json file")
    parser.add_argument(
        "--pipeline-only",
        action="store_true",
        help="the 2-stage runs alone, their table printed (docs/ untouched)",
    )
    names = [m.name for m in PIPELINE_METHODS if m.name not in (NONE.name, AGAIN)]
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=names,
        help="with --pipeline-only: these sifting methods only (no sifting runs first and "
        "last in every job anyway)",
    )
    parser.add_argument("--seeds", type=int, help="with --pipeline-only: seeds 0..N-1 (default: 3)")
    args = parser.parse_args()
    if (args.methods or args.seeds) and not args.pipeline_only:
        parser.error("--methods and --seeds go with --pipeline-only")
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds must be at least 1. Received: --seeds {args.seeds}")
    if args.render:
        saved = json.loads(args.render.read_text())
        raw, meta = saved["raw"], saved["meta"]
        settings = QUICK if meta.get("quick") else Settings()
    else:
        settings = QUICK if args.quick else Settings()
        if args.pipeline_only:
            settings = dataclasses.replace(settings, one_process=False)
        if args.methods:
            chosen = [m for m in PIPELINE_METHODS if m.name in (NONE.name, AGAIN, *args.methods)]
            settings = dataclasses.replace(settings, pipeline_methods=tuple(chosen))
        if args.seeds:
            settings = dataclasses.replace(settings, seeds=tuple(range(args.seeds)))
        raw, meta = measure(settings, args.json)
        meta["quick"] = args.quick
        if args.json:
            args.json.write_text(json.dumps({"raw": raw, "meta": meta}))
    summary = summarise(raw, settings)
    if not settings.one_process:
        print(results_table(summary, pipeline=True))
        return
    text = markdown(summary, settings, meta, raw)
    print(text)
    if not args.no_docs:
        plot(raw, summary, PLOT)
        write_section(text, DOC, MARKERS)
    say(f"done; the run took {meta.get('seconds', 0):.0f} s")


if __name__ == "__main__":
    main()
