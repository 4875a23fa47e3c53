"""The pure parts of scripts/bench_sifting_epochs.py: the jobs, time to the target, the ends,
the bar, the pruning model, the tables."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest
import scripts_module

META = {"date": "2026-12-06", "cores": 2, "commit": "abc1234", "load_start": 0.1,
        "load_end": 0.2, "seconds": 60.0}  # fmt: skip


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return scripts_module.load("bench_sifting_epochs")


def curve(*points: tuple[float, float]) -> list[list[float]]:
    """[seconds, steps, samples, metric] points, 10 steps per second, B=64."""
    return [[t, 10 * t, 640 * t, m] for t, m in points]


def job(curves: dict[str, list[list[float]]], loss: str = "ce") -> Any:
    """One seed's job of the methods in ``curves``, in their order."""
    sift = {"kept_fraction": 0.5, "time_scoring": 0.0}
    results = [
        {"method": m, "curve": c, "sift": {} if m.startswith("none") else sift}
        for m, c in curves.items()
    ]
    methods = [{"name": m, "policy": "none", "anneal": 0.125} for m in curves]
    task = {"name": "toy", "loss": loss, "epochs": 10}
    return {"job": {"task": task, "partitions": 1, "methods": methods},
            "ranks": [{"results": results}]}  # fmt: skip


def test_the_epoch_budget_runs_every_method_for_the_tasks_epochs_on_both_layouts(
    bench: ModuleType,
) -> None:
    settings = bench.FULL
    jobs = settings.jobs()
    tasks = [t.name for t in bench.TASKS]
    per_seed = [(name, 1) for name in tasks] + [(name, 2) for name in tasks]
    order = [(j["seed"], j["task"]["name"], j["partitions"]) for j in jobs]
    assert order == [(s, name, k) for s in (0, 1, 2) for name, k in per_seed]
    for j in jobs:
        # what the worker reads: every run trains for the task's epochs, no time budget
        assert set(j) == {"score_batches", "task", "seed", "methods", "partitions",
                          "microbatches", "cache"}  # fmt: skip
        assert (j["microbatches"], j["score_batches"]) == (4 if j["partitions"] == 2 else 1, 8)
        names = [m["name"] for m in j["methods"]]
        assert names == ["none", "infobatch", "none-tf.data", "none-order", "none-again"]
        # every run on from_arrays, but one no-sifting run on the tf.data input
        sources = [m["source"] for m in j["methods"]]
        assert sources == ["arrays", "arrays", "tf.data", "arrays", "arrays"]
        # one no-sifting run in another order of the data; the rest in the seed's
        assert [m["order"] for m in j["methods"]] == [0, 0, 0, 1000, 0]
        infobatch = j["methods"][1]
        # training scores, InfoBatch's weights and stale = its epochs (every score it ever
        # recorded) are what SiftConfig implies from the policy, the worker's epochs the task's
        assert {k: infobatch[k] for k in ("policy", "prune", "anneal")} == {
            "policy": "infobatch", "prune": 0.5, "anneal": 0.125,
        }  # fmt: skip
    # twice the epochs of the retired time-to-target runs (docs/benchmarks-log.md)
    epochs = {t.name: t.epochs for t in settings.tasks}
    assert epochs == {"mnist1d": 10, "mnist1d-noisy": 10, "digits": 60, "friedman": 16,
                      "mnist1d-wide": 4}  # fmt: skip
    # evaluated on a grid of optimizer steps (not seconds), half as dense as those runs
    grid = {j["task"]["name"]: j["task"]["eval_every"] for j in jobs}
    assert grid == {"mnist1d": 200, "mnist1d-noisy": 200, "digits": 40, "friedman": 100,
                    "mnist1d-wide": 100}  # fmt: skip


def test_the_quick_run_is_one_seed_of_every_task_and_mnist1d_on_the_pipeline(
    bench: ModuleType,
) -> None:
    order = [(j["seed"], j["task"]["name"], j["partitions"]) for j in bench.QUICK.jobs()]
    assert order == [(0, t.name, 1) for t in bench.TASKS] + [(0, "mnist1d", 2)]
    assert [t.epochs for t in bench.QUICK.tasks] == [1, 1, 3, 1, 1]


def test_target_is_half_a_point_below_accuracy_and_two_percent_above_mse(bench: ModuleType) -> None:
    assert bench.target(0.9, regression=False) == pytest.approx(0.895)
    assert bench.target(0.5, regression=True) == pytest.approx(0.51)


