"""scripts/bench_schedules.py's reading of its measurements: the split's cost, the paired
rounds' ratios against the prediction, and the peak memory."""

from __future__ import annotations

from types import ModuleType

import pytest
import scripts_module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return scripts_module.load("bench_schedules")


META = {"date": "2026-12-06", "cores": 2, "commit": "abc", "load_start": 0.1,
        "load_end": 0.2, "seconds": 600.0}  # fmt: skip


def job(step_s: float, predicted_s: float, peaks: list[float]) -> dict[str, object]:
    return {
        "times": [step_s] * 3,
        "predicted": predicted_s,
        "step_mib": peaks,
        "action_s": [{}, {}],
    }


def raw() -> dict[str, object]:
    return {
        "split": {
            "F": [0.010] * 3,
            "B_fused": [0.020] * 3,
            "F_split": [0.0105] * 3,
            "B": [0.0105] * 3,
            "W": [0.0105] * 3,  # B + W: 21 ms against 20
        },
        "rounds": [
            {
                "interleaved": job(0.100, 0.090, [40.0, 20.0]),
                "zero_bubble": job(0.092, 0.0828, [42.0, 30.0]),  # 0.92, predicted 0.92
            },
            {
                "interleaved": job(0.102, 0.090, [40.0, 20.0]),
                "zero_bubble": job(0.096, 0.0846, [44.0, 30.0]),  # 0.941, predicted 0.94
            },
            {
                "interleaved": job(0.100, 0.090, [40.0, 20.0]),
                "zero_bubble": job(0.097, 0.0837, [40.0, 30.0]),  # 0.97, predicted 0.93
            },
        ],
    }


def test_the_split_costs_b_plus_w_over_the_fused_backward(bench: ModuleType) -> None:
    text = bench.render(raw(), META, bench.Settings())
    assert "| fused (1F1B) | 10.00 | 20.00 | - | - |" in text
    assert "| split (zero-bubble) | 10.50 | 21.00 | 10.50 | 10.50 |" in text
    assert "B + W against the fused backward: 1.050 (met: target at most 1.10)." in text


def test_the_rounds_pair_the_schedules_and_take_the_median_ratio(bench: ModuleType) -> None:
    text = bench.render(raw(), META, bench.Settings())
    assert "| 0 | 100.0 | 92.0 | 0.920 | 0.920 | 40 | 42 |" in text
    assert "| 2 | 100.0 | 97.0 | 0.970 | 0.930 | 40 | 40 |" in text
    # ratios 0.92, 0.941, 0.97: the median is round 1's; predicted 0.92, 0.94, 0.93
    assert "median of the rounds: 0.941 (met: target at most 0.95)" in text
    assert "the simulator predicted 0.930, 1.2% off (met: target within 3%)" in text
    # the largest rank's peak: 42/40, 44/40, 40/40
    assert "peak step memory over interleaved's: 1.050 (met: target at most 1.10)." in text


def test_a_missed_target_says_so(bench: ModuleType) -> None:
    slow = raw()
    for r in slow["rounds"]:  # type: ignore[attr-defined]
        r["zero_bubble"]["times"] = [0.099] * 3
    text = bench.render(slow, META, bench.Settings())
    assert "median of the rounds: 0.990 (missed: target at most 0.95)" in text
    assert "6.1% off (missed: target within 3%)" in text
