"""The run directory's timeline files: records, reading, merging, and the plan's prediction."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from partitioner.plan import Plan
from tfsift.pipeline import rundir
from tfsift.pipeline.rundir import Header, Run, StepRecord, merge, predicted_bubble, recorded

# Stage s's actions of simple K=2, M=1 (communication included) and when they ran, in
# seconds after stage 0 entered the step at ENTERED: stage 0 computes 2 s, stage 1 1 s,
# the step lasts 4 s, so the bubble is 1 - 3 / (2 * 4) = 62.5%.
ENTERED = 10.0
ACTIONS = {
    0: (("0F0", 0.0, 1.0), ("0SF0", 1.0, 1.0), ("0RB0", 1.0, 3.0), ("0B0", 3.0, 4.0)),
    1: (("1RF0", -0.5, 1.0), ("1F0", 1.0, 2.0), ("1B0", 2.0, 2.0), ("1SB0", 2.0, 2.0)),
}


def header(rank: int, stage: int, replica: int = 0, ranks: Sequence[int] = (0, 1)) -> Header:
    return Header(rank, stage, replica, tuple(ranks), 1, 1, "simple", "speed", None, 0.0, 0.0)


def record(step: int, stage: int, call: int = 1, training: bool = True) -> StepRecord:
    """Stage ``stage``'s record of ``step``, the steps 100 s apart."""
    at = ENTERED + 100 * step
    actions = tuple((a, at + start, at + end) for a, start, end in ACTIONS[stage])
    entered = at if stage == 0 else at - 0.5
    return StepRecord(step, "train", call, training, stage, entered, at + 4.0, 8, actions)


def write(run_dir: Path, rank: int, head: Header, records: Sequence[StepRecord]) -> Path:
    path = rundir.rank_file(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(line + "\n" for line in [head.to_line(), *(r.to_line() for r in records)])
    )
    return path


def plan(K: int = 2, M: int = 1, pipeline: str = "simple", bubble: float = 0.25) -> Plan:
    return Plan(tuple(range(K + 1)), tuple((f"l{s}",) for s in range(K)), "speed", pipeline, M,
                1.0, bubble, (0,) * K, "x")  # fmt: skip


def test_the_first_call_the_powers_of_two_and_every_hundredth_are_recorded() -> None:
    assert [c for c in range(1025) if recorded(c)] == [
        0, 1, 2, 4, 8, 16, 32, 64, 100, 128, 200, 256, 300, 400, 500, 512, 600, 700, 800,
        900, 1000, 1024,
    ]  # fmt: skip


def test_a_record_survives_its_json_line_rounded_to_the_microsecond() -> None:
    kept = StepRecord(3, "f", 2, False, 1, 0.1234567, 0.5, 4, (("1RF0", 0.1234564, 0.2),))
    line = json.loads(kept.to_line())
    assert line == {
        "step": 3, "name": "f", "call": 2, "training": False, "stage": 1, "entered": 0.123457,
        "left": 0.5, "samples": 4, "actions": [["1RF0", 0.123456, 0.2]],
    }  # fmt: skip
    assert StepRecord.from_dict(line) == StepRecord(
        3, "f", 2, False, 1, 0.123457, 0.5, 4, (("1RF0", 0.123456, 0.2),)
    )


def test_a_rank_file_reads_back_and_a_line_cut_short_at_the_end_is_skipped(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, 1, header(1, 1), [record(0, 1), record(1, 1)])
    path.write_text(path.read_text() + '{"step": 2, "na')  # the job ended mid-write
    head, records = rundir.read_rank_file(path)
    assert head == header(1, 1)
    assert head.stages == 2
    assert records == [record(0, 1), record(1, 1)]


def test_a_file_that_is_not_a_timeline_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    path.write_text('{"format": "something else"}\n')
    with pytest.raises(ValueError) as err:
        rundir.read_rank_file(path)
    assert str(err.value) == (
        f"{str(path)!r} is not a tfsift timeline file (ValueError: the first line is not a "
        "tfsift-timeline header of version 1). Received: first line "
        '\'{"format": "something else"}\''
    )


