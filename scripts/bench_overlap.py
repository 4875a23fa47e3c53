"""What does a sifted training step cost on a 2-stage pipeline, against a plain one on the same cut?

Each variant trains examples/sift_mnist1d.py's 1-D ConvNet (with 2 convolutions, and 4)
on MNIST-1D, 2 ranks (partitions=2, microbatches=4), on the cut the profile of its
model's first variant gave (``profiled``) or after the first convolution (``after
conv0``). Variants named ``cut for it`` share a cut of their own: told by ``tfsift.sift``
that stage 0 will score in its waits, the planner leaves it room for that; ``no sifting,
cut for it`` trains plain on that plan. Options (defaults: the full run):

    .venv/bin/python scripts/bench_overlap.py [--quick] [--no-docs] [--json F | --render F]
        [--convs 2 4] [--cuts profiled "after conv0"] [--variants NAME ...] [--repeats 3]
        [--steps 100] [--warmup 30] [--samples 20000] [--batch 128] [--score-batches 8]
        [--pipeline interleaved|simple] [--source samples|batches]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import harness, report
from bench.harness import Result
from bench.main import Benchmark, run

WORKER = Path(__file__).with_name("_bench_overlap_worker.py")
PLAIN, OWN_CUT = "no sifting", "cut for it"  # OWN_CUT as in the worker
OWN_PLAIN = f"{PLAIN}, {OWN_CUT}"
POLICY = {"policy": "relative", "beta": 1.0}  # every sifted variant's
# tfsift.init's options: the pipeline, and each cut's (the model puts all but its first
# convolution in partition 1, which only auto_partition=False follows)
PIPELINE = {"partitions": 2, "microbatches": 4, "profile_repeats": 3}
CUTS = {"profiled": {"auto_partition": True}, "after conv0": {"auto_partition": False}}
OVERLAP = {"scorer": "early_exit", "overlap": True}
VARIANTS: dict[str, dict[str, Any] | None] = {  # SiftConfig options; None: no sifting
    PLAIN: None,
    "relative beta=1, full scoring": {"scorer": "full"},
    "relative beta=1, early exit": {"scorer": "early_exit"},
    "relative beta=1, early exit + overlap": OVERLAP,
    # the default exit (stage 0's last layer) on a cut that gives stage 0 room for the
    # scoring (solve_speed's scoring); profiled cut only, with its own plan file
    f"relative beta=1, early exit + overlap, {OWN_CUT}": {**OVERLAP, "exit_after": None},
    # the same, keeping unscored what no wait had room to score (SiftConfig.leftover)
    f"relative beta=1, early exit + overlap, leftover kept, {OWN_CUT}": {
        **OVERLAP,
        "exit_after": None,
        "leftover": "keep",
    },
    OWN_PLAIN: None,  # on the plan file the variants above made (one must run first)
}


PIPELINES, SOURCES = ("interleaved", "simple"), ("samples", "batches")


@dataclass(frozen=True)
class Settings:
    steps: int = 100  # timed optimizer steps per run
    warmup: int = 30  # steps before them, that trace and warm up
    repeats: int = 3  # runs of each variant, in rotating order
    batch: int = 128
    samples: int = 20000  # MNIST-1D samples generated (80% train)
    score_batches: int = 8  # g of SiftConfig
    convs: tuple[int, ...] = (2, 4)  # the models: convolutions in each
    cuts: tuple[str, ...] = ("profiled",)
    variants: tuple[str, ...] = tuple(n for n in VARIANTS if n.endswith(OWN_CUT))
    pipeline: str = "interleaved"  # the schedule: interleaved (1F1B) or simple (GPipe)
    source: str = "samples"  # batched by tf.data, or "batches" sliced from arrays

    def __post_init__(self) -> None:
        choices = {"cuts": CUTS, "variants": VARIANTS, "pipeline": PIPELINES, "source": SOURCES}
        for field, names in choices.items():
            value = getattr(self, field)
            if unknown := set(value if isinstance(value, tuple) else (value,)) - set(names):
                raise ValueError(f"{field} must be in {list(names)}. Received: {sorted(unknown)}")
        if min(self.steps, self.warmup, self.repeats) < 1:
            raise ValueError(
                "steps, warmup and repeats must be positive. "
                f"Received: steps={self.steps}, warmup={self.warmup}, repeats={self.repeats}"
            )


FULL = Settings()
QUICK = Settings(
    steps=10, warmup=5, repeats=1, samples=4000, convs=(2,), variants=FULL.variants[1:]
)


def variants(s: Settings, cut: str) -> dict[str, dict[str, Any] | None]:
    """The variants a model's job runs: no sifting, the chosen ones, and no sifting on
    the own cut when any variant has one (those on the profiled cut only)."""
    names = [n for n in VARIANTS if n in s.variants or n == PLAIN]
    if any(n.endswith(OWN_CUT) for n in names) and OWN_PLAIN not in names:
        names.append(OWN_PLAIN)
    return {n: VARIANTS[n] for n in names if cut == "profiled" or not n.endswith(OWN_CUT)}


def measure(s: Settings) -> Result:
    """One 2-rank job per model (convolutions, cut): each rank's runs, by model."""
    jobs = {}
    for convs in s.convs:
        for cut in s.cuts:
            job = dataclasses.asdict(s) | {
                "convs": convs,
                "config": {**PIPELINE, "pipeline": s.pipeline, **CUTS[cut]},
                "plan": str(Path(tempfile.mkdtemp(prefix="tfsift-overlap-")) / "plan.json"),
                "policy": POLICY,
                "variants": variants(s, cut),
            }
            harness.say(f"{convs} convolutions, cut {cut}")
            ranks = harness.run_job(WORKER, [json.dumps(job)], 2, timeout=3600, bind="core")
            jobs[f"{convs} convolutions, cut {cut}"] = ranks
    return {"settings": dataclasses.asdict(s), "jobs": jobs}