def test_first_reach_is_the_first_evaluation_at_or_past_the_target(bench: ModuleType) -> None:
    c = curve((0, 0.1), (1, 0.8), (2, 0.91), (3, 0.89), (4, 0.95))
    assert bench.first_reach(c, 0.9, regression=False)[0] == 2
    assert bench.first_reach(c, 0.99, regression=False) is None
    mse = curve((0, 2.0), (1, 0.6), (2, 0.5))
    assert bench.first_reach(mse, 0.55, regression=True)[0] == 2


def test_a_speedup_is_no_siftings_mean_time_over_the_runs_and_the_repeats_over_the_first(
    bench: ModuleType,
) -> None:
    curves = {
        "none": curve((0, 0.1), (4, 0.90), (8, 0.92)),  # target 0.915, hit at 8
        "fast": curve((0, 0.1), (2, 0.92), (10, 0.93)),  # hit at 2
        "slow": curve((0, 0.1), (9, 0.5)),  # never
        "none-again": curve((0, 0.1), (4, 0.92), (8, 0.92)),  # hit at 4: a faster machine
    }
    rows = bench.seed_rows(job(curves)["ranks"], regression=False)
    assert rows["fast"]["speedup"] == pytest.approx(6.0 / 2.0)
    assert rows["fast"]["steps"] == 20
    assert rows["none-again"]["speedup"] == pytest.approx(8.0 / 4.0)
    assert rows["slow"]["speedup"] == 0.0
    assert math.isinf(rows["slow"]["seconds"])
    # seconds per step from the run's end: 10 s for 100 steps
    assert rows["fast"]["step_s"] == pytest.approx(0.1)


def test_the_epoch_rows_compare_each_runs_end_with_no_siftings(bench: ModuleType) -> None:
    curves = {
        "none": curve((1, 0.5), (5, 0.9), (10, 0.9)),  # target 0.895, reached at 5 s
        "infobatch": curve((1, 0.5), (4, 0.9), (7.7, 0.897)),
        "none-again": curve((1, 0.5), (6, 0.9), (12, 0.89)),
    }
    rows = bench.seed_rows(job(curves)["ranks"], regression=False)
    # against the mean of no sifting's two runs: 11 s to the end, 5.5 s to the target
    assert rows["infobatch"]["saved"] == pytest.approx(0.3)
    assert rows["infobatch"]["speedup"] == pytest.approx(5.5 / 4)
    assert rows["infobatch"]["delta"] == pytest.approx(-0.003)
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
        bench.seed_rows(job(never)["ranks"], False)["infobatch"]["steps_speedup"] == 0
    )  # never reached: "never" in the table, below every bar
    mse = {k: [[*p[:3], 1 - p[3]] for p in c] for k, c in curves.items()}  # 0.1 at the end
    rows = bench.seed_rows(job(mse, "mse")["ranks"], regression=True)
    assert rows["infobatch"]["delta"] == pytest.approx(0.103 / 0.1 - 1)  # relative
    # the mean of the last 3 evaluations: 0.5, 0.1, 0.103 against 0.5, 0.1, 0.1
    assert rows["infobatch"]["delta_last"] == pytest.approx(0.703 / 0.7 - 1)


def test_the_summary_takes_medians_over_seeds_and_keeps_each_seeds_value(
    bench: ModuleType,
) -> None:
    seeds = [
        job({"none": curve((0, 0), (10, 0.9)), "infobatch": curve((0, 0), (t, 0.9))})
        for t in (5.0, 10.0, 20.0)
    ]
    row = bench.epoch_summary(seeds)["toy"][1]
    assert row["speedups"] == pytest.approx([2.0, 1.0, 0.5])
    assert row["speedup"] == pytest.approx(1.0)
    assert row["saveds"] == pytest.approx([0.5, 0.0, -1.0])
    assert row["saved"] == pytest.approx(0.0)


