"""The docs sections of scripts/bench_pipeline.py and bench_precision.py: their tables from
saved results, and nothing else but headings and the provenance line."""

from __future__ import annotations

from typing import Any

import scripts_module

META = {"date": "2026-12-06", "cores": 2, "commit": "abc1234", "load_start": 0.1,
        "load_end": 0.2, "seconds": 60.0}  # fmt: skip


def pipeline_row(M: int, pipeline: str, optimize: str, step: float) -> dict[str, Any]:
    return {
        "M": M, "pipeline": pipeline, "optimize": optimize, "step_ms": step,
        "reference_ms": 2000.0, "k1_ms": 1990.0, "speedup": 2000.0 / step,
        "ideal": 2 * M / (M + 1), "predicted": 1.7, "ratios": [0.93, 0.94, 0.92],
        "busy_ms": [980.0, 1100.0], "bounds": [0, 4, 8], "rss_timed_mib": [760.0, 716.0],
        "rss_whole_mib": [760.0, 716.0], "predicted_peak_mib": [73.0, 17.0],
    }  # fmt: skip


def test_pipeline_renders_targets_and_tables() -> None:
    bench = scripts_module.load("bench_pipeline")
    rows = [
        pipeline_row(8, "interleaved", "speed", 1208.0),
        pipeline_row(8, "simple", "speed", 1340.0),
    ]
    compare = rows[0] | {"batch": 256, "M": 8}
    s = {
        "rows": rows, "compare": {"dense": compare}, "keras_ms": 2003.9, "tfsift_ms": 2010.0,
        "overhead": 2010.0 / 2003.9 - 1, "grad_mib": 4.5, "dp_ms": 1029.7, "allreduce_ms": 25.0,
        "allreduce_gbps": 0.19, "alone_ms": 999.7, "helper_cpu": 0.03, "alone_helper_cpu": 0.0,
    }  # fmt: skip
    text = bench.markdown(s, bench.Settings(), META)
    assert scripts_module.prose(text) == []
    # interleaved: 2000 / 1208 = 1.656x of 16 / 9 ideal (93.1%) meets 90%; simple: 2000 / 1340
    # (84.0%) misses it
    assert (
        "| speed-up >= 90% of ideal for M >= 8; step overhead <= 5% | interleaved M=8: 93.1% "
        "(92.0% to 94.0% in 3 jobs) of ideal; step overhead +0.3% | simple M=8: 84.0% (92.0% "
        "to 94.0% in 3 jobs) of ideal |" in text
    )
    assert "| interleaved | 8 | speed | (0, 4, 8) | 1208.0 | 1.66 | 760 / 716 |" in text


def precision_run(step: float, sent: int, peak: float) -> dict[str, Any]:
    return {"times": [step, step + 0.01], "predicted": step * 0.9, "predicted_peak": [2**20, 2**21],
            "sent": [sent, sent], "peak_mib": [peak, peak / 2]}  # fmt: skip


def test_precision_renders_one_row_a_precision_and_their_paired_ratio() -> None:
    bench = scripts_module.load("bench_precision")
    fp32, bf16 = (0.10, 0.12), (0.08, 0.09)
    rounds = [
        {"float32": precision_run(a, 2**21, 40.0), "mixed_bfloat16": precision_run(b, 2**20, 30.0)}
        for a, b in zip(fp32, bf16, strict=True)
    ]
    text = bench.render({"rounds": rounds}, META, bench.Settings())
    assert scripts_module.prose(text) == []
    assert "| float32 | 115.0 | 99.0 | 2.00 / 2.00 | 40 / 20 | 1.0 / 2.0 |" in text
    assert "| mixed_bfloat16 | 90.0 | 76.5 | 1.00 / 1.00 | 30 / 15 | 1.0 / 2.0 |" in text
    # each round's bf16 step over its fp32 step (medians of two steps), then their median
    assert "| bf16 / fp32 (paired) | 0.785 (0.810, 0.760) | 0.773 | 0.50 / 0.50 |" in text