def test_merge_starts_the_step_when_stage_0_entered_it() -> None:
    step = merge([record(0, 1), record(0, 0)])
    assert [(e.stage, str(e.action), e.start, e.end) for e in step.events] == [
        (0, "0F0", 0.0, 1.0), (0, "0SF0", 1.0, 1.0), (0, "0RB0", 1.0, 3.0), (0, "0B0", 3.0, 4.0),
        # stage 1 entered 0.5 s earlier: its first receive counts from the step's start
        (1, "1RF0", 0.0, 1.0), (1, "1F0", 1.0, 2.0), (1, "1B0", 2.0, 2.0), (1, "1SB0", 2.0, 2.0),
    ]  # fmt: skip
    assert (step.stages, step.step_time, step.busy()) == (2, 4.0, (2.0, 1.0))
    assert step.bubble_fraction == 0.625


@pytest.mark.parametrize(
    ("records", "received"),
    [
        ([record(0, 0), record(1, 1)], "steps [0, 1], stages [0, 1]"),
        ([record(0, 1)], "steps [0], stages [1]"),
    ],
)
def test_merge_needs_one_record_per_stage_of_one_step(
    records: list[StepRecord], received: str
) -> None:
    with pytest.raises(ValueError) as err:
        merge(records)
    assert str(err.value) == (
        f"merge needs one record per stage 0..K-1 of one step. Received: {received}"
    )


def test_a_run_merges_the_steps_every_rank_of_the_replica_recorded(tmp_path: Path) -> None:
    write(tmp_path, 0, header(0, 0), [record(0, 0, 0), record(1, 0), record(2, 0)])
    write(tmp_path, 1, header(1, 1), [record(0, 1, 0), record(1, 1)])  # died during step 2
    run = Run.load(tmp_path)
    assert run.header == header(0, 0)
    assert [(s.step, s.name, s.call, s.training) for s in run.steps] == [
        (0, "train", 0, True),
        (1, "train", 1, True),
    ]
    assert run.steps[1].timeline == merge([record(1, 0), record(1, 1)])


def test_a_run_reads_the_replica_asked_for(tmp_path: Path) -> None:
    write(tmp_path, 0, header(0, 0, 0, (0, 2)), [record(0, 0)])
    write(tmp_path, 2, header(2, 1, 0, (0, 2)), [record(0, 1)])
    write(tmp_path, 1, header(1, 0, 1, (1, 3)), [record(5, 0)])
    write(tmp_path, 3, header(3, 1, 1, (1, 3)), [record(5, 1)])
    assert [s.step for s in Run.load(tmp_path, replica=1).steps] == [5]
    assert Run.load(tmp_path, replica=1).header.ranks == (1, 3)
    with pytest.raises(ValueError) as err:
        Run.load(tmp_path, replica=2)
    assert str(err.value) == (
        f"replica 2 has no timeline files in {str(tmp_path)!r}. Received: replicas [0, 1]"
    )


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as err:
        Run.load(tmp_path / "nope")
    assert str(err.value) == (
        f"the run directory does not exist. Received: {str(tmp_path / 'nope')!r}"
    )


def test_a_directory_without_timeline_files_says_how_to_make_them(tmp_path: Path) -> None:
    (tmp_path / "events.out.tfevents.1").write_text("")
    with pytest.raises(ValueError) as err:
        Run.load(tmp_path)
    assert str(err.value) == (
        f"{str(tmp_path / 'timeline')!r} holds no rank-<r>.jsonl timeline files: run the "
        f"training with tfsift.init({{..., 'log_dir': {str(tmp_path)!r}}}). Received: "
        "['events.out.tfevents.1']"
    )


def test_a_rank_without_a_file_is_named(tmp_path: Path) -> None:
    write(tmp_path, 0, header(0, 0), [record(0, 0)])
    with pytest.raises(ValueError) as err:
        Run.load(tmp_path)
    assert str(err.value) == (
        "the pipeline of replica 0 is ranks [0, 1], and ranks [1] left no file in "
        f"{str(tmp_path / 'timeline')!r} (did they fail, or is the directory a partial copy?)"
    )


