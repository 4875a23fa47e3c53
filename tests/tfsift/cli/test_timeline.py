"""``tfsift timeline RUN_DIR``: a run's recorded steps as a trace, a chart and bubbles."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from events import scalars

import mpi
from partitioner.plan import Plan
from partitioner.timeline import MEASURED_NOTE
from tfsift.cli.main import main
from tfsift.pipeline import rundir
from tfsift.pipeline.rundir import Header, StepRecord

# simple, K=2, M=1: stage 0 computes 2 + extra s, stage 1 1 s, the step lasts 4 + extra s
ACTIONS = {
    0: (("0F0", 0.0, 1.0), ("0SF0", 1.0, 1.0), ("0RB0", 1.0, 3.0), ("0B0", 3.0, 4.0)),
    1: (("1RF0", 0.0, 1.0), ("1F0", 1.0, 2.0), ("1B0", 2.0, 2.0), ("1SB0", 2.0, 2.0)),
}
# step: (call, training, extra seconds of stage 0's backward); bubble 1 - (3 + x) / (8 + 2x)
STEPS = {0: (0, True, 12.0), 1: (1, True, 0.0), 2: (2, True, 4.0), 4: (4, True, 2.0),
         5: (0, False, 0.0)}  # fmt: skip


def record(step: int, stage: int) -> StepRecord:
    call, training, extra = STEPS[step]
    at = 100.0 * step
    actions = [(a, at + start, at + end) for a, start, end in ACTIONS[stage]]
    if stage == 0:
        actions[-1] = ("0B0", at + 3.0, at + 4.0 + extra)
    name = "train" if training else "evaluate"
    return StepRecord(step, name, call, training, stage, at, at + 4.0, 8, tuple(actions))


def write_run(run_dir: Path, plan_bubble: float | None = 0.25) -> None:
    for rank in (0, 1):
        head = Header(rank, rank, 0, (0, 1), 1, 1, "simple", "speed", None, 0.0, 0.0)
        path = rundir.rank_file(run_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [head.to_line()] + [record(step, rank).to_line() for step in STEPS]
        path.write_text("\n".join(lines) + "\n")
    if plan_bubble is not None:
        Plan((0, 1, 2), (("a",), ("b",)), "speed", "simple", 1, 1.0, plan_bubble, (0, 0),
             "x").save(run_dir / "plan.json")  # fmt: skip


def complete(trace: dict[str, Any], tid: int) -> list[str]:
    return [e["name"] for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == tid]


def test_prints_every_step_and_the_median_next_to_the_plan_and_writes_trace_and_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path)
    assert main(["timeline", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"{tmp_path}: replica 0, ranks 0, 1 (K=2), M=1, simple; 5 recorded steps",
        "step 0 (train, call 0, training): measured step 16 s, measured bubble 53.1% "
        "(simulated 25.0%)",
        "step 1 (train, call 1, training): measured step 4 s, measured bubble 62.5% "
        "(simulated 25.0%)",
        "step 2 (train, call 2, training): measured step 8 s, measured bubble 56.2% "
        "(simulated 25.0%)",
        "step 4 (train, call 4, training): measured step 6 s, measured bubble 58.3% "
        "(simulated 25.0%)",
        "step 5 (evaluate, call 0, forward only): measured step 4 s, measured bubble 62.5%",
        "median of 3 training steps (first calls left out: they compile): measured bubble "
        "58.3% (simulated 25.0%)",
        f"simulated bubble from {tmp_path / 'plan.json'}",
        "Measured bubble: the share of this step each stage spent outside forwards and "
        "backwards (waiting for messages, sending them, the runtime's own work). The simulated "
        "bubble of `tfsift plan` counts only the schedule's waits, so the measured one is "
        "higher, most on small models.",
        f"wrote {tmp_path / 'timeline.json'}",
        f"wrote {tmp_path / 'timeline.png'}",
    ]
    trace = json.loads((tmp_path / "timeline.json").read_text())
    tracks = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
              if e["name"] == "thread_name"}  # fmt: skip
    assert tracks == {0: "rank 0 (stage 0)", 1: "rank 1 (stage 1)", 2: "steps"}
    assert complete(trace, 2) == [
        "step 0 (train, call 0, training)",
        "step 1 (train, call 1, training)",
        "step 2 (train, call 2, training)",
        "step 4 (train, call 4, training)",
        "step 5 (evaluate, call 0, forward only)",
    ]
    assert complete(trace, 0) == ["F0", "SF0", "RB0", "B0"] * 5
    assert complete(trace, 1) == ["RF0", "F0+B0 (fused)", "B0 (done in F0+B0)", "SB0"] * 5
    assert trace["otherData"]["simulated_bubble"] == 0.25
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_step_goes_where_out_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path, plan_bubble=None)
    out = tmp_path / "elsewhere" / "two.json"
    out.parent.mkdir()
    assert main(["timeline", str(tmp_path), "--step", "2", "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{tmp_path}: replica 0, ranks 0, 1 (K=2), M=1, simple; 1 recorded step",
        "step 2 (train, call 2, training): measured step 8 s, measured bubble 56.2%",
        "no simulated bubble: no plan.json in the run directory (rank 0 writes it when it "
        "solves the partition: auto_partition, partitions > 1); --plan PLAN.json names one",
        f"wrote {out}",
        f"wrote {out.with_suffix('.png')}",
    ]
    assert complete(json.loads(out.read_text()), 2) == ["step 2 (train, call 2, training)"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--step", "3"], "step 3 was not recorded. Received: --step 3; recorded steps: "
                          "0, 1, 2, 4, 5"),
        (["--replica", "1"], "replica 1 has no timeline files in {run}. Received: replicas [0]"),
        (["--plan", "nope.json"], "the plan file does not exist. Received: 'nope.json'"),
    ],
)  # fmt: skip
def test_a_bad_flag_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    write_run(tmp_path)
    assert main(["timeline", str(tmp_path), *argv]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"tfsift timeline: {message.format(run=repr(str(tmp_path)))}\n"


def test_a_directory_without_timeline_files_says_to_set_log_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["timeline", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"tfsift timeline: {str(tmp_path / 'timeline')!r} holds no rank-<r>.jsonl timeline "
        f"files: run the training with tfsift.init({{..., 'log_dir': {str(tmp_path)!r}}}). "
        "Received: []\n"
    )


def test_a_missing_directory_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["timeline", str(tmp_path / "run")]) == 1
    assert capsys.readouterr().err == (
        f"tfsift timeline: the run directory does not exist. Received: {str(tmp_path / 'run')!r}\n"
    )


def test_a_missing_rank_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path)
    rundir.rank_file(tmp_path, 1).unlink()
    assert main(["timeline", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        "tfsift timeline: the pipeline of replica 0 is ranks [0, 1], and ranks [1] left no "
        f"file in {str(tmp_path / 'timeline')!r} (did they fail, or is the directory a "
        "partial copy?)\n"
    )


STEP_LINE = re.compile(
    r"step (\d) \(training_step\.<locals>\.forward_backward, call (\d), training\): measured "
    r"step \S+ m?s, measured bubble \d+\.\d% \(simulated (\d+\.\d)%\)"
)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.alone
def test_two_ranks_log_their_steps_and_tfsift_timeline_merges_them(tmp_path: Path) -> None:
    got = mpi.reports(mpi.run(2, "runlog_check.py", str(tmp_path), timeout=300))
    assert sorted(p.name for p in (tmp_path / "timeline").iterdir()) == [
        "rank-0.jsonl",
        "rank-1.jsonl",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "tfsift.cli", "timeline", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    simulated = f"{Plan.load(tmp_path / 'plan.json').predicted_bubble:.1%}"
    assert (
        lines[0] == f"{tmp_path}: replica 0, ranks 0, 1 (K=2), M=4, interleaved; 4 recorded steps"
    )
    steps = [STEP_LINE.fullmatch(line) for line in lines[1:5]]
    assert [m.groups() if m else line for m, line in zip(steps, lines[1:5], strict=True)] == [
        ("0", "0", simulated[:-1]),
        ("1", "1", simulated[:-1]),
        ("2", "2", simulated[:-1]),
        ("4", "4", simulated[:-1]),
    ]
    assert lines[5].startswith("median of 3 training steps (first calls left out: they compile)")
    assert lines[6:] == [
        f"simulated bubble from {tmp_path / 'plan.json'}",
        MEASURED_NOTE,
        f"wrote {tmp_path / 'timeline.json'}",
        f"wrote {tmp_path / 'timeline.png'}",
    ]
    trace = json.loads((tmp_path / "timeline.json").read_text())
    interleaved = ["F0", "SF0", "F1", "SF1", "RB0", "B0", "F2", "SF2", "RB1", "B1", "F3",
                   "SF3", "RB2", "B2", "RB3", "B3"]  # fmt: skip
    assert complete(trace, 0) == interleaved * 4
    fused = [
        name
        for m in range(4)
        for name in (f"RF{m}", f"F{m}+B{m} (fused)", f"B{m} (done in F{m}+B{m})", f"SB{m}")
    ]
    assert complete(trace, 1) == fused * 4
    points = scalars(tmp_path)
    assert sorted(points) == [
        "stage0/busy_fraction", "stage0/idle_fraction", "stage1/busy_fraction",
        "stage1/idle_fraction", "step/bubble_fraction", "step/loss",
        "step/samples_per_second", "step/seconds",
    ]  # fmt: skip
    losses = got[0]["losses"]
    assert got[1]["losses"] == losses
    assert points["step/loss"] == [(i, float(np.float32(v))) for i, v in enumerate(losses)]
    merged = [s.timeline for s in rundir.Run.load(tmp_path).steps]
    for s in (0, 1):
        assert points[f"stage{s}/busy_fraction"] == [
            (at, float(np.float32(step.busy()[s] / step.step_time)))
            for at, step in zip([0, 1, 2, 4], merged, strict=True)
        ]
