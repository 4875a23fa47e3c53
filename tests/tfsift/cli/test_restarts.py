"""``tfsift run --restarts N``: a failed job launched again, a repeated failure stopped."""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mpi
from tfsift.cli import restarts
from tfsift.cli.restarts import EXITED, NO_ERROR, ErrorWatch, Outcome, attempts, repeats

KILLED = Outcome(137)  # mpirun's status when it saw a rank die of SIGKILL
BUG = Outcome(1, "ZeroDivisionError: division by zero")
USAGE = "usage: t.py [-h] [--epochs EPOCHS]"
TYPO = "t.py: error: unrecognized arguments: --epochz 2"
RULE = "-" * 74


def mpirun_report(rank: int, code: int) -> str:
    """What mpirun prints when rank ``rank`` exited first, with ``code``; its job id changes
    from one launch to the next."""
    return (
        f"{RULE}\nPrimary job  terminated normally, but 1 process returned\na non-zero exit "
        f"code. Per user-direction, the job has been aborted.\n{RULE}\n{RULE}\nmpirun detected "
        "that one or more processes exited with non-zero status, thus causing\nthe job to be "
        f"terminated. The first process to do so was:\n\n  Process name: [[{6532 + rank},1],"
        f"{rank}]\n  Exit code:    {code}\n{RULE}\n"
    )


def watched(text: str) -> str | None:
    watch = ErrorWatch()
    for line in text.encode().splitlines(keepends=True):
        watch.seen(line)
    return watch.error


@pytest.mark.parametrize(
    "text, error",
    [("tfsift: rank 1 failed, aborting the job:\nTraceback (most recent call last):\n"
      '  File "t.py", line 9, in <module>\n    main()\nValueError: bad input: 3\n'
      "--------------------\nPrimary job  terminated normally, but 1 process returned\n",
      "ValueError: bad input: 3"),
     # the script does not parse: no traceback header
     ('  File "/w/t.py", line 2\n    def (\n        ^\nSyntaxError: invalid syntax\n',
      "SyntaxError: invalid syntax"),
     # two ranks' tracebacks, interleaved line by line: the first exception line wins
     ("Traceback (most recent call last):\nTraceback (most recent call last):\n"
      '  File "t.py", line 1\n  File "t.py", line 1\nKeyError: 3\nKeyError: 4\n', "KeyError: 3"),
     ("[1,0]<stderr>:Traceback (most recent call last):\n[1,0]<stderr>:  File \"t.py\"\n"
      "[1,0]<stderr>:mypkg.errors.Bad\n", "mypkg.errors.Bad"),  # --tag-output; no message
     # a kill, the watchdog: no Python error
     ("mpirun noticed that process rank 1 with PID 4242 on node a exited on signal 9 "
      "(Killed).\n", None),
     ("tfsift: rank 0 waited 3 s to receive the gradients of microbatch 1 from stage 1 "
      "(rank 1); aborting the job\n", None)],
)  # fmt: skip
def test_the_error_is_the_first_exception_line_a_rank_printed(text: str, error: str | None) -> None:
    assert watched(text) == error


def seen(text: str, returncode: int) -> Outcome:
    watch = ErrorWatch()
    for line in text.encode().splitlines(keepends=True):
        watch.seen(line)
    return watch.outcome(returncode)


def test_an_outcome_keeps_the_ranks_last_lines_and_mpiruns_report_masked() -> None:
    # two ranks' argparse errors, interleaved, then mpirun's report
    outcome = seen(f"{USAGE}\n{USAGE}\n{TYPO}\n\n{TYPO}\n" + mpirun_report(1, 2), 2)
    assert outcome == Outcome(
        2, None, (USAGE, TYPO, TYPO),
        ("Primary job  terminated normally, but # process returned",
         "a non-zero exit code. Per user-direction, the job has been aborted.",
         "mpirun detected that one or more processes exited with non-zero status, thus causing",
         "the job to be terminated. The first process to do so was:", "",
         "  Process name: [[#,#],#]", "  Exit code:    #"),
    )  # fmt: skip
    assert seen("tfsift: rank 0 waited 3 s for stage 1; aborting the job\n", 1).aborted


def test_only_the_same_status_and_the_same_python_error_repeat_identically() -> None:
    assert repeats(BUG, Outcome(1, "ZeroDivisionError: division by zero"))
    assert not repeats(None, BUG)  # the first failure: restart
    assert not repeats(BUG, Outcome(2, BUG.error))  # another status
    assert not repeats(BUG, Outcome(1, "ZeroDivisionError: float division by zero"))
    assert not repeats(KILLED, KILLED)  # from the machine: a restart is what it needs
    assert not repeats(Outcome(0, BUG.error), Outcome(0, BUG.error))  # not a failure