def test_files_of_another_run_are_refused(tmp_path: Path) -> None:
    write(tmp_path, 0, header(0, 0), [record(0, 0)])
    other = Header(1, 1, 0, (0, 1), 1, 4, "simple", "speed", None, 0.0, 0.0)
    write(tmp_path, 1, other, [record(0, 1)])
    with pytest.raises(ValueError) as err:
        Run.load(tmp_path)
    assert str(err.value) == (
        f"the timeline files in {str(tmp_path)!r} come from different runs (delete the "
        "directory before reusing it with another layout). Received: (rank, stage, pipeline "
        "ranks, M) [(0, 0, [0, 1], 1), (1, 1, [0, 1], 4)]"
    )


def test_the_prediction_comes_from_the_run_directory_then_the_plan_file(tmp_path: Path) -> None:
    elsewhere = tmp_path / "mine.json"
    plan(bubble=0.5).save(elsewhere)
    head = Header(0, 0, 0, (0, 1), 1, 1, "simple", "speed", str(elsewhere), 0.0, 0.0)
    assert predicted_bubble(tmp_path, head) == (0.5, f"simulated bubble from {elsewhere}")
    plan(bubble=0.25).save(tmp_path / "plan.json")
    assert predicted_bubble(tmp_path, head) == (
        0.25,
        f"simulated bubble from {tmp_path / 'plan.json'}",
    )
    assert predicted_bubble(tmp_path, head, elsewhere)[0] == 0.5


def test_a_plan_for_another_run_predicts_nothing(tmp_path: Path) -> None:
    plan(M=4, pipeline="interleaved").save(tmp_path / "plan.json")
    assert predicted_bubble(tmp_path, header(0, 0)) == (
        None,
        f"no simulated bubble: the plan in {tmp_path / 'plan.json'} was made for K=2, M=4, "
        "interleaved; this run is K=2, M=1, simple",
    )


def test_a_plan_with_virtual_stages_predicts_the_run_of_its_k_ranks(tmp_path: Path) -> None:
    # K = 2 ranks of 2 chunks each: the plan cuts 4 stages; `tfsift timeline` of such a run
    # said it was made for K=4
    chunked = Plan(tuple(range(5)), tuple((f"l{c}",) for c in range(4)), "speed", "interleaved",
                   8, 1.0, 0.25, (0, 0), "x", virtual_stages=2)  # fmt: skip
    chunked.save(tmp_path / "plan.json")
    head = Header(0, 0, 0, (0, 1), 1, 8, "interleaved", "speed", None, 0.0, 0.0, 2)
    assert predicted_bubble(tmp_path, head)[0] == 0.25
    one_chunk = dataclasses.replace(head, virtual_stages=1)
    assert predicted_bubble(tmp_path, one_chunk) == (
        None,
        f"no simulated bubble: the plan in {tmp_path / 'plan.json'} was made for K=2, M=8, "
        "interleaved with 2 virtual stages; this run is K=2, M=8, interleaved",
    )


def test_a_header_written_before_virtual_stages_were_recorded_reads_as_one_chunk() -> None:
    line = json.loads(header(0, 0).to_line())
    del line["virtual_stages"]
    assert Header.from_dict(line) == header(0, 0)


def test_without_a_plan_the_reason_is_given(tmp_path: Path) -> None:
    assert predicted_bubble(tmp_path, header(0, 0)) == (
        None,
        "no simulated bubble: no plan.json in the run directory (rank 0 writes it when it "
        "solves the partition: auto_partition, partitions > 1); --plan PLAN.json names one",
    )
    with pytest.raises(ValueError) as err:
        predicted_bubble(tmp_path, header(0, 0), tmp_path / "x.json")
    assert str(err.value) == (
        f"the plan file does not exist. Received: {str(tmp_path / 'x.json')!r}"
    )
