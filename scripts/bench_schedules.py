"""Do the zero-bubble schedule and virtual stages beat 1F1B on the conv chain, and what does
splitting cost?

bench_pipeline's conv chain (Conv2D(128, 3x3, same, relu) x 8 on 16 x 16 x 128 images,
B=128; one compute thread per rank, ranks bound to cores), K=2, M=8, optimize="speed":

- the split: one process runs the chain's second half as a stage whose input gradients
  are wanted, on a microbatch of B/M samples, its backward fused (the tape around the
  stage's compiled forward, as 1F1B runs it) and split into B then W
  (``tfsift.pipeline.split``, as the zero-bubble schedule runs it), every action timed
  alone, the two in alternating rounds;
- paired rounds: a K=2 job of ``interleaved``, one of ``zero_bubble`` (deferring the W's
  that fit in 1F1B's peak), one of ``zero_bubble`` with room for ZB-H1's deferral
  (``memory_cap`` 1 GB: ``zero_bubble@1GB``) and one of ``interleaved`` on 2 virtual
  stages (Megatron-LM's interleaved 1F1B, 2 chunks a rank: ``interleaved/2``) in each
  round (the order rotating), each timing its steps (the
  slowest rank's time of steps started together, the median) and each rank's peak
  tensor bytes during them above those in use when they began (what a step holds:
  activations, gradients, messages; TensorFlow's CPU allocator's own count, run with
  statistics; the RSS does not show it: that allocator keeps what it took); the ratio of
  each round's steps to ``interleaved``'s, and its median over the rounds, against the
  ratio of the steps (and of the peak memory) each job's start-up plan predicted (which
  charges the virtual stages' extra transfers and actions).

usage: .venv/bin/python scripts/bench_schedules.py [--quick] [--no-docs] [--json F] [--render F]
"""

from __future__ import annotations

import dataclasses
import json
import statistics

from bench_pipeline import WORKER
from bench_pipeline import Settings as ChainSettings

from bench import harness, report
from bench.harness import Result, say
from bench.main import Benchmark, run

BASE, ZERO_BUBBLE, ZB_H1, VIRTUAL = "interleaved", "zero_bubble", "zero_bubble@1GB", "interleaved/2"
SCHEDULES = (BASE, ZERO_BUBBLE, ZB_H1, VIRTUAL)  # pipeline[/virtual stages][@memory cap]
SPLITTING = (ZERO_BUBBLE, ZB_H1)
TARGET_STEP, TARGET_MEMORY, TARGET_SPLIT, TARGET_PREDICTION = 0.95, 1.10, 1.10, 0.03
# TensorFlow's CPU allocator with statistics (the BFC allocator GPUs use), in every job alike
ALLOCATOR = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}
MIB = 2**20


@dataclasses.dataclass(frozen=True)
class Settings:
    chain: ChainSettings = dataclasses.field(default_factory=ChainSettings)
    M: int = 8
    rounds: int = 5  # paired rounds: a job of each schedule per round
    split_steps: int = 30  # timed rounds of the split measurement


QUICK = Settings(
    chain=ChainSettings(width=32, warmup=1, steps=3, profile_repeats=2),
    rounds=1,
    split_steps=3,
)


def schedule_config(token: str) -> Result:
    """A schedule token's worker config: ``interleaved/2`` is ``interleaved`` on 2 virtual
    stages, ``zero_bubble@1GB`` ``zero_bubble`` under a memory cap of 1 GB.

    Example:
        >>> schedule_config("interleaved/2")
        {'pipeline': 'interleaved', 'virtual_stages': 2}
        >>> schedule_config("zero_bubble@1GB")
        {'pipeline': 'zero_bubble', 'memory_cap': '1GB'}
    """
    token, _, cap = token.partition("@")
    pipeline, _, v = token.partition("/")
    return {
        "pipeline": pipeline,
        **({"virtual_stages": int(v)} if v else {}),
        **({"memory_cap": cap} if cap else {}),
    }


