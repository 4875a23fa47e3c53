"""Do the zero-bubble schedule and virtual stages beat 1F1B on the conv chain, and what does
splitting cost?

The split: the chain's second half as a stage, its backward fused (1F1B) and split into B
then W (zero bubble), timed alone. Paired rounds of K=2 jobs of ``SCHEDULES``: each job's
median step and each rank's peak tensor bytes above those at rest (TensorFlow's allocator's
own count: the RSS does not show it), against what the start-up plan predicted.
"""

from __future__ import annotations

import dataclasses
from statistics import median

from bench_pipeline import Settings as ChainSettings
from bench_pipeline import run_job

from bench import harness, report
from bench.harness import Result
from bench.main import Benchmark, run

BASE, ZERO_BUBBLE, ZB_H1, VIRTUAL = "interleaved", "zero_bubble", "zero_bubble@1GB", "interleaved/2"
SCHEDULES = (BASE, ZERO_BUBBLE, ZB_H1, VIRTUAL)  # pipeline[/virtual stages][@memory cap]
SPLITTING = (ZERO_BUBBLE, ZB_H1)  # ZB_H1: room for ZB-H1's deferral
TARGET_STEP, TARGET_MEMORY, TARGET_SPLIT, TARGET_PREDICTION = 0.95, 1.10, 1.10, 0.03
ALLOCATOR = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}  # with statistics, in every job alike
MIB = 2**20


@dataclasses.dataclass(frozen=True)
class Settings:
    chain: ChainSettings = dataclasses.field(default_factory=ChainSettings)
    M: int = 8
    rounds: int = 5  # paired rounds: a job of each schedule per round
    split_steps: int = 30  # timed rounds of the split measurement


QUICK = Settings(chain=ChainSettings(width=32, warmup=1, steps=3, profile_repeats=2), rounds=1,
                 split_steps=3)  # fmt: skip


def schedule_config(token: str) -> Result:
    """A schedule's worker config: ``interleaved/2`` is ``interleaved`` on 2 virtual stages,
    ``zero_bubble@1GB`` ``zero_bubble`` under a memory cap of 1 GB."""
    token, _, cap = token.partition("@")
    pipeline, _, v = token.partition("/")
    return {"pipeline": pipeline, **({"virtual_stages": int(v)} if v else {}),
            **({"memory_cap": cap} if cap else {})}  # fmt: skip


def measure(s: Settings) -> Result:
    c = s.chain
    split = run_job(1, "split", c.worker_config(M=s.M, steps=s.split_steps))[0]["times"]

    def job(token: str) -> Result:
        config = c.worker_config(M=s.M, optimize="speed", **schedule_config(token))
        ranks = run_job(c.K, "pipeline", config, env=ALLOCATOR)
        return {
            "times": ranks[0]["times"],
            "predicted": ranks[0]["startup_predicted_s"],
            "tensor_mib": [(k["tensor_peak_bytes"] - k["tensor_resting_bytes"]) / MIB
                           for k in ranks],
            "predicted_peak_mib": max(ranks[0]["predicted_peak_bytes"]) / MIB,
            "action_s": [k["action_s"] for k in ranks],
            "bounds": ranks[0]["bounds"],
            "deferred": ranks[0].get("deferred"),
        }  # fmt: skip

    return {"split": split, "rounds": harness.rounds(SCHEDULES, s.rounds, job)}


def rounds_summary(rounds: list[dict[str, Result]], other: str) -> Result:
    """Per round: ``interleaved``'s and ``other``'s median step (ms), other / interleaved,
    and the same of the predicted steps and of the peaks (of the rank that held the most);
    and the medians of those ratios over the rounds."""
    rows = []
    for r in rounds:
        step = {p: 1e3 * median(r[p]["times"]) for p in (BASE, other)}
        tensors = {p: max(r[p]["tensor_mib"]) for p in (BASE, other)}
        rows.append({
            "step_ms": step, "ratio": step[other] / step[BASE],
            "predicted": r[other]["predicted"] / r[BASE]["predicted"],
            "tensor_mib": tensors, "tensor_ratio": tensors[other] / tensors[BASE],
            "predicted_peak": r[other]["predicted_peak_mib"] / r[BASE]["predicted_peak_mib"],
        })  # fmt: skip
    keys = ("ratio", "predicted", "tensor_ratio", "predicted_peak")
    return {"rows": rows} | {k: median(row[k] for row in rows) for k in keys}


