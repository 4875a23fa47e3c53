"""The pure parts of scripts/bench_sifting.py: targets, time to target, medians, tables."""

from __future__ import annotations

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


META = {"date": "2026-12-06", "cores": 2, "commit": "abc1234", "load_start": 0.1,
        "load_end": 0.2, "seconds": 60.0}  # fmt: skip


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
    # the metric at the baseline's last second, 0.92, past the target 0.915
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
    entry["job"]["methods"].append({"name": "exit", "policy": "relative"})
    entry["ranks"][0]["results"].append({"method": "exit", "status": "n/a (not implemented)"})
    rows = bench.method_rows([entry])
    assert rows[1] == {
        "method": "exit",
        "status": "n/a (not implemented)",
        "definition": entry["job"]["methods"][1],
        "regression": False,
    }
    table = bench.method_table({"toy": rows}, bench.speedup_cell, "method")
    assert table.splitlines()[-1] == "| `exit` | n/a (not implemented) |"


def test_verdict_needs_two_tasks_with_a_fast_method_within_the_target(bench: ModuleType) -> None:
    def rows(speedup: float, margin: float) -> list[dict[str, Any]]:
        fast = {"method": "m", "seconds": 1.0, "speedup": speedup, "margin": margin}
        return [{"method": "none", "seconds": 1.0}, fast]

    assert bench.verdict({"a": rows(1.5, 0.0), "b": rows(1.3, 0.001)})["met"]
    assert not bench.verdict({"a": rows(1.5, 0.0), "b": rows(1.29, 0.01)})["met"]
    assert not bench.verdict({"a": rows(2.0, 0.0), "b": rows(2.0, -0.001)})["met"]
    assert not bench.verdict({"a": rows(2.0, 0.0), "a@K2": rows(2.0, 0.0)})["met"]


def test_the_tables_have_a_row_per_method_and_a_column_per_task_and_layout(
    bench: ModuleType,
) -> None:
    one = {"none": curve((0, 0.1), (4, 0.9)), "relative-1": curve((0, 0.1), (2, 0.9))}
    slow = {"none": curve((0, 0.1), (4, 0.9)), "relative-1": curve((0, 0.1), (8, 0.8))}
    pipeline = job(["none", "relative-1", "infobatch"], slow | {"infobatch": one["relative-1"]})
    pipeline["job"]["partitions"] = 2
    entries = [job(["none", "relative-1"], one), pipeline]
    summary = bench.summarise(entries)
    assert list(summary) == ["toy", "toy@K2"]
    speedups = bench.method_table(summary, bench.speedup_cell, "method").splitlines()
    assert speedups == [
        "| method | toy | toy, 2 stages |",
        "|---|---|---|",
        # no sifting's own row: its time to the target and the target
        "| `none` | 4.0 s to 89.50% | 4.0 s to 89.50% |",
        "| `relative-1` | 2.00 | never |",
        "| `infobatch` |  | 2.00 |",  # on the pipeline only
    ]
    costs = bench.method_table(summary, bench.cost_cell, "method").splitlines()
    # 10 steps a second: 40 steps to the target, 100 ms a step; relative-1 took half the
    # steps at the same cost in one process, never reached it on the pipeline, 0.8 s a step
    assert costs[2:] == [
        "| `none` | 40 steps, 100.0 ms | 40 steps, 100.0 ms |",
        "| `relative-1` | 0.50 / 1.00 | never / 1.00 |",
        "| `infobatch` |  | 0.50 / 1.00 |",
    ]
    text = bench.render({"jobs": entries}, META, bench.QUICK)
    assert "| >= 1.3x to target on >= 2 tasks, the metric at no sifting's last second" in text
    assert "| digits | scikit-learn `load_digits`, 1437 / 360 | 1 x Dense(128) | 32 |" in text
    assert text.split("\n\n")[0].endswith("Rerun: `.venv/bin/python scripts/bench_sifting.py`.")
    assert scripts_module.prose(text) == []


def test_jobs_run_every_task_then_the_pipeline_for_each_seed(bench: ModuleType) -> None:
    settings = bench.Settings(seeds=(0, 1))
    order = [(j["seed"], j["task"]["name"], j["partitions"]) for j in settings.jobs()]
    tasks = [t.name for t in settings.tasks]
    per_seed = [(name, 1) for name in tasks] + [("mnist1d", 2)]
    assert order == [(s, name, k) for s in (0, 1) for name, k in per_seed]
    pipeline = next(j for j in settings.jobs() if j["partitions"] == 2)
    assert pipeline["microbatches"] == 4
    names = [m["name"] for m in pipeline["methods"]]
    assert names == ["none", "relative-1", "relative-1-training", "infobatch", "none-again"]
    infobatch = next(m for m in pipeline["methods"] if m["name"] == "infobatch")
    # training scores, InfoBatch's weights and stale = its epochs (every score it ever
    # recorded) are what SiftConfig implies from the policy, the worker's epochs the task's
    assert {k: infobatch[k] for k in ("policy", "prune", "anneal", "scores", "stale")} == {
        "policy": "infobatch", "prune": 0.5, "anneal": 0.125, "scores": None, "stale": None,
    }  # fmt: skip
    training = next(m for m in pipeline["methods"] if m["name"] == "relative-1-training")
    assert (training["scores"], training["stale"]) == ("training", None)


def test_every_job_runs_the_same_methods_on_either_layout(bench: ModuleType) -> None:
    names = [[m["name"] for m in job["methods"]] for job in bench.FULL.jobs()]
    assert names == [names[0]] * len(names)
    assert names[0] == [m.name for m in bench.METHODS]


@pytest.mark.parametrize("name", ["bench_sifting", "bench_sifting_epochs"])
def test_the_benchmarks_import_without_tensorflow(name: str) -> None:
    code = f"import {name}, sys; print('tensorflow' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], cwd=SCRIPTS, capture_output=True, text=True)
    assert (run.returncode, run.stdout.strip()) == (0, "False"), run.stderr
