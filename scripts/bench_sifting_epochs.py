"""With the epochs no sifting trains for, how much training time does InfoBatch save?

Per task and seed one job trains a fresh model with every method in turn, from the same
initial weights, each for the task's epochs, on one process and on the 2-stage pipeline:
InfoBatch on ``tfsift.from_arrays`` against no sifting on the same input, and three
controls of no sifting: on the tf.data input, in another data order, and again after the
others. Per seed the target is the first no-sifting run's final metric less 0.5 point (or
its MSE x 1.02); a speed-up is no sifting's training seconds to it over the run's.
``--tasks`` and ``--seeds`` run a subset, which needs ``--no-docs``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from pathlib import Path

from bench import harness, report
from bench.harness import Result, say
from bench.main import Benchmark, at_least_one, parser, run

WORKER = harness.ROOT / "scripts" / "_bench_sifting_worker.py"
CACHE = Path.home() / ".cache" / "tfsift" / "bench_sifting"
PARTIAL = CACHE / "partial-jobs.json"  # the jobs done so far, rewritten after each
ACCURACY_SLACK, MSE_SLACK = 0.005, 0.02  # the target's distance from the no-sifting run's final
RECOMMENDED = "infobatch"  # the README's configuration
NONE_TF_DATA = "none-tf.data"  # no sifting on the tf.data input: what the input alone costs
NONE_ORDER = "none-order"  # no sifting in another data order: what the order alone moves
AGAIN = "none-again"  # no sifting once more, last in each job: the baselines' own spread
EPOCH_SPEEDUP, EPOCH_TASKS, EPOCH_FLOOR = 1.25, 3, 0.95  # the bar for it
LAST = 3  # evaluations averaged for a second view of the end


@dataclasses.dataclass(frozen=True)
class Task:
    """A data set, a model and the epochs every run trains for."""

    name: str
    title: str
    data: str  # mnist1d, digits or friedman (see the worker's loaders)
    loss: str  # "ce" (accuracy is the metric) or "mse" (the held-out MSE is)
    model: tuple[str, int, int, int]  # (cnn|mlp, width, layers, hidden)
    samples: int = 30000  # generated, 80% train (mnist1d, friedman)
    noise: float = 0.0  # fraction of training labels flipped to another class
    batch: int = 64
    lr: float = 2e-3
    epochs: int = 6
    delay: int = 0  # source batches each sifting run trains on unsifted first
    # Evaluated every this many optimizer steps, the same for every method, so that a rerun
    # of the same trajectory is evaluated at the same points (the noise floor).
    eval_every: int = 200

    def worker_config(self) -> Result:
        kind, width, layers, hidden = self.model
        model = {"kind": kind, "width": width, "layers": layers, "hidden": hidden}
        return dataclasses.asdict(self) | {"data_seed": 0} | {"model": model}


@dataclasses.dataclass(frozen=True)
class Method:
    """One run's setting, the same on every task and layout (what ``SiftConfig`` implies
    from the policy left to it)."""

    name: str
    policy: str  # a SiftConfig policy, or "none"
    prune: float = 0.5  # infobatch
    anneal: float = 0.125  # infobatch
    source: str = "tf.data"  # or "arrays" (tfsift.from_arrays: by row)
    # added to the data order's seed (the initial weights stay the seed's): a sifted run
    # trains on another order too, so a gap smaller than the order alone moves is no evidence
    order: int = 0


METHODS = (
    Method("none", "none", source="arrays"),
    Method(RECOMMENDED, "infobatch", prune=0.5, anneal=0.125, source="arrays"),
    Method(NONE_TF_DATA, "none"),
    Method(NONE_ORDER, "none", source="arrays", order=1000),
    Method(AGAIN, "none", source="arrays"),
)
SMALL_CNN = ("cnn", 32, 2, 128)
# fmt: off
TASKS = (
    Task("mnist1d", "MNIST-1D", "mnist1d", "ce", SMALL_CNN, epochs=10, delay=188, eval_every=200),
    Task("mnist1d-noisy", "MNIST-1D, 20% labels flipped", "mnist1d", "ce", SMALL_CNN, noise=0.2,
         epochs=10, delay=188, eval_every=200),
    Task("digits", "digits (8x8)", "digits", "ce", ("mlp", 128, 1, 0), batch=32, epochs=60,
         delay=45, eval_every=40),
    Task("friedman", "Friedman #1 regression", "friedman", "mse", ("mlp", 64, 2, 0),
         samples=20000, epochs=16, delay=125, eval_every=100),
    Task("mnist1d-wide", "MNIST-1D, wide CNN", "mnist1d", "ce", ("cnn", 64, 3, 256), epochs=4,
         delay=188, eval_every=100),
)
# fmt: on


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one benchmark run measures."""

    tasks: tuple[Task, ...] = TASKS
    methods: tuple[Method, ...] = METHODS
    seeds: tuple[int, ...] = (0, 1, 2)
    pipeline_tasks: tuple[str, ...] = tuple(t.name for t in TASKS)  # run on the pipeline too
    partitions: int = 2
    microbatches: int = 4
    score_batches: int = 8  # g: source batches scored in one call, every sifting method

    def jobs(self) -> list[Result]:
        """Every job, in the order they run: per seed, each task, then the pipeline."""
        K, M, out = self.partitions, self.microbatches, []
        for seed in self.seeds:
            out += [self.job(t, seed, 1, 1) for t in self.tasks]
            out += [self.job(t, seed, K, M) for t in self.tasks if t.name in self.pipeline_tasks]
        return out

    def job(self, task: Task, seed: int, K: int, M: int) -> Result:
        """What the worker reads: the task, the seed, the methods in order, the layout."""
        return {"score_batches": self.score_batches, "task": task.worker_config(), "seed": seed,
                "methods": [dataclasses.asdict(m) for m in self.methods], "partitions": K,
                "microbatches": M, "cache": str(CACHE)}  # fmt: skip