def render(raw: Result, meta: Result, s: Settings) -> str:
    c = s.chain
    measured = set(raw["rounds"][0]) if raw["rounds"] else set()
    others = [t for t in SCHEDULES[1:] if t in measured]
    parts = [f"### Conv2D({c.width}, 3x3) x {c.layers} on {c.side} x {c.side} x {c.width}, "
             f"B={c.batch}, K={c.K}, M={s.M}"]  # fmt: skip
    split = raw.get("split") and {k: 1e3 * median(v) for k, v in raw["split"].items()}
    if measured & set(SPLITTING) and split:
        parts += [
            f"Backward of the second half, one microbatch, one process (ms, median of "
            f"{s.split_steps}):",
            report.table(["backward", "forward", "backward", "B", "W"], [
                ["fused (1F1B)", f"{split['F']:.2f}", f"{split['B_fused']:.2f}", "-", "-"],
                ["split (zero-bubble)", f"{split['F_split']:.2f}",
                 f"{split['B'] + split['W']:.2f}", f"{split['B']:.2f}", f"{split['W']:.2f}"],
            ]),
        ]  # fmt: skip
    summaries = {t: rounds_summary(raw["rounds"], t) for t in others}

    def round_row(i: int) -> list[str]:
        rows = {t: summaries[t]["rows"][i] for t in others}
        first = rows[others[0]]
        peaks = [first["tensor_mib"][BASE], *(rows[t]["tensor_mib"][t] for t in others)]
        return [str(i), f"{first['step_ms'][BASE]:.1f}",
                *(f"{rows[t]['step_ms'][t]:.1f}" for t in others),
                *(f"{rows[t][k]:.3f}" for t in others for k in ("ratio", "predicted")),
                report.listed(peaks, ".1f", " / ")]  # fmt: skip

    header = ["round", f"{BASE} ms", *(f"{t} ms" for t in others),
              *(h for t in others for h in (f"{t} / {BASE}", "predicted")),
              "peak tensors (" + " / ".join((BASE, *others)) + ")"]  # fmt: skip
    parts += [
        f"Paired rounds (step: median of {c.steps} after {c.warmup} warm-up; peak: the "
        "most a rank's tensors rose during them, MiB, as TensorFlow's allocator counts them):",
        report.table(header, [round_row(i) for i in range(len(raw["rounds"]))]),
        report.table(
            ["against interleaved, median of the rounds", "measured", "predicted", "target"],
            summary_rows(summaries, split),
        ),
    ]
    deferred = {t: raw["rounds"][0][t].get("deferred") for t in others if t in SPLITTING}
    if any(d is not None for d in deferred.values()):
        listed = "; ".join(f"{t}: {d}" for t, d in deferred.items() if d is not None)
        parts.append(f"W's deferred per stage (the plans'): {listed}")
    return BENCH.section(meta, *parts)


def summary_rows(summaries: dict[str, Result], split: Result | None) -> list[list[str]]:
    """The measured ratios beside the plan lines' and the issue's targets."""
    rows = []
    for t in (t for t in SPLITTING if t in summaries):
        zb = summaries[t]
        error = abs(zb["predicted"] - zb["ratio"]) / zb["ratio"]
        rows += [
            [f"{t} step", f"{zb['ratio']:.3f}", f"{zb['predicted']:.3f}",
             target(zb["ratio"], TARGET_STEP)],
            [f"{t} peak tensors", f"{zb['tensor_ratio']:.3f}", f"{zb['predicted_peak']:.3f}",
             target(zb["tensor_ratio"], TARGET_MEMORY)],
            [f"{t} prediction's error", f"{error:.1%}", "-",
             target(error, TARGET_PREDICTION, True)],
        ]  # fmt: skip
    if set(SPLITTING) & set(summaries) and split:
        ratio = (split["B"] + split["W"]) / split["B_fused"]
        rows.append(["B + W / fused backward", f"{ratio:.3f}", "-", target(ratio, TARGET_SPLIT)])
    if VIRTUAL in summaries:
        v = summaries[VIRTUAL]
        rows += [[f"{VIRTUAL} step", f"{v['ratio']:.3f}", f"{v['predicted']:.3f}", "-"],
                 [f"{VIRTUAL} peak tensors", f"{v['tensor_ratio']:.3f}",
                  f"{v['predicted_peak']:.3f}", "-"]]  # fmt: skip
    return rows


def target(value: float, limit: float, percent: bool = False) -> str:
    """``<= limit``, met or missed.

    Example:
        >>> target(0.97, 0.95), target(0.012, 0.03, percent=True)
        ('<= 0.95: missed', '<= 3%: met')
    """
    shown = f"{limit:.0%}" if percent else f"{limit:.2f}"
    return f"<= {shown}: {'met' if value <= limit else 'missed'}"


BENCH = Benchmark("schedules", __doc__.splitlines()[0], Settings(), QUICK, measure, render)

if __name__ == "__main__":
    run(BENCH)