def _median(values: Any) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return float(np.median(kept)) if kept else math.nan


def figures(run: Result) -> dict[str, float]:
    """One run's figures on one rank, in seconds (and its sifting metrics)."""
    t, after = np.array(run["t"]), np.array(run["after"], dtype=bool)
    parts = np.diff(t, axis=1)  # next batch, step, update
    m = run["metrics"]
    return {
        "seconds": (t[-1, 3] - run["start"]) / len(t),
        **dict(zip(("next", "step", "update"), parts.mean(axis=0).tolist(), strict=True)),
        "step after": _median(parts[after, 1]),
        "step others": _median(parts[~after, 1]),
        **m,
        "unscored": m.get("samples_unscored", 0) / max(m.get("samples_seen", 0), 1),
    }


def medians(runs: list[Result]) -> dict[str, float]:
    """Each figure's median over a variant's runs on one rank."""
    every = [figures(run) for run in runs]
    return {k: _median([f[k] for f in every]) for k in every[0]}


def _ms(*seconds: float) -> str:
    return " / ".join("-" if math.isnan(v) else f"{v * 1e3:.1f}" for v in seconds)


def _pct(f: dict[str, float], *keys: str) -> str:
    return " / ".join(f"{f[k]:.0%}" for k in keys) if keys[0] in f else ""


HEADS = (
    "stage 0 ends at|ms per step (median)|range|vs no sifting on its cut|kept / kept unscored",
    "next batch / step / update|scored waiting|stage 0 waits per step / a unit (ms)|late receives",
    "after a round / others",
)


