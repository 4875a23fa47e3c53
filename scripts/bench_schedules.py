"""Do the zero-bubble schedule and virtual stages beat 1F1B on the conv chain, and what does
splitting cost?

bench_pipeline's conv chain (Conv2D(128, 3x3, same, relu) x 8 on 16 x 16 x 128 images,
B=128; one compute thread per rank, ranks bound to cores), K=2, M=8, optimize="speed":

- the split: one process runs the chain's second half as a stage whose input gradients
  are wanted, on a microbatch of B/M samples, its backward fused (the tape around the
  stage's compiled forward, as 1F1B runs it) and split into B then W
  (``tfsift.pipeline.split``, as the zero-bubble schedule runs it), every action timed
  alone, the two in alternating rounds;
- paired rounds: a K=2 job of ``interleaved``, one of ``zero_bubble`` and one of
  ``interleaved`` on 2 virtual stages (Megatron-LM's interleaved 1F1B, 2 chunks a rank:
  ``interleaved/2``) in each round (the order rotating), each timing its steps (the
  slowest rank's time of steps started together, the median) and each rank's peak RSS
  during them above its RSS when they began (what a step holds: activations, gradients,
  messages); the ratio of each round's steps to ``interleaved``'s, and its median over
  the rounds, against the ratio of the steps each job's start-up plan line predicted
  (which charges the virtual stages' extra transfers and actions).

usage: .venv/bin/python scripts/bench_schedules.py [--quick] [--no-docs] [--json F] [--render F]
       [--schedules interleaved,interleaved/2]  (a subset, ``interleaved`` in it; needs
       --no-docs, lest it overwrite the docs' table of all three)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

from bench_pipeline import WORKER
from bench_pipeline import Settings as ChainSettings

from bench import harness, report
from bench.harness import Result, say
from bench.main import Benchmark, run

BASE, ZERO_BUBBLE, VIRTUAL = "interleaved", "zero_bubble", "interleaved/2"
SCHEDULES = (BASE, ZERO_BUBBLE, VIRTUAL)  # pipeline[/virtual stages]
TARGET_STEP, TARGET_MEMORY, TARGET_SPLIT, TARGET_PREDICTION = 0.95, 1.10, 1.10, 0.03


@dataclasses.dataclass(frozen=True)
class Settings:
    chain: ChainSettings = dataclasses.field(default_factory=ChainSettings)
    M: int = 8
    rounds: int = 5  # paired rounds: a job of each schedule per round
    split_steps: int = 30  # timed rounds of the split measurement (with zero_bubble)
    schedules: tuple[str, ...] = SCHEDULES


QUICK = Settings(
    chain=ChainSettings(width=32, warmup=1, steps=3, profile_repeats=2),
    rounds=1,
    split_steps=3,
)


def schedule_config(token: str) -> Result:
    """A schedule token's worker config: ``interleaved/2`` is ``interleaved`` on 2 virtual
    stages.

    Example:
        >>> schedule_config("interleaved/2")
        {'pipeline': 'interleaved', 'virtual_stages': 2}
    """
    pipeline, _, v = token.partition("/")
    return {"pipeline": pipeline, **({"virtual_stages": int(v)} if v else {})}


def measure(s: Settings) -> Result:
    c = s.chain
    split = None
    if ZERO_BUBBLE in s.schedules:
        say(f"one process: the chain's second half, M={s.M}: fused backward and B + W")
        cfg = c.worker_config(M=s.M, steps=s.split_steps)
        split = harness.run_job(WORKER, ["split", json.dumps(cfg)], 1, timeout=900)[0]["times"]
    rounds: list[dict[str, Result]] = []
    for r, token in harness.rotations(s.schedules, s.rounds):
        if len(rounds) == r:
            rounds.append({})
        say(f"round {r}: K={c.K}, M={s.M}, {token}")
        config = c.worker_config(M=s.M, optimize="speed", **schedule_config(token))
        ranks = harness.run_job(WORKER, ["pipeline", json.dumps(config)], c.K, timeout=900)
        rounds[r][token] = {
            "times": ranks[0]["times"],
            "predicted": ranks[0]["startup_predicted_s"],
            "step_mib": [k["maxrss_timed_mib"] - k["rss_reset_mib"] for k in ranks],
            "action_s": [k["action_s"] for k in ranks],
            "bounds": ranks[0]["bounds"],
        }
    return {"split": split, "rounds": rounds}


def split_summary(times: dict[str, list[float]]) -> Result:
    """Medians of each action, in ms, and (B + W) / the fused backward."""
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    return ms | {"ratio": (ms["B"] + ms["W"]) / ms["B_fused"]}


def rounds_summary(rounds: list[dict[str, Result]], other: str = ZERO_BUBBLE) -> Result:
    """Per round: ``interleaved``'s and ``other``'s median step (ms) and other /
    interleaved; the medians over the rounds of that ratio, of the predicted one and of
    the peak ratio."""
    rows = []
    pair = (BASE, other)
    for r in rounds:
        step = {p: 1e3 * statistics.median(r[p]["times"]) for p in pair}
        peak = {p: max(r[p]["step_mib"]) for p in pair}
        rows.append(
            {
                "step_ms": step,
                "ratio": step[other] / step[BASE],
                "predicted": r[other]["predicted"] / r[BASE]["predicted"],
                "peak_mib": peak,
                "peak_ratio": peak[other] / peak[BASE],
            }
        )
    return {
        "rows": rows,
        "ratio": statistics.median(row["ratio"] for row in rows),
        "predicted": statistics.median(row["predicted"] for row in rows),
        "peak_ratio": statistics.median(row["peak_ratio"] for row in rows),
    }


def verdict(value: float, target: float, kind: str = "at most") -> str:
    met = value <= target
    return f"{value:.3f} ({'met' if met else 'missed'}: target {kind} {target:.2f})"


def render(raw: Result, meta: Result, s: Settings) -> str:
    c = s.chain
    measured = set(raw["rounds"][0]) if raw["rounds"] else set()
    parts = [
        "## Past 1F1B: the zero-bubble schedule and virtual stages",
        report.provenance(meta, BENCH.command),
        f"bench_pipeline's conv chain: Conv2D({c.width}, 3x3, same, relu) x {c.layers} "
        f"on {c.side} x {c.side} x {c.width} images, B={c.batch}, K={c.K}, M={s.M}, "
        "optimize=speed; one compute thread per rank, ranks bound to cores.",
    ]
    if ZERO_BUBBLE in measured and raw.get("split"):
        parts += zero_bubble_section(raw, s)
    if VIRTUAL in measured:
        parts += virtual_section(raw, s)
    return "\n\n".join(parts)


def zero_bubble_section(raw: Result, s: Settings) -> list[str]:
    c = s.chain
    split, paired = split_summary(raw["split"]), rounds_summary(raw["rounds"])
    split_rows = [
        ["fused (1F1B)", f"{split['F']:.2f}", f"{split['B_fused']:.2f}", "-", "-"],
        [
            "split (zero-bubble)",
            f"{split['F_split']:.2f}",
            f"{split['B'] + split['W']:.2f}",
            f"{split['B']:.2f}",
            f"{split['W']:.2f}",
        ],
    ]
    round_rows = [
        [
            str(i),
            f"{row['step_ms']['interleaved']:.1f}",
            f"{row['step_ms']['zero_bubble']:.1f}",
            f"{row['ratio']:.3f}",
            f"{row['predicted']:.3f}",
            f"{row['peak_mib']['interleaved']:.0f}",
            f"{row['peak_mib']['zero_bubble']:.0f}",
        ]
        for i, row in enumerate(paired["rows"])
    ]
    error = abs(paired["predicted"] - paired["ratio"]) / paired["ratio"]
    return [
        f"**The split backward.** The chain's second half as a stage whose input gradients "
        f"are wanted, a microbatch of {c.batch // s.M} samples, the median of "
        f"{s.split_steps} rounds (ms):",
        report.table(["backward", "forward", "backward", "B", "W"], split_rows),
        f"B + W against the fused backward: {verdict(split['ratio'], TARGET_SPLIT)}.",
        f"**Paired rounds.** One job of each schedule per round, the order rotating; "
        f"the step is the median of {c.steps} steps after {c.warmup} warm-up steps; "
        "*predicted*: the ratio of the steps each job's start-up plan line predicted; "
        "*peak MiB*: the most any rank's RSS rose above its resting RSS during the "
        "timed steps.",
        report.table(
            [
                "round",
                "interleaved ms",
                "zero_bubble ms",
                "zero_bubble / interleaved",
                "predicted",
                "interleaved peak MiB",
                "zero_bubble peak MiB",
            ],
            round_rows,
        ),
        f"zero_bubble's step over interleaved's, median of the rounds: "
        f"{verdict(paired['ratio'], TARGET_STEP)}; the simulator predicted "
        f"{paired['predicted']:.3f}, {error:.1%} off "
        f"({'met' if error <= TARGET_PREDICTION else 'missed'}: target within "
        f"{TARGET_PREDICTION:.0%}); peak step memory over interleaved's: "
        f"{verdict(paired['peak_ratio'], TARGET_MEMORY)}.",
    ]


def virtual_section(raw: Result, s: Settings) -> list[str]:
    """The virtual stages against 1F1B in the same rounds: no target, the measured ratio
    and how far the plan's prediction (extra transfers and actions charged) was from it."""
    c, v = s.chain, int(VIRTUAL.split("/")[1])
    paired = rounds_summary(raw["rounds"], VIRTUAL)
    rows = [
        [
            str(i),
            f"{row['step_ms'][BASE]:.1f}",
            f"{row['step_ms'][VIRTUAL]:.1f}",
            f"{row['ratio']:.3f}",
            f"{row['predicted']:.3f}",
            f"{row['peak_mib'][BASE]:.0f}",
            f"{row['peak_mib'][VIRTUAL]:.0f}",
        ]
        for i, row in enumerate(paired["rows"])
    ]
    error = abs(paired["predicted"] - paired["ratio"]) / paired["ratio"]
    chunks = raw["rounds"][0][VIRTUAL].get("bounds")
    return [
        f"**Virtual stages.** `interleaved` with `virtual_stages={v}` (Megatron-LM's "
        f"interleaved 1F1B: the chain cut into {c.K * v} chunks, stage s running chunks s "
        f"and s + {c.K}"
        + (f", bounds {chunks}" if chunks else "")
        + ") in the same rounds, against `interleaved` (one chunk a stage): a bubble of "
        f"(K - 1) / (v M + K - 1) instead of (K - 1) / (M + K - 1), for {c.K * v - 1} "
        f"transfers each way instead of {c.K - 1} and {v} times the actions.",
        report.table(
            [
                "round",
                "interleaved ms",
                f"v={v} ms",
                f"v={v} / interleaved",
                "predicted",
                "interleaved peak MiB",
                f"v={v} peak MiB",
            ],
            rows,
        ),
        f"interleaved on {v} virtual stages over interleaved, median of the rounds: "
        f"{paired['ratio']:.3f}; the simulator predicted {paired['predicted']:.3f}, "
        f"{error:.1%} off; peak step memory over interleaved's: {paired['peak_ratio']:.3f}.",
    ]


BENCH = Benchmark(
    name="schedules",
    question=__doc__.splitlines()[0],
    full=Settings(),
    quick=QUICK,
    measure=measure,
    render=render,
)


def main(argv: list[str] | None = None) -> None:
    """Reads ``--schedules`` (this benchmark's own option); the rest is the shared command
    line's."""
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument(
        "--schedules",
        help=f"comma-separated, among {','.join(SCHEDULES)}, with {BASE} (default: all)",
    )
    known, rest = own.parse_known_args(argv)
    base = QUICK if "--quick" in rest else Settings()
    if known.schedules is None:
        run(BENCH, argv, base, own=own)
        return
    chosen = tuple(known.schedules.split(","))
    if BASE not in chosen or not set(chosen) <= set(SCHEDULES) or len(set(chosen)) < 2:
        own.error(
            f"--schedules takes {BASE} and one or more of {list(SCHEDULES[1:])}. "
            f"Received: --schedules {known.schedules}"
        )
    if "--no-docs" not in rest and set(chosen) != set(SCHEDULES):
        own.error("--schedules with a subset needs --no-docs (the docs keep all three)")
    run(BENCH, argv, dataclasses.replace(base, schedules=chosen), own=own)


if __name__ == "__main__":
    main()
