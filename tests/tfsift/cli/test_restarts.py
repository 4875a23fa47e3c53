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
from tfsift.cli.restarts import NO_ERROR, ErrorWatch, Outcome, attempts, repeats

KILLED = Outcome(137)  # mpirun's status when it saw a rank die of SIGKILL
BUG = Outcome(1, "ZeroDivisionError: division by zero")


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


def test_only_the_same_status_and_the_same_python_error_repeat_identically() -> None:
    assert repeats(BUG, Outcome(1, "ZeroDivisionError: division by zero"))
    assert not repeats(None, BUG)  # the first failure: restart
    assert not repeats(BUG, Outcome(2, BUG.error))  # another status
    assert not repeats(BUG, Outcome(1, "ZeroDivisionError: float division by zero"))
    assert not repeats(KILLED, KILLED)  # from the machine: a restart is what it needs
    assert not repeats(Outcome(0, BUG.error), Outcome(0, BUG.error))  # not a failure


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