FULL = Settings()
# a smoke test: each task on a few thousand samples for about one epoch, one seed, and
# MNIST-1D alone on the pipeline
QUICK = Settings(
    tasks=tuple(dataclasses.replace(t, samples=3000, epochs=1 if t.data != "digits" else 3,
                                    delay=min(t.delay, 8), eval_every=10) for t in TASKS),
    seeds=(0,), pipeline_tasks=("mnist1d",),
)  # fmt: skip


def measure(settings: Settings) -> Result:
    """Every job, one at a time; a failed job is tried once more."""
    jobs, out = settings.jobs(), []
    for i, job in enumerate(jobs):
        K, args = job["partitions"], [json.dumps(job)]
        say(f"[{i + 1}/{len(jobs)}] {job['task']['name']}, seed {job['seed']}, K={K}")
        try:
            ranks = harness.run_job(WORKER, args, K, mpi=K > 1)
        except RuntimeError as error:
            say(f"{error}\ntrying the job once more")
            ranks = harness.run_job(WORKER, args, K, mpi=K > 1)
        out.append({"job": job, "ranks": ranks})
        PARTIAL.write_text(json.dumps({"jobs": out}))  # what a cut-short run measured
    return {"jobs": out}


def target(final: float, regression: bool) -> float:
    """The no-sifting run's final metric, less 0.5 point of accuracy or plus 2% of MSE."""
    return final * (1 + MSE_SLACK) if regression else final - ACCURACY_SLACK


def first_reach(curve: list[list[float]], goal: float, regression: bool) -> list[float] | None:
    """The first ``[seconds, steps, samples, metric]`` point that reaches ``goal``."""
    reached = (lambda m: m <= goal) if regression else (lambda m: m >= goal)
    return next((p for p in curve if reached(p[3])), None)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def gap(metric: float, base: float, regression: bool) -> float:
    """``metric`` against no sifting's ``base``: the difference of accuracies, or for MSE
    the ratio less 1."""
    return metric / base - 1 if regression else metric - base


