"""Does data sifting reach no sifting's held-out metric in fewer training seconds?

Per task and seed one job (``scripts/_bench_sifting_worker.py``) trains a fresh model with
every method in turn, from the same initial weights, no sifting first and last. Per seed
the target is the first no-sifting run's final metric less 0.5 point (or its MSE x 1.02);
a method's speed-up is no sifting's training seconds to it over the method's.
``scripts/bench_sifting_epochs.py`` runs the same jobs for a fixed epoch budget.

usage: .venv/bin/python scripts/bench_sifting.py [--quick] [--no-docs] [--json P] [--render P]
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path

from bench import harness, report
from bench.harness import Result, say
from bench.main import Benchmark, run

WORKER = harness.ROOT / "scripts" / "_bench_sifting_worker.py"
CACHE = Path.home() / ".cache" / "tfsift" / "bench_sifting"
PARTIAL = CACHE / "partial-jobs.json"  # the jobs done so far, rewritten after each
ACCURACY_SLACK, MSE_SLACK = 0.005, 0.02  # the target's distance from the no-sifting run's final
TARGET_SPEEDUP, TARGET_TASKS = 1.3, 2  # the issue's bar: >= 1.3x on >= 2 tasks, within 0.5 point


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
    # to the first run measures the speed of its steps alone (the noise floor).
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
    """One sifting setting, the same on every task and layout; ``scores``, ``stale`` and
    the sample weights left to what ``SiftConfig`` implies from the policy."""

    name: str
    policy: str  # a SiftConfig policy, or "none"
    beta: float = 1.0
    scores: str | None = None  # "training": the loss each sample had when last trained
    stale: int | None = None  # epochs a sample's loss is reused (Stale-SB)
    prune: float = 0.5  # infobatch (whose epochs are the task's)
    anneal: float = 0.125  # infobatch
    # the input: "tf.data" (shard, shuffle, batch) or "arrays" (tfsift.from_arrays: by row)
    source: str = "tf.data"
    # added to the data order's seed (the initial weights stay the seed's): no sifting in
    # another order shows how far the end moves with the order alone
    order: int = 0


AGAIN = "none-again"  # no sifting once more, last in each job: the baselines' own spread
NONE = Method("none", "none")
# training scores imply stale=1; InfoBatch implies them, its weights and stale = its epochs,
# which keeps every score it ever recorded (the reference's table)
TRAINING = Method("relative-1-training", "relative", beta=1.0, scores="training")
INFOBATCH = Method("infobatch", "infobatch", prune=0.5, anneal=0.125)
# Retired after 9def9c9's run, which docs/benchmarks.md keeps: relative-3, adaptive
# (AdaSelection), uniform (random at relative-1's kept fraction) and relative-1-stale, none
# of which met the bar; early exit and overlap scoring before them.
METHODS = (
    NONE,
    Method("relative-1", "relative", beta=1.0),
    TRAINING,
    INFOBATCH,
    Method(AGAIN, "none"),
)
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
    pipeline_tasks: tuple[str, ...] = ("mnist1d",)  # run on the pipeline too
    partitions: int = 2
    microbatches: int = 4
    score_batches: int = 8  # g: source batches scored in one call, every sifting method
    budget_factor: float = 1.25  # a sifting run trains this x the no-sifting run's seconds
    max_epochs: int = 200  # a cap on a sifting run's source epochs, far above any here
    fixed_epochs: bool = False  # True: every method trains for the task's epochs

    def jobs(self) -> list[Result]:
        """Every job, in the order they run: per seed, each task, then the pipeline."""
        K, M, out = self.partitions, self.microbatches, []
        for seed in self.seeds:
            out += [self.job(t, seed, 1, 1) for t in self.tasks]
            out += [self.job(t, seed, K, M) for t in self.tasks if t.name in self.pipeline_tasks]
        return out

    def job(self, task: Task, seed: int, K: int, M: int) -> Result:
        """What the worker reads: the task, the seed, the methods in order, the layout."""
        keys = ("score_batches", "budget_factor", "max_epochs", "fixed_epochs")
        config = {k: getattr(self, k) for k in keys}
        return config | {
            "task": task.worker_config(),
            "seed": seed,
            "methods": [dataclasses.asdict(m) for m in self.methods],
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
    job = (goal, base[-1][0], regression)
    return {n: seed_row(r, first if n == AGAIN else mean, *job) for n, r in results.items()}


def seed_row(r: Result, reference: list[float], goal: float, base_end: float, reg: bool) -> Result:
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
        "speedup": reference[0] / hit[0] if hit[0] > 0 else 0.0,  # 0: never
        "steps_ratio": hit[1] / reference[1] if reference[1] else math.inf,
        "at_base_end": metric_at(r["curve"], base_end),
        "final": end[3],
        "train_s": end[0],
        "step_s": end[0] / max(1, end[1]),
        "sift": r.get("sift", {}),
    }


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


MEDIANS = ("target", "seconds", "speedup", "steps", "steps_ratio", "step_s")


def aggregate(seeds: list[Result], base_step: float) -> Result:
    """Medians over seeds of one method's per-seed rows."""
    medians = {k: median([s[k] for s in seeds]) for k in MEDIANS}
    return medians | {
        "speedups": [s["speedup"] for s in seeds],
        "margin": median([margin(s) for s in seeds]),
        "step_cost": medians["step_s"] / base_step,
    }


