"""scripts/bench_small.py's reading of its measurements: cost per action, ratios, spread."""

from __future__ import annotations

from types import ModuleType

import pytest
import scripts_module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return scripts_module.load("bench_small")


def measured(times: list[float]) -> dict[str, object]:
    return {
        "keras": [0.002, 0.002, 0.002],
        "tfsift_m1": [0.003] * 3,
        "tfsift_m1_eager_update": [0.0045] * 3,
        "keras_fit": [0.08] * 3,  # an epoch of 20 batches: 4 ms a step
        "tfsift_fit": [0.07] * 3,
        "tfsift_m": [0.0042] * 3,  # M=4: 1.2 ms more over 2 (M - 1) = 6 extra actions
        "keras_again": [0.0021] * 3,
        "keras_m": [0.0027] * 3,  # TensorFlow alone: 0.6 ms more over the same 6 actions
        "keras_m_fused": [0.0030] * 3,  # in one call: 0.9 ms more, so 150 us an action
        "predictions": [
            {"M": 4, "pipeline": "simple", "predicted_step_s": 0.008, "action_overhead_s": 1.5e-4}
        ],
        "pipelines": {"simple": times},
    }


META = {"date": "2026-11-26", "cores": 2, "commit": "abc", "load_start": 0.1,
        "load_end": 0.2, "seconds": 60.0}  # fmt: skip


def costs(text: str) -> dict[str, str]:
    """The cost-per-action table, by row's start."""
    table = text.split("### Cost per action")[1]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ")]
    return {row[0][2:]: row[1].rstrip(" |") for row in rows[1:]}


def test_the_section_reads_the_cost_per_action_the_ratio_and_the_tail(bench: ModuleType) -> None:
    times = [0.010] * 98 + [0.030, 0.050]  # a 10 ms median with two slow steps
    text = bench.render(measured(times), META, bench.Settings())
    # M=4's job ran its Keras step 1.05x as long: (4.2 / 1.05 - 3.0) ms / 6
    assert costs(text) == {
        "@tfsift.step, M=4 in one compiled call (target <= 150; its job's Keras step 1.05x "
        "the first's, scaled back)": "167",
        "a hand-written TensorFlow loop, one tf.function call a microbatch": "100",
        "the same microbatches in one hand-written tf.function": "150",
        "tfsift's own: the first row less the third": "17",
        "a pipeline stage's action and its message (the one-process profile)": "150",
    }
    faster = bench.render(measured(times) | {"keras_m_fused": [0.0033] * 3}, META, bench.Settings())
    assert costs(faster)["tfsift's own: the first row less the third"] == "-33"
    fused = "| one process, the same M=4 microbatches in one hand-written tf.function | 3.00 |"
    assert fused in text
    assert (
        "| one process, a hand-written TensorFlow loop, M=4 (and its Keras step) | 2.70 (2.10) |"
        in text
    )
    # a run before the step call was timed alone: the whole step stands for it; p99 1.xx
    # the median; one process's Keras step (2 ms) 0.2x as fast
    p99 = float(__import__("numpy").percentile(times, 99))
    assert (
        f"| K=2, M=4, simple | 10.00 | 10.00 | 8.00 | 1.25 | 1.25 | 10.00 | {1e3 * p99:.2f} "
        f"({p99 / 0.010:.2f}x) | 50.00 | 0.20 |" in text
    )
    assert text.startswith("Measured 2026-11-26 on 2 cores at commit abc")
    assert scripts_module.prose(text) == []


def test_the_ratio_is_to_the_step_the_start_up_plan_line_predicted(bench: ModuleType) -> None:
    raw = measured([0.010] * 100) | {"startup_predicted": {"simple": 0.009}}
    text = bench.render(raw, META, bench.Settings())
    assert "| K=2, M=4, simple | 10.00 | 10.00 | 9.00 | 1.11 | 1.11 |" in text  # not 8 ms


def test_the_ratio_is_the_step_calls_alone_and_the_whole_steps_is_given_beside_it(
    bench: ModuleType,
) -> None:
    raw = measured([0.010] * 100) | {
        "startup_predicted": {"simple": 0.008},
        "pipeline_calls": {"simple": [0.009] * 100},  # the update took 1 ms of the 10
    }
    text = bench.render(raw, META, bench.Settings())
    assert "| K=2, M=4, simple | 10.00 | 9.00 | 8.00 | 1.12 | 1.25 |" in text


def test_the_recomputing_runs_get_rows_of_their_own_against_their_own_prediction(
    bench: ModuleType,
) -> None:
    raw = measured([0.010] * 100)
    raw["pipelines"]["simple, optimize=memory"] = [0.008] * 100
    raw["startup_predicted"] = {"simple": 0.009, "simple, optimize=memory": 0.0064}
    text = bench.render(raw, META, bench.Settings())
    assert "| K=2, M=4, simple | 10.00 | 10.00 | 9.00 | 1.11 |" in text
    assert "| K=2, M=4, simple, optimize=memory | 8.00 | 8.00 | 6.40 | 1.25 |" in text
    assert bench.Settings().optimizes == ("speed", "memory")


def test_the_update_and_fit_rows_are_per_step(bench: ModuleType) -> None:
    text = bench.render(measured([0.010] * 100), META, bench.Settings())
    assert "| one process, @tfsift.step M=1, the update eager (`apply_gradients`) | 4.50 |" in text
    assert "| one process, Keras `fit` (an epoch of 20 batches / 20) | 4.00 |" in text
    assert "| one process, tfsift `fit` (partitions=1, the same) | 3.50 |" in text