def tables(ranks: list[Result]) -> list[str]:
    """One model's tables: the step, where each rank's step goes, after a round or not."""
    every = [{name: medians(runs) for name, runs in rank.items()} for rank in ranks]
    rows: tuple[list[list[str]], ...] = ([], [], [])
    for name, runs in ranks[0].items():
        f, times = every[0][name], [figures(run)["seconds"] for run in runs]
        ratio = f["seconds"] / every[0][OWN_PLAIN if name.endswith(OWN_CUT) else PLAIN]["seconds"]
        spread = f"{_ms(min(times))} to {_ms(max(times))}"
        kept = _pct(f, "kept_fraction", "unscored")
        rows[0].append([name, runs[0]["stage0"], _ms(f["seconds"]), spread, f"{ratio:.2f}x", kept])
        room = f.get("overlap_wait_ms"), f.get("overlap_unit_ms")
        waits = f"{room[0]:.1f} / {room[1]:.2f}" if room[1] is not None else ""
        parts = [_ms(e[name]["next"], e[name]["step"], e[name]["update"]) for e in every]
        rows[1].append(
            [name, *parts, _pct(f, "overlapped_fraction"), waits, _pct(f, "overlap_late_fraction")]
        )
        rows[2].append([name, *(_ms(e[name]["step after"], e[name]["step others"]) for e in every)])
    heads = [h.split("|") for h in HEADS]
    per_rank = [[f"rank {r}: {h[0]}" for r in range(len(ranks))] + h[1:] for h in heads[1:]]
    return [
        report.table(["variant", *h], r) for h, r in zip([heads[0], *per_rank], rows, strict=True)
    ]


def command(s: Settings) -> str:
    """The command line that reruns ``s``: the options where it differs from the full run."""
    words = [BENCH.command, *(["--quick"] if s == QUICK else [])]
    for field in dataclasses.fields(s) if s != QUICK else ():
        value, flag = getattr(s, field.name), "--" + field.name.replace("_", "-")
        if value != getattr(FULL, field.name):
            values = value if isinstance(value, tuple) else (value,)
            words.append(" ".join([flag, *(shlex.quote(str(v)) for v in values)]))
    return " ".join(words)


def render(raw: Result, meta: Result, _: Settings) -> str:
    s = Settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw["settings"].items()})
    intro = (
        f"Per model: ms per step on rank 0 (2 ranks, a core each; {s.pipeline} schedule, batch "
        f"{s.batch} in 4 microbatches, {s.source} source; sifted: relative, beta=1, "
        f"g={s.score_batches}; median of {s.repeats} runs of {s.steps} steps after {s.warmup}),"
        " against no sifting on the same cut; where each rank's step goes (means); its step "
        "right after a round (the sifted dataset read and scored source batches in its next())"
        " and the others."
    )
    parts = ["## Sifted step time on a 2-stage pipeline (overlap)", intro]
    for model, ranks in raw["jobs"].items():
        parts += [f"### {model}", *tables(ranks)]
    return "\n\n".join([*parts, report.provenance(meta, command(s))])


BENCH = Benchmark(
    name="overlap",
    question=__doc__.splitlines()[0],
    full=FULL,
    quick=QUICK,
    measure=measure,
    render=render,
)


def main(argv: list[str] | None = None) -> None:
    """Parses the settings' options (``--steps 50``, ``--convs 2 4``...) off the command
    line and hands the rest (``--quick``, ``--json``...) to ``bench.main.run``."""
    p = argparse.ArgumentParser(add_help=False)
    for field in dataclasses.fields(Settings):
        flag, default = "--" + field.name.replace("_", "-"), getattr(FULL, field.name)
        if isinstance(default, tuple):
            p.add_argument(flag, nargs="+", type=type(default[0]))
        else:
            p.add_argument(flag, type=type(default))
    known, rest = p.parse_known_args(argv)
    given = {k: v for k, v in vars(known).items() if v is not None}
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
    base = QUICK if "--quick" in rest else FULL
    run(BENCH, argv, dataclasses.replace(base, **given) if given else None, own=p)


if __name__ == "__main__":
    main()