def test_a_method_without_results_is_reported_failed_and_left_out_of_the_tables(
    bench: ModuleType,
) -> None:
    entry = job({"none": curve((0, 0), (1, 0.9)), "none-order": curve((0, 0), (1, 0.9))})
    entry["job"]["methods"].insert(1, {"name": "infobatch", "policy": "infobatch", "anneal": 0.125})
    entry["ranks"][0]["results"].insert(1, {"method": "infobatch", "status": "failed"})
    summary = bench.epoch_summary([entry])
    assert summary["toy"][1] == {"method": "infobatch", "status": "failed"}
    assert len(bench.recommended_table(summary).splitlines()) == 2  # the header alone
    assert bench.epoch_verdict(summary, pipeline=False)["tasks"] == 0


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
    entry = job(curves)
    entry["job"]["task"]["epochs"] = 2
    for method in entry["job"]["methods"]:
        method["anneal"] = 0.0
    row = bench.epoch_summary([entry])["toy"][1]
    assert row["model"] == {
        "target_epoch": [pytest.approx(1.2)], "k": [pytest.approx(0.6)],
        "expected": [pytest.approx(1.2 / (1 + 0.6 * 0.2))],
    }  # fmt: skip
    assert row["steps_speedup"] == pytest.approx(60 / 50)
    line = bench.recommended_table({"toy": [{"method": "none"}, row]}).splitlines()[-1]
    # kept 0.5; saved 1 - 8 / 10; 6 s / 5 s to the target; 1.2x in optimizer steps against
    # 1.07 expected; 0.1 s a step, as no sifting's
    assert line.startswith(
        "| one process: toy | 0.50 | 20% | 1.20 | 1.20 | 1.07 (E 1.2; k 0.60) | 1.00 |"
    )


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
    measured = {"kept": 0.7, "saved": 0.25, "speedup": 1.1, "steps_speedup": 1.2, "step_cost": 1.0}
    friedman = rows([0.0, 0.042, 0.05], [0.095, -0.089], True)
    friedman[1] |= measured
    line = bench.recommended_table({"friedman@K2": friedman}).splitlines()[-1]
    assert line == (
        "| 2-stage pipeline: friedman | 0.70 | 25% | 1.10 | 1.20 |  | 1.00 | +4.2% "
        "| +9.5%, -8.9% | within |"
    )


def test_the_controls_show_what_no_sifting_moves_by_itself(bench: ModuleType) -> None:
    curves = {
        "none": curve((1, 0.5), (5, 0.9), (10, 0.9)),  # target 0.895 at 50 steps
        "infobatch": curve((1, 0.5), (4, 0.9), (8, 0.9)),
        "none-tf.data": curve((1, 0.5), (5, 0.9), (12.5, 0.9)),  # the same steps, dearer
        "none-order": curve((1, 0.5), (6, 0.9), (10, 0.9)),  # 60 steps to the target
        "none-again": curve((1, 0.5), (5, 0.9), (10, 0.9)),
    }
    summary = bench.epoch_summary([job(curves)])
    assert bench.controls_table(summary).splitlines() == [
        "| layout: task | no sifting on the tf.data input | no sifting in another data order "
        "| no sifting again, after the others |",
        "|---|---|---|---|",
        "| one process: toy | -25%; 1.00; 1.00 | 0%; 0.83; 0.83 | 0%; 1.00; 1.00 |",
    ]
    text = bench.render({"jobs": [job(curves)]}, META, bench.FULL)
    assert "### `infobatch` on `from_arrays` against no sifting" in text
    assert scripts_module.prose(text) == []
    first = text.split("\n\n")[0]
    assert first.endswith("Rerun: `.venv/bin/python scripts/bench_sifting_epochs.py`.")


def test_the_epoch_budget_runs_the_tasks_and_seeds_asked_for_on_both_layouts(
    bench: ModuleType,
) -> None:
    args = bench.options(argparse.ArgumentParser()).parse_args(
        ["--tasks", "friedman", "digits", "--seeds", "4"]
    )
    args.quick = False
    jobs = bench.subset(args).jobs()
    order = [(j["seed"], j["task"]["name"], j["partitions"]) for j in jobs]
    # in the full run's order of tasks, whatever the order asked in
    per_seed = [("digits", 1), ("friedman", 1), ("digits", 2), ("friedman", 2)]
    assert order == [(s, name, k) for s in range(4) for name, k in per_seed]
    full = {j["task"]["name"]: j for j in bench.FULL.jobs() if j["seed"] == 0}
    assert jobs[1]["task"] == full["friedman"]["task"]  # the same epochs and grid
    assert jobs[1]["methods"] == full["friedman"]["methods"]
    for argv in (["--tasks", "friedman"], ["--seeds", "6"]):  # would overwrite the full table
        with pytest.raises(SystemExit):
            bench.main(argv)
    with pytest.raises(SystemExit):
        bench.main(["--seeds", "0", "--no-docs"])


def test_the_benchmark_imports_without_tensorflow() -> None:
    code = "import bench_sifting_epochs, sys; print('tensorflow' in sys.modules)"
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=scripts_module.SCRIPTS, capture_output=True, text=True
    )
    assert (run.returncode, run.stdout.strip()) == (0, "False"), run.stderr
