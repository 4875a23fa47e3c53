"""The pure parts of scripts/bench_sifting.py: targets, time to target, medians, tables."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest
import scripts_module

SCRIPTS = scripts_module.SCRIPTS


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return scripts_module.load("bench_sifting")


def curve(*points: tuple[float, float]) -> list[list[float]]:
    """[seconds, steps, samples, metric] points, 10 steps per second, B=64."""
    return [[t, 10 * t, 640 * t, m] for t, m in points]


def job(methods: list[str], curves: dict[str, list[list[float]]], loss: str = "ce") -> Any:
    sift = {"kept_fraction": 0.5, "time_scoring": 1.0}
    results = [
        {"method": m, "curve": curves[m], "sift": {} if m == "none" else sift} for m in methods
    ]
    return {
        "job": {
            "task": {"name": "toy", "loss": loss},
            "partitions": 1,
            "methods": [
                {"name": m, "policy": m, "beta": 1.0, "keep": 0.5, "scorer": "full"}
                for m in methods
            ],
        },
        "ranks": [{"results": results}],
    }


def test_target_is_half_a_point_below_accuracy_and_two_percent_above_mse(bench: ModuleType) -> None:
    assert bench.target(0.9, regression=False) == pytest.approx(0.895)
    assert bench.target(0.5, regression=True) == pytest.approx(0.51)


def test_first_reach_is_the_first_evaluation_at_or_past_the_target(bench: ModuleType) -> None:
    c = curve((0, 0.1), (1, 0.8), (2, 0.91), (3, 0.89), (4, 0.95))
    assert bench.first_reach(c, 0.9, regression=False)[0] == 2
    assert bench.first_reach(c, 0.99, regression=False) is None
    mse = curve((0, 2.0), (1, 0.6), (2, 0.5))
    assert bench.first_reach(mse, 0.55, regression=True)[0] == 2


def test_metric_at_is_the_last_evaluation_not_after_the_second(bench: ModuleType) -> None:
    c = curve((0, 0.1), (1.5, 0.8), (3, 0.9))
    assert bench.metric_at(c, 2.9) == 0.8
    assert bench.metric_at(c, 3.0) == 0.9


def test_speedup_is_baseline_time_over_method_time_per_seed(bench: ModuleType) -> None:
    curves = {
        "none": curve((0, 0.1), (2, 0.7), (4, 0.90), (8, 0.92)),  # target 0.915, hit at 8
        "fast": curve((0, 0.1), (2, 0.92), (10, 0.93)),  # hit at 2: 4x
        "slow": curve((0, 0.1), (9, 0.5)),  # never
    }
    rows = {r["method"]: r for r in bench.method_rows([job(["none", "fast", "slow"], curves)])}
    assert rows["fast"]["speedup"] == pytest.approx(4.0)
    assert rows["fast"]["steps_ratio"] == pytest.approx(0.25)
    assert rows["fast"]["at_base_end"] == 0.92  # the metric at the baseline's last second
    assert rows["fast"]["margin"] == pytest.approx(0.005)
    assert rows["slow"]["speedup"] == 0.0
    assert math.isinf(rows["slow"]["seconds"])


def test_no_siftings_time_is_the_mean_of_its_two_runs_and_the_repeat_is_compared_to_the_first(
    bench: ModuleType,
) -> None:
    curves = {
        "none": curve((0, 0.1), (4, 0.90), (8, 0.92)),  # target 0.915, hit at 8
        "fast": curve((0, 0.1), (2, 0.92), (10, 0.93)),  # hit at 2
        "none-again": curve((0, 0.1), (4, 0.92), (8, 0.92)),  # hit at 4: a faster machine
    }
    rows = {r["method"]: r for r in bench.method_rows([job(list(curves), curves)])}
    assert rows["fast"]["speedup"] == pytest.approx(6.0 / 2.0)
    assert rows["fast"]["steps_ratio"] == pytest.approx(20 / 60)
    assert rows["none-again"]["speedup"] == pytest.approx(8.0 / 4.0)
    summary = {"toy": list(rows.values())}
    assert bench.verdict(summary)["passing"] == {"toy": ["fast"]}  # the repeat is no method
    assert [r["method"] for r in bench.sifting_rows(summary)] == ["fast"]


def test_medians_are_over_seeds(bench: ModuleType) -> None:
    seeds = [
        job(["none", "m"], {"none": curve((0, 0), (10, 0.9)), "m": curve((0, 0), (t, 0.9))})
        for t in (5.0, 10.0, 20.0)
    ]
    row = bench.method_rows(seeds)[1]
    assert row["speedups"] == pytest.approx([2.0, 1.0, 0.5])
    assert row["speedup"] == pytest.approx(1.0)
    assert row["seconds"] == pytest.approx(10.0)


def test_a_method_without_results_is_reported_with_its_status(bench: ModuleType) -> None:
    entry = job(["none"], {"none": curve((0, 0), (1, 0.9))})
    entry["job"]["methods"].append({"name": "exit", "policy": "relative", "scorer": "early_exit"})
    entry["ranks"][0]["results"].append({"method": "exit", "status": "n/a (not implemented)"})
    rows = bench.method_rows([entry])
    assert rows[1] == {
        "method": "exit",
        "status": "n/a (not implemented)",
        "definition": entry["job"]["methods"][1],
        "regression": False,
    }
    table = bench.results_table({"toy": rows}, pipeline=False)
    assert "n/a (not implemented)" in table.splitlines()[-1]


def test_verdict_needs_two_tasks_with_a_fast_method_within_the_target(bench: ModuleType) -> None:
    def rows(speedup: float, margin: float) -> list[dict[str, Any]]:
        fast = {"method": "m", "seconds": 1.0, "speedup": speedup, "margin": margin}
        return [{"method": "none", "seconds": 1.0}, fast]

    assert bench.verdict({"a": rows(1.5, 0.0), "b": rows(1.3, 0.001)})["met"]
    assert not bench.verdict({"a": rows(1.5, 0.0), "b": rows(1.29, 0.01)})["met"]
    assert not bench.verdict({"a": rows(2.0, 0.0), "b": rows(2.0, -0.001)})["met"]
    assert not bench.verdict({"a": rows(2.0, 0.0), "a@K2": rows(2.0, 0.0)})["met"]


def test_results_table_has_one_row_per_method_and_marks_the_baseline_target(
    bench: ModuleType,
) -> None:
    curves = {"none": curve((0, 0.1), (4, 0.9)), "relative-1": curve((0, 0.1), (2, 0.9))}
    entry = job(["none", "relative-1"], curves)
    entry["job"]["methods"][0]["policy"] = "none"
    entry["job"]["methods"][1]["policy"] = "relative"
    summary = {"toy": bench.method_rows([entry])}
    lines = bench.results_table(summary, pipeline=False).splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| toy: no sifting | 1.00 | 4.0 (target 89.50%) | 1 |")
    assert "| toy: relative, beta=1 | 0.50 | 2.0 | **2.00** (2.00) |" in lines[3]


def test_jobs_run_every_task_then_the_pipeline_for_each_seed(bench: ModuleType) -> None:
    settings = bench.Settings(seeds=(0, 1))
    order = [(j["seed"], j["task"]["name"], j["partitions"]) for j in settings.jobs()]
    tasks = [t.name for t in settings.tasks]
    per_seed = [(name, 1) for name in tasks] + [(settings.pipeline_task, 2)]
    assert order == [(s, name, k) for s in (0, 1) for name, k in per_seed]
    pipeline = next(j for j in settings.jobs() if j["partitions"] == 2)
    assert pipeline["microbatches"] == 4
    names = [m["name"] for m in pipeline["methods"]]
    assert names == [
        "none",
        "relative-1",
        "relative-1-exit",
        "relative-1-exit-overlap",
        "relative-1-exit-overlap-keep",
        "relative-1-training",
        "infobatch",
        "none-again",
    ]
    assert bench.OVERLAP.setting() == "relative, beta=1, early exit, overlap"
    assert bench.INFOBATCH.setting() == (
        "infobatch, prune=0.5, anneal=0.125, training scores, rescale=unbiased, stale=epochs"
    )


def test_methods_choose_the_methods_of_every_job_between_the_two_no_sifting_runs(
    bench: ModuleType,
) -> None:
    args = bench.pipeline_options(argparse.ArgumentParser()).parse_args(
        ["--methods", "infobatch", "relative-1"]
    )
    args.quick = False
    settings = bench.method_settings(args)
    for job in settings.jobs():
        names = [m["name"] for m in job["methods"]]
        assert names == ["none", "relative-1", "infobatch", "none-again"]
    with pytest.raises(SystemExit):  # without --no-docs it would overwrite the full table
        bench.main(["--methods", "infobatch"])
    assert bench.OVERLAP_KEEP.setting() == "relative, beta=1, early exit, overlap, leftover kept"


def test_uniform_keeps_relative_1s_fraction_and_comes_after_it(bench: ModuleType) -> None:
    names = [m.name for m in bench.METHODS]
    uniform = bench.METHODS[names.index("uniform")]
    assert uniform.keep == "kept:relative-1"
    assert names.index("relative-1") < names.index("uniform")
    assert uniform.setting() == "uniform, keep = relative-1's kept fraction"


def test_median_curve_takes_the_median_metric_at_each_second(bench: ModuleType) -> None:
    curves = [curve((0, 0.0), (1, v), (2, v)) for v in (0.2, 0.5, 0.9)]
    grid, mid = bench.median_curve(curves, points=3)
    assert grid == [0.0, 1.0, 2.0]
    assert mid == [0.0, 0.5, 0.5]


def test_extra_seconds_per_step_split_into_scoring_selecting_and_the_rest(
    bench: ModuleType,
) -> None:
    result = {
        "curve": [[0, 0, 0, 0.1], [10.0, 1000, 64000, 0.9]],  # 10 ms per step
        "sift": {"time_scoring": 2.0, "time_selecting": 0.5, "time_accumulating": 0.5},
    }
    scoring, selecting, rest = bench.extra_per_step(result, base_step=0.006)
    assert (scoring, selecting) == pytest.approx((0.002, 0.001))
    assert rest == pytest.approx(0.001)


def test_the_cost_table_shows_each_runs_one_time_seconds_off_the_clock(bench: ModuleType) -> None:
    curves = {"none": curve((0, 0.1), (4, 0.9)), "m": curve((0, 0.1), (2, 0.9))}
    entry = job(["none", "m"], curves)
    entry["ranks"][0]["results"][1]["off_clock_s"] = [0.25, 0.5]
    line = bench.cost_table({"toy": bench.method_rows([entry])}).splitlines()[-1]
    assert line == "| toy: m | 20 | 0.50 | 100.0 (1.00) | 50.0 / 0.0 / -50.0 | 0.75 |  |"


def test_the_benchmark_imports_without_tensorflow() -> None:
    code = "import bench_sifting, sys; print('tensorflow' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], cwd=SCRIPTS, capture_output=True, text=True)
    assert (run.returncode, run.stdout.strip()) == (0, "False"), run.stderr


def test_the_epoch_budget_runs_every_method_for_the_tasks_epochs_on_both_layouts(
    bench: ModuleType,
) -> None:
    settings = bench.EPOCHS_FULL
    jobs = settings.jobs()
    tasks = [t.name for t in bench.TASKS]
    per_seed = [(name, 1) for name in tasks] + [(name, 2) for name in tasks]
    order = [(j["seed"], j["task"]["name"], j["partitions"]) for j in jobs]
    assert order == [(s, name, k) for s in (0, 1, 2) for name, k in per_seed]
    for j in jobs:
        assert j["fixed_epochs"] is True
        names = [m["name"] for m in j["methods"]]
        assert names == ["none", "infobatch", "none-tf.data", "none-order", "none-again"]
        # every run on from_arrays, but one no-sifting run on the tf.data input
        sources = [m["source"] for m in j["methods"]]
        assert sources == ["arrays", "arrays", "tf.data", "arrays", "arrays"]
        # one no-sifting run in another order of the data; the rest in the seed's
        assert [m["order"] for m in j["methods"]] == [0, 0, 0, 1000, 0]
    epochs = {t.name: t.epochs for t in settings.tasks}
    assert epochs == {t.name: 2 * t.epochs for t in bench.TASKS}
    # evaluated on a grid of optimizer steps (not seconds), half as dense
    grid = {j["task"]["name"]: j["task"]["eval_every"] for j in jobs}
    assert grid == {t.name: 2 * t.eval_every for t in bench.TASKS}
    assert all(isinstance(every, int) and every > 0 for every in grid.values())
    assert bench.FULL.job(bench.TASKS[0], 0, bench.METHODS, 1, 1)["fixed_epochs"] is False
    settings_of = [bench.Method(**m).setting() for m in jobs[0]["methods"]]
    assert settings_of[2:] == [
        "no sifting, tf.data input (shard, shuffle, batch)",
        "no sifting, another data order (the same initial weights), from_arrays",
        "no sifting, again after the others, from_arrays",
    ]


def test_the_epoch_rows_compare_each_runs_end_with_no_siftings(bench: ModuleType) -> None:
    curves = {
        "none": curve((1, 0.5), (5, 0.9), (10, 0.9)),  # target 0.895, reached at 5 s
        "infobatch": curve((1, 0.5), (4, 0.9), (7.7, 0.897)),
        "none-again": curve((1, 0.5), (6, 0.9), (12, 0.89)),
    }
    rows = bench.epoch_seed_rows(job(list(curves), curves)["ranks"], regression=False)
    # against the mean of no sifting's two runs: 11 s to the end, 5.5 s to the target
    assert rows["infobatch"]["saved"] == pytest.approx(0.3)
    assert rows["infobatch"]["speedup"] == pytest.approx(5.5 / 4)
    assert rows["infobatch"]["delta"] == pytest.approx(-0.003)
    assert rows["infobatch"]["end_samples"] == pytest.approx(640 * 7.7)
    assert rows["none-again"]["saved"] == pytest.approx(1 - 12 / 10)  # against the first run
    assert rows["none-again"]["delta"] == pytest.approx(-0.01)
    # the mean of the last 3 evaluations against no sifting's (0.5 + 0.9 + 0.9) / 3
    assert rows["infobatch"]["delta_last"] == pytest.approx((0.9 + 0.897 - 0.9 - 0.9) / 3)
    # the speed-up's two factors: no sifting's 50 steps to the target over infobatch's 40,
    # and its seconds per step (0.1) over no sifting's (11 s / 100 steps); again: 0.1 / 0.1
    assert rows["infobatch"]["steps_speedup"] == pytest.approx(50 / 40)
    assert rows["infobatch"]["step_cost"] == pytest.approx(0.1 / 0.11)
    assert (rows["none-again"]["steps_speedup"], rows["none-again"]["step_cost"]) == (
        pytest.approx(50 / 60),
        pytest.approx(1.0),
    )
    never = curves | {"infobatch": curve((1, 0.5), (7.7, 0.89))}
    assert (
        bench.epoch_seed_rows(job(list(never), never)["ranks"], False)["infobatch"]["steps_speedup"]
        == 0
    )  # never reached: "never" in the table, below every bar
    mse = {k: [[*p[:3], 1 - p[3]] for p in c] for k, c in curves.items()}  # 0.1 at the end
    rows = bench.epoch_seed_rows(job(list(mse), mse, "mse")["ranks"], regression=True)
    assert rows["infobatch"]["delta"] == pytest.approx(0.103 / 0.1 - 1)  # relative
    # the mean of the last 3 evaluations: 0.5, 0.1, 0.103 against 0.5, 0.1, 0.1
    assert rows["infobatch"]["delta_last"] == pytest.approx(0.703 / 0.7 - 1)


def test_the_epoch_bar_needs_three_fast_tasks_none_slow_and_every_final_within_the_slack(
    bench: ModuleType,
) -> None:
    def row(speedup: float, delta: float, regression: bool = False) -> dict[str, Any]:
        return {"method": "infobatch", "speedup": speedup, "delta": delta,
                "regression": regression}  # fmt: skip

    summary = {
        "a": [row(1.3, 0.0)], "b": [row(1.25, -0.005)], "c": [row(1.4, 0.001)],
        "d": [row(0.95, 0.0)], "e": [row(1.0, 0.02, regression=True)],
        "a@K2": [row(1.3, 0.0)], "b@K2": [row(0.94, 0.0)], "c@K2": [row(2.0, -0.006)],
    }  # fmt: skip
    one = bench.epoch_verdict(summary, pipeline=False)
    assert one == {"tasks": 5, "fast": ["a", "b", "c"], "slow": [], "lossy": [],
                   "lossy_last": [], "met": True}  # fmt: skip
    two = bench.epoch_verdict(summary, pipeline=True)
    assert (two["fast"], two["slow"], two["lossy"], two["met"]) == (["a", "c"], ["b"], ["c"], False)
    summary["e"] = [row(1.0, 0.021, regression=True)]  # MSE 2.1% worse
    assert bench.epoch_verdict(summary, pipeline=False)["lossy"] == ["e"]
    # the same bar on optimizer steps to the target reads its own key
    steps = {k: [r[0] | {"steps_speedup": 1.3}] for k, r in summary.items()}
    steps["e"][0]["steps_speedup"] = 0.9
    by_steps = bench.epoch_verdict(steps, pipeline=False, key="steps_speedup")
    assert (len(by_steps["fast"]), by_steps["slow"], by_steps["met"]) == (4, ["e"], False)
    # the end as the mean of the last evaluations: reported, not part of the bar
    summary["a"] = [row(1.3, 0.0) | {"delta_last": -0.006}]
    summary["e"] = [row(1.0, 0.0, regression=True) | {"delta_last": 0.03}]
    last = bench.epoch_verdict(summary, pipeline=False)
    assert (last["lossy"], last["lossy_last"], last["met"]) == ([], ["a", "e"], True)


def test_infobatch_trains_the_first_epoch_whole_and_a_share_k_of_each_pruning_one(
    bench: ModuleType,
) -> None:
    from tfsift.sift.infobatch import prunes

    for epochs in range(1, 21):
        for anneal in (0.0, 0.125, 0.25, 0.5, 1.0):
            assert [bench.prunes(e, epochs, anneal) for e in range(1, epochs + 2)] == [
                prunes(e, epochs, anneal) for e in range(1, epochs + 2)
            ]
    # 10 epochs annealed over the last eighth: epochs 2 to 9 prune
    assert bench.infobatch_epochs(1.0, 0.5, 10, 0.125) == 1.0
    assert bench.infobatch_epochs(1.5, 0.5, 10, 0.125) == pytest.approx(1.25)
    assert bench.infobatch_epochs(3.0, 0.5, 10, 0.125) == pytest.approx(2.0)
    assert bench.infobatch_epochs(10.0, 0.5, 10, 0.125) == pytest.approx(1 + 8 * 0.5 + 1)
    assert bench.infobatch_epochs(0.4, 0.5, 10, 0.125) == pytest.approx(0.4)


def test_the_pruning_model_predicts_the_steps_from_when_no_sifting_reaches_the_target(
    bench: ModuleType,
) -> None:
    # 100 steps an epoch; no sifting reaches the target after 300 (E = 3); InfoBatch took
    # 2 whole epochs and 8 pruning ones of 50 steps (k = 0.5): 3 epochs in 200 steps
    rows = {"none": {"steps": 300, "total_steps": 1000}, "infobatch": {"total_steps": 600}}
    assert bench.pruning_model(rows, 10, 0.125) == {
        "target_epoch": 3.0, "k": 0.5, "expected": pytest.approx(1.5)
    }  # fmt: skip
    assert bench.pruning_model(rows | {"none": {"steps": 0, "total_steps": 1000}}, 10, 0.125) is (
        None
    )  # no sifting never reached it
    assert bench.pruning_model(rows, 1, 0.125) is None  # no epoch prunes
    # through epoch_summary, from the runs' curves: 10 steps a second, 2 epochs of 50 steps
    curves = {
        "none": curve((3, 0.5), (6, 0.9), (10, 0.9)),  # 60 steps to the target: E = 1.2
        "infobatch": curve((3, 0.5), (5, 0.9), (8, 0.9)),  # 80 steps: k = 30 / 50
    }
    entry = job(list(curves), curves)
    entry["job"]["task"]["epochs"] = 2
    for method in entry["job"]["methods"]:
        method["anneal"] = 0.0
    row = bench.epoch_summary([entry])["toy"][1]
    assert row["model"] == {
        "target_epoch": [pytest.approx(1.2)], "k": [pytest.approx(0.6)],
        "expected": [pytest.approx(1.2 / (1 + 0.6 * 0.2))],
    }  # fmt: skip
    assert row["steps_speedup"] == pytest.approx(60 / 50)
    table = bench.model_table({"toy": [{"method": "none"}, row]})
    assert "| one process: toy | 1.2 (1.2) | 0.60 | 1.07 (1.07) | 1.20 (1.20) |" in table


def test_the_recommended_end_is_placed_against_the_data_orders_own_spread(
    bench: ModuleType,
) -> None:
    def rows(gaps: list[float], spread: list[float], regression: bool) -> list[dict[str, Any]]:
        def row(method: str, deltas: list[float]) -> dict[str, Any]:
            return {"method": method, "regression": regression, "delta_lasts": deltas,
                    "delta_last": sorted(deltas)[len(deltas) // 2]}  # fmt: skip

        return [row("none", [0.0] * 3), row("infobatch", gaps), row("none-order", spread)]

    # accuracy: a gap below every seed's of the other order is worse, above better
    assert bench.epoch_floor(rows([-0.01, -0.02, -0.03], [-0.01, 0.0, 0.01], False))["where"] == (
        "worse"
    )
    assert bench.epoch_floor(rows([0.02] * 3, [-0.01, 0.0, 0.01], False))["where"] == "better"
    assert bench.epoch_floor(rows([-0.01] * 3, [-0.01, 0.0, 0.01], False))["where"] == "within"
    # MSE: a larger ratio is worse; regression's 4% inside a spread of -9% to +10%
    floor = bench.epoch_floor(rows([0.0, 0.042, 0.05], [0.095, 0.097, -0.089], True))
    assert (floor["gap"], floor["where"]) == (0.042, "within")
    assert bench.epoch_floor(rows([0.11] * 3, [0.095, 0.097, -0.089], True))["where"] == "worse"
    assert bench.epoch_floor(rows([0.0] * 3, [0.01], True)[:2]) is None  # no order run
    table = bench.epoch_floor_table({"friedman": rows([0.0, 0.042, 0.05], [0.095, -0.089], True)})
    assert (
        "| one process: friedman | +4.2% (+0.0%, +4.2%, +5.0%) | +9.5%, -8.9% | within |" in table
    )


def test_the_epoch_budget_runs_the_tasks_and_seeds_asked_for_on_both_layouts(
    bench: ModuleType,
) -> None:
    args = bench.epoch_options(argparse.ArgumentParser()).parse_args(
        ["--tasks", "friedman", "digits", "--seeds", "4"]
    )
    args.quick = False
    jobs = bench.epoch_settings(args).jobs()
    order = [(j["seed"], j["task"]["name"], j["partitions"]) for j in jobs]
    # in the full run's order of tasks, whatever the order asked in
    per_seed = [("digits", 1), ("friedman", 1), ("digits", 2), ("friedman", 2)]
    assert order == [(s, name, k) for s in range(4) for name, k in per_seed]
    full = {j["task"]["name"]: j for j in bench.EPOCHS_FULL.jobs() if j["seed"] == 0}
    assert jobs[1]["task"] == full["friedman"]["task"]  # the same epochs and grid
    assert jobs[1]["methods"] == full["friedman"]["methods"]
    for argv in (["--tasks", "friedman"], ["--seeds", "6"]):  # would overwrite the full table
        with pytest.raises(SystemExit):
            bench.main(["--epochs", *argv])
    with pytest.raises(SystemExit):
        bench.main(["--epochs", "--seeds", "0", "--no-docs"])