def seed_rows(ranks: list[Result], regression: bool) -> dict[str, Result]:
    """Per method of one job (rank 0's records): when it reached the target and its seconds
    per step; *saved*, the share of no sifting's training seconds it did not need; *delta*,
    its final metric against the first no-sifting run's (``gap``); *delta_last*, the same of
    the mean of the last ``LAST`` evaluations (one evaluation moves with the step it lands
    on). No sifting's seconds are the mean of its two runs, first and last in the job, so
    that a drift of the machine's speed does not favour the methods (*again*'s own row is
    against the first). The speed-up to target = *steps_speedup* (no sifting's optimizer
    steps to the target over the run's: the runs are deterministic) / *step_cost* (the run's
    seconds per step over no sifting's: what the machine's speed moves)."""
    results = {r["method"]: r for r in ranks[0]["results"]}
    curves = {name: r["curve"] for name, r in results.items() if "curve" in r}
    base = curves["none"]
    goal = target(base[-1][3], regression)
    first = first_reach(base, goal, regression) or base[-1]  # reached by construction
    again = first_reach(curves.get(AGAIN, []), goal, regression)
    mean = [(a + b) / 2 for a, b in zip(first, again, strict=True)] if again else first
    ends = {name: curve[-1] for name, curve in curves.items()}
    lasts = {name: statistics.mean(p[3] for p in curve[-LAST:]) for name, curve in curves.items()}
    end_s = (base[-1][0] + ends[AGAIN][0]) / 2 if AGAIN in ends else base[-1][0]
    rows: dict[str, Result] = {}
    for name, r in results.items():
        if "curve" not in r or r.get("status"):
            rows[name] = {"status": r.get("status", "failed")}
            continue
        hit = first_reach(r["curve"], goal, regression) or [math.inf] * 4
        end, reference = ends[name], first if name == AGAIN else mean
        base_s = base[-1][0] if name == AGAIN else end_s
        rows[name] = {
            "seconds": hit[0], "steps": hit[1],
            "speedup": reference[0] / hit[0] if hit[0] > 0 else 0.0,  # 0: never
            "step_s": end[0] / max(1, end[1]), "sift": r.get("sift", {}),
            "saved": 1 - end[0] / base_s, "total_steps": end[1],
            "delta": gap(end[3], base[-1][3], regression),
            "delta_last": gap(lasts[name], lasts["none"], regression),
            "step_cost": end[0] / max(1, end[1]) / (base_s / max(1, base[-1][1])),
        }  # fmt: skip
    none_steps = rows["none"]["steps"]
    for row in rows.values():
        if "steps" in row:  # 0: never reached (steps inf)
            row["steps_speedup"] = none_steps / row["steps"] if row["steps"] else math.inf
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
    trained to reach the target; *k*, the share of the samples an epoch that prunes trained;
    *expected*, E over InfoBatch's steps to epoch E: its speed-up in optimizer steps if a
    sifted epoch teaches what an unsifted one does. None where no sifting never reached
    the target or no epoch prunes."""
    none, run = rows.get("none", {}), rows.get(RECOMMENDED, {})
    pruning = sum(prunes(e, epochs, anneal) for e in range(1, epochs + 1))
    if not none.get("steps") or "total_steps" not in run or not pruning:
        return None
    per_epoch = none["total_steps"] / epochs
    target_epoch = none["steps"] / per_epoch
    k = (run["total_steps"] / per_epoch - (epochs - pruning)) / pruning
    expected = target_epoch / infobatch_epochs(target_epoch, k, epochs, anneal)
    return {"target_epoch": target_epoch, "k": k, "expected": expected}


SEED_KEYS = ("saved", "speedup", "steps_speedup", "step_cost", "delta", "delta_last")


def epoch_summary(raw: list[Result]) -> dict[str, list[Result]]:
    """Per ``task`` (``task@K2`` on the pipeline), per method: medians over seeds, and each
    seed's value of every ``SEED_KEYS`` key (``<key>s``)."""
    groups: dict[str, list[Result]] = {}
    for entry in raw:
        job = entry["job"]
        key = job["task"]["name"] + (f"@K{job['partitions']}" if job["partitions"] > 1 else "")
        groups.setdefault(key, []).append(entry)
    out: dict[str, list[Result]] = {}
    for key, entries in groups.items():
        regression = entries[0]["job"]["task"]["loss"] == "mse"
        per_seed = [seed_rows(e["ranks"], regression) for e in entries]
        models = [pruning_model(rows, e["job"]["task"]["epochs"], method["anneal"])
                  for rows, e in zip(per_seed, entries, strict=True)
                  for method in e["job"]["methods"] if method["name"] == RECOMMENDED]  # fmt: skip
        out[key] = []
        for method in entries[0]["job"]["methods"]:
            seeds = [s[method["name"]] for s in per_seed if "saved" in s.get(method["name"], {})]
            if not seeds:
                out[key].append({"method": method["name"], "status": "failed"})
                continue
            sift = [s["sift"] for s in seeds if s["sift"]]
            row: Result = {"method": method["name"], "regression": regression}
            for k in SEED_KEYS:
                row[f"{k}s"] = [s[k] for s in seeds]
                row[k] = median(row[f"{k}s"])
            row["kept"] = median([x["kept_fraction"] for x in sift]) if sift else 1.0
            if method["name"] == RECOMMENDED and models and all(models):
                keys = ("target_epoch", "k", "expected")
                row["model"] = {k: [m[k] for m in models if m] for k in keys}
            out[key].append(row)
    return out