def test_an_attempt_that_saved_another_checkpoint_went_further_and_does_not_repeat() -> None:
    # a ConnectionResetError at a later step of each attempt stopped the restarts as
    # identical, though each attempt had saved checkpoints past the last one's
    log = "[tfsift rank 0] saved checkpoint runs/ckpt/ckpt-{}\n"
    error = 'Traceback (most recent call last):\n  File "t.py"\nConnectionResetError: reset\n'
    first = seen(log.format(0) + log.format(2) + error, 1)
    assert first.saved == "runs/ckpt/ckpt-2" and first.error == "ConnectionResetError: reset"
    assert not repeats(first, seen(log.format(4) + error, 1))  # went further: restart
    assert repeats(first, seen(log.format(2) + error, 1))  # no further: the same failure
    assert repeats(seen(error, 1), seen(error, 1))  # none saved in either


def test_a_status_the_script_chose_repeats_with_the_same_last_lines_and_report() -> None:
    typo = seen(f"{USAGE}\n{TYPO}\n{USAGE}\n{TYPO}\n" + mpirun_report(0, 2), 2)
    # the other rank first, its lines in another order: the same failure
    again = seen(f"{USAGE}\n{USAGE}\n{TYPO}\n{TYPO}\n" + mpirun_report(1, 2), 2)
    assert repeats(typo, again)
    silent = seen(mpirun_report(0, 3), 3)  # sys.exit(3) on every rank
    assert repeats(silent, seen(mpirun_report(1, 3), 3))
    assert not repeats(Outcome(3), Outcome(3))  # nothing printed: nothing to compare
    assert not repeats(typo, seen(f"{USAGE}\n{USAGE}\n" + mpirun_report(1, 2), 2))
    assert not repeats(silent, seen(mpirun_report(1, 4), 4))  # another status
    # a signal, or tfsift aborting the job (the watchdog): from the machine
    assert not repeats(Outcome(137, last=(TYPO,)), Outcome(137, last=(TYPO,)))
    stalled = seen("tfsift: rank 0 waited 3 s for stage 1; aborting the job\n", 1)
    assert not repeats(stalled, stalled)
    assert not repeats(BUG, Outcome(1, last=BUG.last))  # a Python error before, none now


def test_a_status_the_script_chose_is_not_said_to_be_a_kill() -> None:
    assert Outcome(2).describe() == f"exit code 2, {EXITED}"
    assert EXITED.startswith("no Python error: a rank exited with it (sys.exit, argparse)")
    aborted = Outcome(1, aborted=True)  # the watchdog's status
    assert (aborted.describe(), KILLED.describe()) == (
        f"exit code 1, {NO_ERROR}",
        f"exit code 137, {NO_ERROR}",
    )


def run_attempts(
    outcomes: list[Outcome], restart_count: int, **kwargs: object
) -> tuple[int, list[int], list[str]]:
    """``attempts`` over outcomes served in order: (its status, the attempts, its lines)."""
    launched: list[int] = []
    said: list[str] = []

    def launch(attempt: int) -> Outcome:
        launched.append(attempt)
        return outcomes[attempt]

    code = attempts(restart_count, launch, said.append, **kwargs)  # type: ignore[arg-type]
    return code, launched, said


def test_a_killed_attempt_is_restarted_and_the_restart_can_succeed() -> None:
    code, launched, said = run_attempts([KILLED, Outcome(0)], 1)
    assert (code, launched) == (0, [0, 1])
    assert said == [
        f"attempt 1 of 2 failed (exit code 137, {NO_ERROR}); starting attempt 2 of 2",
        "attempt 2 of 2 succeeded",
    ]


def test_a_failure_that_repeats_identically_stops_after_the_first_restart() -> None:
    code, launched, said = run_attempts([BUG, BUG, Outcome(0)], 5)
    assert (code, launched) == (1, [0, 1])
    assert said[-1] == (
        "attempt 2 of 6 failed as attempt 1 did (exit code 1, ZeroDivisionError: division by "
        "zero): a failure that repeats identically is in the script, not the machine; not "
        "restarting (4 of --restarts 5 unused)"
    )


def test_a_script_exiting_the_same_way_stops_after_the_first_restart() -> None:
    typo = Outcome(2, last=(USAGE, TYPO))
    code, launched, said = run_attempts([typo, typo, Outcome(0)], 3)
    assert (code, launched) == (2, [0, 1])
    assert said == [
        f"attempt 1 of 4 failed (exit code 2, {EXITED}); starting attempt 2 of 4",
        f"attempt 2 of 4 failed as attempt 1 did (exit code 2, no Python error, the same last "
        f"line {TYPO!r}): a failure that repeats identically is in the script, not the "
        "machine; not restarting (2 of --restarts 3 unused)",
    ]
    silent = Outcome(3, report=("  Exit code:    #",))
    assert run_attempts([silent, silent], 3)[2][-1] == (
        "attempt 2 of 4 failed as attempt 1 did (exit code 3, no Python error, the same report "
        "from mpirun): a failure that repeats identically is in the script, not the machine; "
        "not restarting (2 of --restarts 3 unused)"
    )


def test_failures_that_differ_or_come_from_the_machine_spend_every_restart() -> None:
    other = Outcome(1, "ValueError: x")
    code, launched, said = run_attempts([BUG, other, KILLED, KILLED], 3)
    assert (code, launched) == (137, [0, 1, 2, 3])
    assert (
        said[-1]
        == f"attempt 4 of 4 failed (exit code 137, {NO_ERROR}); no restarts left (--restarts 3)"
    )
    code, launched, said = run_attempts([BUG], 0)  # no restarts: nothing said
    assert (code, launched, said) == (1, [0], [])