def measure(s: Settings) -> Result:
    c = s.chain
    say(f"one process: the chain's second half, M={s.M}: fused backward and B + W")
    cfg = c.worker_config(M=s.M, steps=s.split_steps)
    split = harness.run_job(WORKER, ["split", json.dumps(cfg)], 1, timeout=900)[0]["times"]
    rounds: list[dict[str, Result]] = []
    for r, token in harness.rotations(SCHEDULES, s.rounds):
        if len(rounds) == r:
            rounds.append({})
        say(f"round {r}: K={c.K}, M={s.M}, {token}")
        config = c.worker_config(M=s.M, optimize="speed", **schedule_config(token))
        ranks = harness.run_job(
            WORKER, ["pipeline", json.dumps(config)], c.K, timeout=900, env=ALLOCATOR
        )
        rounds[r][token] = {
            "times": ranks[0]["times"],
            "predicted": ranks[0]["startup_predicted_s"],
            "tensor_mib": [
                (k["tensor_peak_bytes"] - k["tensor_resting_bytes"]) / MIB for k in ranks
            ],
            "predicted_peak_mib": max(ranks[0]["predicted_peak_bytes"]) / MIB,
            "action_s": [k["action_s"] for k in ranks],
            "bounds": ranks[0]["bounds"],
            "deferred": ranks[0].get("deferred"),
        }
    return {"split": split, "rounds": rounds}


def split_summary(times: dict[str, list[float]]) -> Result:
    """Medians of each action, in ms, and (B + W) / the fused backward."""
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    return ms | {"ratio": (ms["B"] + ms["W"]) / ms["B_fused"]}


def rounds_summary(rounds: list[dict[str, Result]], other: str = ZERO_BUBBLE) -> Result:
    """Per round: ``interleaved``'s and ``other``'s median step (ms) and other /
    interleaved; the medians over the rounds of that ratio, of the predicted one and of
    the peak ratios (tensors, predicted), each of the rank that held the most."""
    rows = []
    pair = (BASE, other)
    for r in rounds:
        step = {p: 1e3 * statistics.median(r[p]["times"]) for p in pair}
        tensors = {p: max(r[p]["tensor_mib"]) for p in pair}
        rows.append(
            {
                "step_ms": step,
                "ratio": step[other] / step[BASE],
                "predicted": r[other]["predicted"] / r[BASE]["predicted"],
                "tensor_mib": tensors,
                "tensor_ratio": tensors[other] / tensors[BASE],
                "predicted_peak": r[other]["predicted_peak_mib"] / r[BASE]["predicted_peak_mib"],
            }
        )
    return {
        "rows": rows,
        "ratio": statistics.median(row["ratio"] for row in rows),
        "predicted": statistics.median(row["predicted"] for row in rows),
        "tensor_ratio": statistics.median(row["tensor_ratio"] for row in rows),
        "predicted_peak": statistics.median(row["predicted_peak"] for row in rows),
    }