def on_layout(summary: dict[str, list[Result]], pipeline: bool) -> list[tuple[str, list[Result]]]:
    """``(task, rows)`` of the tasks run on one layout (keyed ``task@K2`` on the pipeline)."""
    return [(key.split("@")[0], rows) for key, rows in summary.items() if ("@" in key) == pipeline]


def delta_ok(row: Result, key: str = "delta") -> bool:
    """The final metric (``delta_last``: the mean of the last evaluations) within 0.5 point
    of no sifting's, or its MSE within 2%."""
    return row[key] <= MSE_SLACK if row["regression"] else row[key] >= -ACCURACY_SLACK


def epoch_verdict(summary: dict[str, list[Result]], pipeline: bool, key: str = "speedup") -> Result:
    """The issue's bar for the recommended method on one layout: >= 1.25x to target on >= 3
    tasks, >= 0.95x on every task, and every final metric within the target's slack; with
    ``key="steps_speedup"``, the same bar on optimizer steps to the target."""
    rows = [r | {"task": task} for task, task_rows in on_layout(summary, pipeline)
            for r in task_rows if r["method"] == RECOMMENDED and key in r]  # fmt: skip
    fast = [r["task"] for r in rows if r[key] >= EPOCH_SPEEDUP]
    slow = [r["task"] for r in rows if r[key] < EPOCH_FLOOR]
    lossy = [r["task"] for r in rows if not delta_ok(r)]
    lossy_last = [r["task"] for r in rows if "delta_last" in r and not delta_ok(r, "delta_last")]
    met = bool(rows) and len(fast) >= EPOCH_TASKS and not slow and not lossy
    return {"tasks": len(rows), "fast": fast, "slow": slow, "lossy": lossy,
            "lossy_last": lossy_last, "met": met}  # fmt: skip


def epoch_floor(rows: list[Result]) -> Result | None:
    """``RECOMMENDED``'s end against the order's noise: its median gap to no sifting (the
    mean of the last ``LAST`` evaluations) and where that lies against the per-seed gaps of
    no sifting in another data order: "worse", "better" or "within" their range; None
    without both rows."""
    by = {r["method"]: r for r in rows if "delta_lasts" in r}
    if RECOMMENDED not in by or NONE_ORDER not in by:
        return None
    gap_, spread = by[RECOMMENDED]["delta_last"], by[NONE_ORDER]["delta_lasts"]
    sign = -1 if by[RECOMMENDED]["regression"] else 1  # + is better for accuracy
    signed, mine = [sign * x for x in spread], sign * gap_
    where = "worse" if mine < min(signed) else "better" if mine > max(signed) else "within"
    return {"gap": gap_, "spread": spread, "where": where,
            "regression": by[RECOMMENDED]["regression"]}  # fmt: skip


def speedup_value(value: float) -> str:
    """A speed-up; 0 stands for a run that never reached the target."""
    return "never" if value == 0 else f"{value:.2f}"


def delta_text(value: float, regression: bool) -> str:
    return f"{100 * value:+.1f}%" if regression else f"{100 * value:+.2f} pt"


def verdict_table(summary: dict[str, list[Result]]) -> str:
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


def layouts(summary: dict[str, list[Result]]) -> list[tuple[str, dict[str, Result]]]:
    """``("one process: mnist1d", rows by method)``, one process first."""
    return [(f"{'2-stage pipeline' if pipeline else 'one process'}: {task}",
             {r["method"]: r for r in rows})
            for pipeline in (False, True)
            for task, rows in on_layout(summary, pipeline)]  # fmt: skip