def margin(row: Result) -> float:
    """How far the metric at no sifting's last second is past the target (>= 0: reached)."""
    at, goal = float(row["at_base_end"]), float(row["target"])
    return goal - at if row["regression"] else at - goal


def verdict(summary: dict[str, list[Result]]) -> Result:
    """The issue's bar, per task in one process: methods >= 1.3x to target whose metric at
    the no-sifting run's final second is within the target (0.5 point, or 2% of MSE)."""
    passing: dict[str, list[str]] = {}
    for task, rows in summary.items():
        for row in rows:
            sifting = row["method"] not in ("none", AGAIN) and "seconds" in row
            if "@" not in task and sifting:
                if row["speedup"] >= TARGET_SPEEDUP and row["margin"] >= 0:
                    passing.setdefault(task, []).append(row["method"])
    return {"passing": passing, "met": len(passing) >= TARGET_TASKS}


# ---------------------------------------------------------------- tables


def metric_text(value: float, regression: bool) -> str:
    return f"{value:.4f}" if regression else f"{100 * value:.2f}%"


def speedup_value(value: float) -> str:
    """A speed-up; 0 stands for a run that never reached the target."""
    return "never" if value == 0 else f"{value:.2f}"


def finite(value: float, spec: str) -> str:
    """``value`` formatted, or *never* for the infinity of a target never reached."""
    return "never" if math.isinf(value) else format(value, spec)


def column(key: str) -> str:
    """A task's column: ``mnist1d``, or ``mnist1d, 2 stages`` for ``mnist1d@K2``."""
    task, _, stages = key.partition("@K")
    return f"{task}, {stages} stages" if stages else task


def method_table(
    summary: dict[str, list[Result]], cell: Callable[[Result], str], first: str
) -> str:
    """One row per method (in the order they ran), one column per task and layout."""
    names = list(dict.fromkeys(r["method"] for rows in summary.values() for r in rows))
    by_key = {key: {r["method"]: r for r in rows} for key, rows in summary.items()}
    header = [first, *map(column, summary)]
    rows = [
        [f"`{name}`", *(cell(by[name]) if name in by else "" for by in by_key.values())]
        for name in names
    ]
    return report.table(header, rows)


def speedup_cell(row: Result) -> str:
    """The median speed-up to the target; no sifting's own row: its time and the target."""
    if "seconds" not in row:
        return str(row["status"])
    if row["method"] == "none":
        return f"{row['seconds']:.1f} s to {metric_text(row['target'], row['regression'])}"
    return speedup_value(row["speedup"])


def cost_cell(row: Result) -> str:
    """Steps to the target / no sifting's and seconds per step / no sifting's; no sifting's
    own row: its steps to the target and milliseconds per step."""
    if "seconds" not in row:
        return str(row["status"])
    if row["method"] == "none":
        return f"{row['steps']:.0f} steps, {1000 * row['step_s']:.1f} ms"
    return f"{finite(row['steps_ratio'], '.2f')} / {row['step_cost']:.2f}"


def verdict_table(summary: dict[str, list[Result]]) -> str:
    v = verdict(summary)
    bar = (
        f">= {TARGET_SPEEDUP}x to target on >= {TARGET_TASKS} tasks, the metric at no "
        "sifting's last second within the target"
    )
    passing = "; ".join(f"{task}: {', '.join(m)}" for task, m in v["passing"].items()) or "none"
    return report.table(["bar", "met", "passing"], [[bar, "yes" if v["met"] else "no", passing]])


def tasks_table(settings: Settings) -> str:
    header = "task | data | model | B | Adam lr | epochs without sifting | delay | evaluated every"
    rows = [
        [t.name, data_text(t), t.model_text(), str(t.batch), f"{t.lr:g}", str(t.epochs),
         f"{t.delay * t.batch / train_size(t):.2f} epoch", f"{t.eval_every} steps"]
        for t in settings.tasks
    ]  # fmt: skip
    return report.table(header.split(" | "), rows)


def train_size(task: Task) -> int:
    return 1437 if task.data == "digits" else int(0.8 * task.samples)


def data_text(task: Task) -> str:
    if task.data == "digits":
        return "scikit-learn `load_digits`, 1437 / 360"
    split = f"{train_size(task)} / {task.samples - train_size(task)}"
    if task.data == "friedman":
        return f"`make_friedman1(noise=1.0)`, {split}"
    noise = f", {task.noise:.0%} of training labels flipped" if task.noise else ""
    return f"MNIST-1D, {split}{noise}"


def render(raw: Result, meta: Result, settings: Settings) -> str:
    """The docs section: the bar, the tasks, speed-ups and their two factors, provenance."""
    summary = summarise(jobs_of(raw))
    results = [
        "### Speed-up to the target (medians of the seeds)",
        method_table(summary, speedup_cell, "method"),
        "### Optimizer steps to the target / no sifting's, and seconds per step / no sifting's",
        method_table(summary, cost_cell, "method"),
    ]
    head = [verdict_table(summary), "### Tasks", tasks_table(settings)]
    return "\n\n".join([report.provenance(meta, BENCH.command), *head, *results])


BENCH = Benchmark("sifting", __doc__.splitlines()[0], FULL, QUICK, measure, render)

if __name__ == "__main__":
    run(BENCH)
