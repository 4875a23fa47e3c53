"""What does mixed_bfloat16 change on a 2-stage transformer pipeline, measured and predicted?

examples/decoder_lm.py's decoder (tied embedding, ``layers`` blocks of width ``width`` on
``side`` tokens), B=64, K=2, M=8, optimize="speed", float32 and mixed_bfloat16 in paired
rounds (one job of each per round, the order alternating). Per job: the median step,
the step its plan line predicted, the bytes each stage sends a step (activations forward,
their gradients backward), and each stage's peak RSS above its resting RSS during the
timed steps beside the plan's peak memory of the stage.

usage: .venv/bin/python scripts/bench_precision.py [--quick] [--no-docs] [--json F] [--render F]
"""

from __future__ import annotations

import dataclasses
import json
import statistics

from bench_pipeline import WORKER

from bench import harness, report
from bench.harness import Result, say
from bench.main import Benchmark, run

PRECISIONS = ("float32", "mixed_bfloat16")


@dataclasses.dataclass(frozen=True)
class Settings:
    layers: int = 4
    width: int = 128
    side: int = 64  # tokens a sample
    batch: int = 64
    K: int = 2
    M: int = 8
    rounds: int = 3
    warmup: int = 3
    steps: int = 10
    profile_repeats: int = 5

    def worker_config(self, precision: str) -> Result:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in fields.items() if k not in ("rounds", "M")} | {
            "model": "transformer",
            "microbatches": [self.M],
            "M": self.M,
            "pipeline": "interleaved",
            "optimize": "speed",
            "precision": precision,
            "collect": True,
        }


QUICK = Settings(layers=2, width=32, side=16, warmup=1, steps=2, rounds=1, profile_repeats=1)


def measure(s: Settings) -> Result:
    rounds: list[dict[str, Result]] = []
    for r, precision in harness.rotations(PRECISIONS, s.rounds):
        if len(rounds) == r:
            rounds.append({})
        say(f"round {r}: K={s.K}, M={s.M}, {precision}")
        config = s.worker_config(precision)
        ranks = harness.run_job(WORKER, ["pipeline", json.dumps(config)], s.K, timeout=900)
        rounds[r][precision] = {
            "times": ranks[0]["times"],
            "predicted": ranks[0]["startup_predicted_s"],
            "predicted_peak": ranks[0]["predicted_peak_bytes"],
            "sent": [k["sent_bytes"] for k in ranks],
            "peak_mib": [k["maxrss_timed_mib"] - k["rss_reset_mib"] for k in ranks],
        }
    return {"rounds": rounds}


def summary(rounds: list[dict[str, Result]]) -> dict[str, Result]:
    """Per precision: the medians over the rounds; and bf16 / fp32 paired per round."""
    out: dict[str, Result] = {}
    for p in PRECISIONS:
        runs = [r[p] for r in rounds]
        K = len(runs[0]["sent"])
        out[p] = {
            "step_ms": statistics.median(1e3 * statistics.median(x["times"]) for x in runs),
            "predicted_ms": statistics.median(1e3 * x["predicted"] for x in runs),
            "sent": [statistics.median(x["sent"][s] for x in runs) for s in range(K)],
            "peak_mib": [statistics.median(x["peak_mib"][s] for x in runs) for s in range(K)],
            "predicted_mib": [
                statistics.median(x["predicted_peak"][s] / 2**20 for x in runs) for s in range(K)
            ],
        }
    ratio = [
        statistics.median(r["mixed_bfloat16"]["times"]) / statistics.median(r["float32"]["times"])
        for r in rounds
    ]
    out["paired"] = {"ratio": statistics.median(ratio), "rounds": ratio}
    return out


def render(raw: Result, meta: Result, s: Settings) -> str:
    got = summary(raw["rounds"])
    K = s.K
    rows = [
        [
            p,
            f"{got[p]['step_ms']:.1f}",
            f"{got[p]['predicted_ms']:.1f}",
            " / ".join(f"{b / 2**20:.2f}" for b in got[p]["sent"]),
            " / ".join(str(round(m)) for m in got[p]["peak_mib"]),  # no "-0" for a fall
            " / ".join(f"{m:.1f}" for m in got[p]["predicted_mib"]),
        ]
        for p in PRECISIONS
    ]
    paired = got["paired"]
    rows.append(
        [
            "bf16 / fp32 (paired)",
            f"{paired['ratio']:.3f} ({', '.join(f'{x:.3f}' for x in paired['rounds'])})",
            f"{got['mixed_bfloat16']['predicted_ms'] / got['float32']['predicted_ms']:.3f}",
            " / ".join(
                f"{b / f:.2f}" if f else "-"
                for b, f in zip(got["mixed_bfloat16"]["sent"], got["float32"]["sent"], strict=True)
            ),
            "",
            "",
        ]
    )
    stages = " / ".join(f"stage {i}" for i in range(K))
    return "\n\n".join(
        [
            report.provenance(meta, BENCH.command),
            f"### Decoder ({s.layers} blocks of {s.width} on {s.side} tokens), B={s.batch}, "
            f"K={K}, M={s.M}",
            report.table(
                [
                    "precision",
                    "step ms",
                    "predicted ms",
                    f"MiB sent a step ({stages})",
                    f"peak MiB ({stages})",
                    f"predicted peak MiB ({stages})",
                ],
                rows,
            ),
        ]
    )


BENCH = Benchmark(
    name="precision",
    question=__doc__.splitlines()[0],
    full=Settings(),
    quick=QUICK,
    measure=measure,
    render=render,
)


if __name__ == "__main__":
    run(BENCH)
