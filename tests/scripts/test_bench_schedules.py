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
    """A job's figures: its tensors' peaks are ``peaks``, and its plan predicted its
    largest rank's peak plus 10 MiB."""
    return {
        "times": [step_s] * 3,
        "predicted": predicted_s,
        "tensor_mib": peaks,
        "predicted_peak_mib": max(peaks) + 10.0,
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
    assert "| B + W / fused backward | 1.050 | - | <= 1.10: met |" in text


def test_the_rounds_pair_the_schedules_and_take_the_median_ratio(bench: ModuleType) -> None:
    text = bench.render(raw(), META, bench.Settings())
    assert "| 0 | 100.0 | 92.0 | 0.920 | 0.920 | 40.0 / 42.0 |" in text
    assert "| 2 | 100.0 | 97.0 | 0.970 | 0.930 | 40.0 / 40.0 |" in text
    # ratios 0.92, 0.941, 0.97: the median is round 1's; predicted 0.92, 0.94, 0.93
    assert "| zero_bubble step | 0.941 | 0.930 | <= 0.95: met |" in text
    assert "| zero_bubble prediction's error | 1.2% | - | <= 3%: met |" in text
    # the largest rank's peak: 42/40, 44/40, 40/40; predicted 52/50, 54/50, 50/50
    assert "| zero_bubble peak tensors | 1.050 | 1.040 | <= 1.10: met |" in text


def test_a_missed_target_says_so(bench: ModuleType) -> None:
    slow = raw()
    for r in slow["rounds"]:  # type: ignore[attr-defined]
        r["zero_bubble"]["times"] = [0.099] * 3
    text = bench.render(slow, META, bench.Settings())
    assert "| zero_bubble step | 0.990 | 0.930 | <= 0.95: missed |" in text
    assert "| zero_bubble prediction's error | 6.1% | - | <= 3%: missed |" in text


def with_virtual(base: dict[str, object]) -> dict[str, object]:
    """raw() with interleaved on 2 virtual stages in every round."""
    steps = [(0.094, 0.0855, [44.0, 26.0]), (0.097, 0.0846, [46.0, 26.0]),
             (0.090, 0.0864, [44.0, 26.0])]  # fmt: skip
    for r, (step, predicted, peaks) in zip(base["rounds"], steps, strict=True):  # type: ignore[call-overload]
        r["interleaved/2"] = job(step, predicted, peaks) | {"bounds": [0, 2, 4, 6, 8]}
    return base


def test_virtual_stages_are_paired_with_interleaved_in_the_same_rounds(
    bench: ModuleType,
) -> None:
    text = bench.render(with_virtual(raw()), META, bench.Settings())
    assert "| zero_bubble step | 0.941 | 0.930 | <= 0.95: met |" in text
    # ratios 0.94, 0.951, 0.90: the median is round 0's; predicted 0.95, 0.94, 0.96
    assert (
        "| 0 | 100.0 | 92.0 | 94.0 | 0.920 | 0.920 | 0.940 | 0.950 | 40.0 / 42.0 / 44.0 |"
    ) in text
    assert (
        "| 1 | 102.0 | 96.0 | 97.0 | 0.941 | 0.940 | 0.951 | 0.940 | 40.0 / 44.0 / 46.0 |"
    ) in text
    assert "| interleaved/2 step | 0.940 | 0.950 | - |" in text
    assert "| interleaved/2 peak tensors | 1.100 | 1.080 | - |" in text


def test_a_saved_run_of_interleaved_and_virtual_stages_alone_renders_their_section_only(
    bench: ModuleType,
) -> None:
    alone = with_virtual(raw())
    alone["split"] = None
    for r in alone["rounds"]:  # type: ignore[attr-defined]
        del r["zero_bubble"]
    text = bench.render(alone, META, bench.Settings())
    assert "| interleaved/2 step | 0.940 | 0.950 | - |" in text
    assert "zero_bubble" not in text and "Backward of the second half" not in text


def test_schedules_name_the_pipeline_and_its_virtual_stages(bench: ModuleType) -> None:
    assert bench.schedule_config("interleaved/2") == {"pipeline": "interleaved",
                                                      "virtual_stages": 2}  # fmt: skip
    assert bench.schedule_config("zero_bubble") == {"pipeline": "zero_bubble"}
    assert bench.schedule_config("zero_bubble@1GB") == {"pipeline": "zero_bubble",
                                                        "memory_cap": "1GB"}  # fmt: skip


def test_both_zero_bubble_jobs_are_paired_and_name_the_ws_their_plans_defer(
    bench: ModuleType,
) -> None:
    both = raw()
    for r in both["rounds"]:  # type: ignore[attr-defined]
        r["zero_bubble"]["deferred"] = [0, 0]
        r["zero_bubble@1GB"] = job(0.090, 0.081, [48.0, 30.0]) | {"deferred": [0, 1]}
    text = bench.render(both, META, bench.Settings())
    assert "| zero_bubble step | 0.941 | 0.930 | <= 0.95: met |" in text
    assert "| zero_bubble@1GB step | 0.900 | 0.900 | <= 0.95: met |" in text
    assert "| zero_bubble@1GB peak tensors | 1.200 | 1.160 | <= 1.10: missed |" in text
    assert (
        "W's deferred per stage (the plans'): zero_bubble: [0, 0]; zero_bubble@1GB: [0, 1]" in text
    )