def recommended_table(summary: dict[str, list[Result]]) -> str:
    header = [
        "layout: task", "kept", "training time saved", "speed-up to target",
        "in optimizer steps", "expected from its pruning (E epochs to the target; k kept)",
        "seconds per step / no sifting's",
        f"end - no sifting's (mean of the last {LAST} evaluations)",
        "no sifting in another data order: the same, per seed", "against that range",
    ]  # fmt: skip
    rows = []
    for name, by in layouts(summary):
        row, floor = by.get(RECOMMENDED, {}), epoch_floor(list(by.values()))
        if "saved" not in row:
            continue
        reg, m = row["regression"], {k: median(v) for k, v in row.get("model", {}).items()}
        model = f"{m['expected']:.2f} (E {m['target_epoch']:.1f}; k {m['k']:.2f})" if m else ""
        rows.append([
            name, f"{row['kept']:.2f}", f"{100 * row['saved']:.0f}%",
            speedup_value(row["speedup"]), speedup_value(row["steps_speedup"]), model,
            f"{row['step_cost']:.2f}", delta_text(row["delta_last"], reg),
            ", ".join(delta_text(x, reg) for x in floor["spread"]) if floor else "",
            floor["where"] if floor else "",
        ])  # fmt: skip
    return report.table(header, rows)


def controls_table(summary: dict[str, list[Result]]) -> str:
    names = {NONE_TF_DATA: "on the tf.data input", NONE_ORDER: "in another data order",
             AGAIN: "again, after the others"}  # fmt: skip

    def cell(row: Result | None) -> str:
        if row is None or "saved" not in row:
            return ""
        steps = speedup_value(row["steps_speedup"])
        return f"{100 * row['saved']:.0f}%; {speedup_value(row['speedup'])}; {steps}"

    header = ["layout: task", *(f"no sifting {text}" for text in names.values())]
    return report.table(
        header, [[n, *(cell(by.get(c)) for c in names)] for n, by in layouts(summary)]
    )


def render(raw: Result, meta: Result, settings: Settings) -> str:
    # a --json file from before the harness holds the list of jobs itself
    summary = epoch_summary(raw if isinstance(raw, list) else list(raw["jobs"]))
    return BENCH.section(
        meta, verdict_table(summary),
        f"### `{RECOMMENDED}` on `from_arrays` against no sifting (medians of the seeds)",
        recommended_table(summary),
        "### The controls: training time saved; speed-up to target; in optimizer steps",
        controls_table(summary),
    )  # fmt: skip


def options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--tasks", nargs="+", choices=[t.name for t in TASKS], help="these only")
    p.add_argument("--seeds", type=int, help="seeds 0..N-1 (the docs' table: 3)")
    return p


def subset(args: argparse.Namespace) -> Settings:
    """The jobs of ``--tasks`` (on both layouts; the quick run on its one pipeline task)
    and ``--seeds``."""
    base = QUICK if args.quick else FULL
    names = args.tasks or [t.name for t in TASKS]
    tasks = tuple(t for t in base.tasks if t.name in names)
    pipeline = tuple(n for n in base.pipeline_tasks if n in names)
    seeds = tuple(range(args.seeds)) if args.seeds else base.seeds
    return dataclasses.replace(base, tasks=tasks, pipeline_tasks=pipeline, seeds=seeds)


def main(argv: list[str] | None = None) -> None:
    own = options(argparse.ArgumentParser(add_help=False))
    cli = parser(BENCH, own)
    args = cli.parse_args(argv)
    at_least_one(cli, seeds=args.seeds)
    if (args.tasks or args.seeds) and not args.no_docs:
        cli.error("--tasks or --seeds needs --no-docs (the docs keep the full run)")
    # without a subset a --render of a --quick file renders the quick settings
    run(BENCH, argv, settings=subset(args) if args.tasks or args.seeds else None, own=own)


BENCH: Benchmark[Settings] = Benchmark(
    "sifting-epochs", __doc__.splitlines()[0], FULL, QUICK, measure, render
)

if __name__ == "__main__":
    main()