def render(raw: Result, meta: Result, s: Settings) -> str:
    c = s.chain
    measured = set(raw["rounds"][0]) if raw["rounds"] else set()
    others = [t for t in SCHEDULES[1:] if t in measured]
    parts = [
        report.provenance(meta, BENCH.command),
        f"### Conv2D({c.width}, 3x3) x {c.layers} on {c.side} x {c.side} x {c.width}, "
        f"B={c.batch}, K={c.K}, M={s.M}",
    ]
    split = split_summary(raw["split"]) if raw.get("split") else None
    if measured & set(SPLITTING) and split is not None:
        parts += [
            f"Backward of the second half, one microbatch, one process (ms, median of "
            f"{s.split_steps}):",
            report.table(
                ["backward", "forward", "backward", "B", "W"],
                [
                    ["fused (1F1B)", f"{split['F']:.2f}", f"{split['B_fused']:.2f}", "-", "-"],
                    [
                        "split (zero-bubble)",
                        f"{split['F_split']:.2f}",
                        f"{split['B'] + split['W']:.2f}",
                        f"{split['B']:.2f}",
                        f"{split['W']:.2f}",
                    ],
                ],
            ),
        ]
    summaries = {t: rounds_summary(raw["rounds"], t) for t in others}

    def round_row(i: int) -> list[str]:
        row = [str(i), f"{summaries[others[0]]['rows'][i]['step_ms'][BASE]:.1f}"]
        row += [f"{summaries[t]['rows'][i]['step_ms'][t]:.1f}" for t in others]
        for t in others:
            got = summaries[t]["rows"][i]
            row += [f"{got['ratio']:.3f}", f"{got['predicted']:.3f}"]
        peaks = [summaries[others[0]]["rows"][i]["tensor_mib"][BASE]]
        peaks += [summaries[t]["rows"][i]["tensor_mib"][t] for t in others]
        return [*row, " / ".join(f"{p:.1f}" for p in peaks)]

    rounds = [round_row(i) for i in range(len(raw["rounds"]))]
    parts += [
        f"Paired rounds (step: median of {c.steps} after {c.warmup} warm-up; peak: the "
        "most a rank's tensors rose during them, MiB, as TensorFlow's allocator counts them):",
        report.table(
            [
                "round",
                f"{BASE} ms",
                *(f"{t} ms" for t in others),
                *(h for t in others for h in (f"{t} / {BASE}", "predicted")),
                "peak tensors (" + " / ".join((BASE, *others)) + ")",
            ],
            rounds,
        ),
        report.table(
            ["against interleaved, median of the rounds", "measured", "predicted", "target"],
            summary_rows(summaries, split),
        ),
    ]
    deferred = {t: raw["rounds"][0][t].get("deferred") for t in others if t in SPLITTING}
    if any(d is not None for d in deferred.values()):
        parts.append(
            "W's deferred per stage (the plans'): "
            + "; ".join(f"{t}: {d}" for t, d in deferred.items() if d is not None)
        )
    return "\n\n".join(parts)


def summary_rows(summaries: dict[str, Result], split: Result | None) -> list[list[str]]:
    """The measured ratios beside the plan lines' and the issue's targets."""
    rows = []
    for t in (t for t in SPLITTING if t in summaries):
        zb = summaries[t]
        rows += [
            [f"{t} step", f"{zb['ratio']:.3f}", f"{zb['predicted']:.3f}",
             target(zb["ratio"], TARGET_STEP)],
            [f"{t} peak tensors", f"{zb['tensor_ratio']:.3f}",
             f"{zb['predicted_peak']:.3f}", target(zb["tensor_ratio"], TARGET_MEMORY)],
            [f"{t} prediction's error",
             f"{abs(zb['predicted'] - zb['ratio']) / zb['ratio']:.1%}", "-",
             target(abs(zb["predicted"] - zb["ratio"]) / zb["ratio"], TARGET_PREDICTION, True)],
        ]  # fmt: skip
    if set(SPLITTING) & set(summaries):
        if split is not None:
            ratio = split["ratio"]
            rows.append(["B + W / fused backward", f"{ratio:.3f}", "-",
                         target(ratio, TARGET_SPLIT)])  # fmt: skip
    if VIRTUAL in summaries:
        v = summaries[VIRTUAL]
        rows += [
            [f"{VIRTUAL} step", f"{v['ratio']:.3f}", f"{v['predicted']:.3f}", "-"],
            [
                f"{VIRTUAL} peak tensors",
                f"{v['tensor_ratio']:.3f}",
                f"{v['predicted_peak']:.3f}",
                "-",
            ],
        ]
    return rows


def target(value: float, limit: float, percent: bool = False) -> str:
    """``<= limit``, met or missed.

    Example:
        >>> target(0.97, 0.95), target(0.012, 0.03, percent=True)
        ('<= 0.95: missed', '<= 3%: met')
    """
    shown = f"{limit:.0%}" if percent else f"{limit:.2f}"
    return f"<= {shown}: {'met' if value <= limit else 'missed'}"


BENCH = Benchmark(
    name="schedules",
    question=__doc__.splitlines()[0],
    full=Settings(),
    quick=QUICK,
    measure=measure,
    render=render,
)


if __name__ == "__main__":
    run(BENCH)
