"""The pure parts of scripts/bench_sifting_epochs.py: the ends, the bar, the pruning model."""

from __future__ import annotations

import argparse
from types import ModuleType
from typing import Any

import pytest
import scripts_module

META = {"date": "2026-12-06", "cores": 2, "commit": "abc1234", "load_start": 0.1,
        "load_end": 0.2, "seconds": 60.0}  # fmt: skip


@pytest.fixture(scope="module")
def sifting() -> ModuleType:
    return scripts_module.load("bench_sifting")


@pytest.fixture(scope="module")
def bench(sifting: ModuleType) -> ModuleType:
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
    bench: ModuleType, sifting: ModuleType
) -> None:
    settings = bench.FULL
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
    assert sifting.FULL.job(bench.TASKS[0], 0, 1, 1)["fixed_epochs"] is False


def test_the_epoch_rows_compare_each_runs_end_with_no_siftings(bench: ModuleType) -> None:
    curves = {
        "none": curve((1, 0.5), (5, 0.9), (10, 0.9)),  # target 0.895, reached at 5 s
        "infobatch": curve((1, 0.5), (4, 0.9), (7.7, 0.897)),
        "none-again": curve((1, 0.5), (6, 0.9), (12, 0.89)),
    }
    rows = bench.epoch_seed_rows(job(curves)["ranks"], regression=False)
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
        bench.epoch_seed_rows(job(never)["ranks"], False)["infobatch"]["steps_speedup"] == 0
    )  # never reached: "never" in the table, below every bar
    mse = {k: [[*p[:3], 1 - p[3]] for p in c] for k, c in curves.items()}  # 0.1 at the end
    rows = bench.epoch_seed_rows(job(mse, "mse")["ranks"], regression=True)
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
