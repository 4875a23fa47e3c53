"""What does mixed_bfloat16 change on a 2-stage transformer pipeline, measured and predicted?

examples/decoder_lm.py's decoder (tied embedding), K=2, M=8, optimize="speed", float32 and
mixed_bfloat16 in paired rounds (one job of each a round, the order alternating). Per job:
the median step, the step its plan line predicted, the bytes each stage sends a step, and
each stage's peak RSS above its resting RSS during the timed steps beside the plan's peak.
"""

from __future__ import annotations

import dataclasses
from statistics import median

from bench_pipeline import Settings as ChainSettings
from bench_pipeline import run_job

from bench import harness, report
from bench.harness import Result
from bench.main import Benchmark, run

PRECISIONS = ("float32", "mixed_bfloat16")


@dataclasses.dataclass(frozen=True)
class Settings:
    chain: ChainSettings = dataclasses.field(
        default_factory=lambda: ChainSettings("transformer", 4, 128, 64, 64, profile_repeats=5)
    )  # model, layers, width, side (tokens), batch
    M: int = 8
    rounds: int = 3

    def worker_config(self, precision: str) -> Result:
        return self.chain.worker_config(microbatches=[self.M], M=self.M, pipeline="interleaved",
                                        optimize="speed", precision=precision)  # fmt: skip


QUICK = Settings(ChainSettings(model="transformer", layers=2, width=32, side=16, batch=64,
                               warmup=1, steps=2, profile_repeats=1), rounds=1)  # fmt: skip


def measure(s: Settings) -> Result:
    def job(precision: str) -> Result:
        ranks = run_job(s.chain.K, "pipeline", s.worker_config(precision))
        return {
            "times": ranks[0]["times"],
            "predicted": ranks[0]["startup_predicted_s"],
            "predicted_peak": ranks[0]["predicted_peak_bytes"],
            "sent": [k["sent_bytes"] for k in ranks],
            "peak_mib": [k["maxrss_timed_mib"] - k["rss_reset_mib"] for k in ranks],
        }

    return {"rounds": harness.rounds(PRECISIONS, s.rounds, job)}


def summary(rounds: list[dict[str, Result]]) -> dict[str, Result]:
    """Per precision: the medians over the rounds; and bf16 / fp32 paired per round."""
    out: dict[str, Result] = {}
    for p, runs in harness.by_name(rounds).items():
        stages = range(len(runs[0]["sent"]))
        out[p] = {
            "step_ms": median(1e3 * median(x["times"]) for x in runs),
            "predicted_ms": median(1e3 * x["predicted"] for x in runs),
            "sent": [median(x["sent"][s] for x in runs) for s in stages],
            "peak_mib": [median(x["peak_mib"][s] for x in runs) for s in stages],
            "predicted_mib": [median(x["predicted_peak"][s] / 2**20 for x in runs) for s in stages],
        }
    ratio = [median(r["mixed_bfloat16"]["times"]) / median(r["float32"]["times"]) for r in rounds]
    return out | {"paired": {"ratio": median(ratio), "rounds": ratio}}


def render(raw: Result, meta: Result, s: Settings) -> str:
    got = summary(raw["rounds"])
    bf16, fp32 = got["mixed_bfloat16"], got["float32"]
    rows = [
        [p, f"{got[p]['step_ms']:.1f}", f"{got[p]['predicted_ms']:.1f}",
         report.listed((b / 2**20 for b in got[p]["sent"]), ".2f", " / "),
         " / ".join(str(round(m)) for m in got[p]["peak_mib"]),  # no "-0" for a fall
         report.listed(got[p]["predicted_mib"], ".1f", " / ")]
        for p in PRECISIONS
    ]  # fmt: skip
    sent = [f"{b / f:.2f}" if f else "-" for b, f in zip(bf16["sent"], fp32["sent"], strict=True)]
    ratio = f"{got['paired']['ratio']:.3f} ({report.listed(got['paired']['rounds'])})"
    predicted = f"{bf16['predicted_ms'] / fp32['predicted_ms']:.3f}"
    rows.append(["bf16 / fp32 (paired)", ratio, predicted, " / ".join(sent), "", ""])
    c = s.chain
    stages = " / ".join(f"stage {i}" for i in range(c.K))
    header = ["precision", "step ms", "predicted ms", f"MiB sent a step ({stages})",
              f"peak MiB ({stages})", f"predicted peak MiB ({stages})"]  # fmt: skip
    return BENCH.section(
        meta,
        f"### Decoder ({c.layers} blocks of {c.width} on {c.side} tokens), B={c.batch}, "
        f"K={c.K}, M={s.M}",
        report.table(header, rows),
    )


BENCH = Benchmark("precision", __doc__.splitlines()[0], Settings(), QUICK, measure, render)

if __name__ == "__main__":
    run(BENCH)