def test_what_happens_before_a_restart_is_said_or_stops_the_run() -> None:
    def shrink(attempt: int) -> str:
        if attempt == 2:
            raise RuntimeError("1 rank reachable, fewer than --min-np 2")
        return "on a:2 with -np 2"

    code, launched, said = run_attempts([KILLED, KILLED], 3, before_restart=shrink)
    assert (code, launched) == (137, [0, 1])
    assert said == [
        f"attempt 1 of 4 failed (exit code 137, {NO_ERROR}); starting attempt 2 of 4 on a:2 "
        "with -np 2",
        f"attempt 2 of 4 failed (exit code 137, {NO_ERROR}); not restarting: 1 rank reachable, "
        "fewer than --min-np 2",
    ]


def test_docstring_examples_run() -> None:
    assert doctest.testmod(restarts).failed == 0


def tfsift_run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tfsift.cli", "run", *argv], env=mpi.environment(), cwd=mpi.ROOT,
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@pytest.mark.mpi
@pytest.mark.parametrize("differs", [False, True], ids=["same", "different"])
def test_a_real_launch_stops_a_repeated_error_and_restarts_a_new_one(
    tmp_path: Path, differs: bool
) -> None:
    script = tmp_path / "fails.py"  # no tfsift: a script that fails as it starts
    message = "f'bad input {os.environ[\"TFSIFT_RESTART_COUNT\"]}'" if differs else "'bad input'"
    script.write_text(f"import os\nraise ValueError({message})\n")
    done = tfsift_run("--restarts", "3", "-np", "1", str(script))
    assert done.returncode == 1, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("tfsift run:")]
    if differs:
        assert len(said) == 4, done.stderr
        assert said[-1] == (
            "tfsift run: attempt 4 of 4 failed (exit code 1, ValueError: bad input 3); no "
            "restarts left (--restarts 3)"
        )
    else:
        assert said == [
            "tfsift run: attempt 1 of 4 failed (exit code 1, ValueError: bad input); starting "
            "attempt 2 of 4",
            "tfsift run: attempt 2 of 4 failed as attempt 1 did (exit code 1, ValueError: bad "
            "input): a failure that repeats identically is in the script, not the machine; not "
            "restarting (2 of --restarts 3 unused)",
        ]


@pytest.mark.mpi
def test_a_real_launch_stops_a_script_that_exits_the_same_way(tmp_path: Path) -> None:
    script = tmp_path / "t.py"  # an argument misspelt: argparse exits 2 on every rank
    script.write_text(
        "import argparse\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--epochs', type=int)\nparser.parse_args()\n"
    )
    done = tfsift_run("--restarts", "3", "-np", "2", "python", str(script), "--epochz", "2")
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("tfsift run:")]
    assert said == [
        f"tfsift run: attempt 1 of 4 failed (exit code 2, {EXITED}); starting attempt 2 of 4",
        "tfsift run: attempt 2 of 4 failed as attempt 1 did (exit code 2, no Python error, the "
        "same last line 't.py: error: unrecognized arguments: --epochz 2'): a failure that "
        "repeats identically is in the script, not the machine; not restarting (2 of "
        "--restarts 3 unused)",
    ], done.stderr


def final_checkpoint(directory: Path, step: int) -> dict[str, dict[str, np.ndarray]]:
    """Every array of checkpoint ``step``'s files but each rank state's JSON tree (which
    holds timings)."""
    out = {}
    for path in sorted((directory / f"ckpt-{step}").glob("*.npz")):
        with np.load(path) as npz:
            out[path.name] = {k: npz[k] for k in npz.files if k != "__tree__"}
    return out


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_rank_killed_at_step_12_of_30_is_restarted_to_the_uninterrupted_weights(
    tmp_path: Path,
) -> None:
    args = ["2", "30", "5"]  # 2 stages, 30 steps, a checkpoint after every 5th
    whole = tmp_path / "whole"
    mpi.reports(mpi.run(2, "checkpoint_train.py", str(whole), *args))
    killed = tmp_path / "killed"
    script = str(mpi.SCRIPTS / "checkpoint_train.py")
    done = tfsift_run(
        "--restarts", "1", "-np", "2", script, str(killed), *args, "--kill-at", "12", timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("tfsift run:")]
    assert said == [
        f"tfsift run: attempt 1 of 2 failed (exit code 137, {NO_ERROR}); starting attempt 2 of 2",
        "tfsift run: attempt 2 of 2 succeeded",
    ], done.stderr[-3000:]
    # resumed from the last checkpoint before the kill
    assert f"restored checkpoint {killed}/ckpt-9\n" in done.stdout + done.stderr
    want, have = final_checkpoint(whole, 29), final_checkpoint(killed, 29)
    assert sorted(have) == sorted(want) and want
    for name, arrays in want.items():
        assert sorted(have[name]) == sorted(arrays), name
        differ = [k for k in arrays if not np.array_equal(arrays[k], have[name][k])]
        assert differ == [], name
