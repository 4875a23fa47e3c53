"""``tfsift run``: mpirun flags pass through, TensorFlow's C++ start-up lines stay quiet."""

from __future__ import annotations

import doctest
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tfsift.cli import main, run
from tfsift.cli.run import RunArgs, command, environment, parse
from tfsift.parallel import launch

ROOT = Path(__file__).resolve().parents[3]
PY = sys.executable
DEFAULTS = ["mpirun", "-np", "2", "--bind-to", "none", "-x", "TF_CPP_MIN_LOG_LEVEL"]


@pytest.fixture
def a_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A train.py in the working directory: tfsift run launches only a script it finds."""
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def user_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user (not root) on 4 cores: mpirun_command adds neither root nor oversubscription."""
    monkeypatch.setattr(launch.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(launch.os, "cpu_count", lambda: 4)


def test_flags_before_the_script_go_to_mpirun_in_order() -> None:
    argv = ["-np", "4", "-H", "a:2,b:2", "--mca", "btl", "tcp,self", "train.py", "--out", "x.py"]
    assert parse(argv) == RunArgs(
        4, ("--host", "a:2,b:2", "--mca", "btl", "tcp,self"), ("train.py", "--out", "x.py")
    )


@pytest.mark.parametrize(
    "argv, expected",
    [(["-n", "2", "--", "-m", "pkg.train", "--lr", "3"],
      RunArgs(2, (), ("-m", "pkg.train", "--lr", "3"))),
     (["--hostfile", "hosts", "-np=3", "t.py"], RunArgs(3, ("--hostfile", "hosts"), ("t.py",))),
     (["-np", "2", "t.py", "--", "x"], RunArgs(2, (), ("t.py", "--", "x"))),
     # torchrun's and mpirun's users write the interpreter after --: it ran `python python`
     (["-np", "2", "--", "python", "t.py"], RunArgs(2, (), ("t.py",))),
     (["-np", "2", "--", "python3", "-m", "pkg"], RunArgs(2, (), ("-m", "pkg")))],
)  # fmt: skip
def test_the_script_is_the_first_py_file_or_what_follows_the_double_dash(
    argv: list[str], expected: RunArgs
) -> None:
    assert parse(argv) == expected


@pytest.mark.parametrize(
    "argv, message",
    [(["-np", "2"], "expected a script (the first argument ending in .py, or what follows -- or "
                    "python). Received: -np 2"),
     (["-np", "2", "python"], "expected a script (the first argument ending in .py, or what "
                              "follows -- or python). Received: -np 2 python"),
     (["-np", "3", "-H", "localhost:2", "python", "t.py"],
      "-np must not exceed the slots the hosts give (host:n gives n, a bare host 1; "
      "--oversubscribe allows more). Received: -np 3 exceeds the 2 slots given by "
      "-H localhost:2"),
     (["-np", "4", "-H", "a,b:2", "t.py"],
      "-np must not exceed the slots the hosts give (host:n gives n, a bare host 1; "
      "--oversubscribe allows more). Received: -np 4 exceeds the 3 slots given by -H a,b:2"),
     (["-np", "2", "--host=a:two", "t.py"], "--host takes host:n[,host:n], n >= 1. "
                                             "Received: --host a:two"),
     (["-H", "a:2", "t.py"], "-np N is required. Received: -H a:2 t.py"),
     (["-np", "zero", "t.py"], "-np must be an integer >= 1. Received: -np zero"),
     # the command starts at python: the flag had no value, and -H took the interpreter
     (["-np", "python", "t.py"],
      "-np must be followed by an integer >= 1. Received: -np followed by the command, "
      "python t.py"),
     (["-np", "2", "-H", "--", "python", "t.py"],
      "-H must be followed by host:n[,host:n]. Received: -H followed by the command, -- "
      "python t.py"),
     (["-np", "2", "--hostfile", "t.py"],
      "--hostfile must be followed by a hostfile. Received: --hostfile followed by the "
      "command, t.py")],
)  # fmt: skip
def test_bad_command_lines_say_what_is_wrong(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse(argv)
    assert str(err.value) == message


def test_restarts_and_min_np_are_tfsift_runs_own_flags(user_machine: None) -> None:
    argv = ["-np", "2", "--restarts", "2", "-H", "a:1,b:1", "--min-np=1", "t.py", "--restarts"]
    parsed = parse(argv)
    assert parsed == RunArgs(2, ("--host", "a:1,b:1"), ("t.py", "--restarts"), None, 2, 1)
    # the ranks learn the attempt, on every host
    assert command(parsed) == [*DEFAULTS, "-x", "TFSIFT_RESTART_COUNT", "--host", "a:1,b:1",
                               PY, "t.py", "--restarts"]  # fmt: skip


@pytest.mark.parametrize(
    "argv, message",
    [(["-np", "2", "--restarts", "-1", "t.py"],
      "--restarts must be an integer >= 0. Received: --restarts -1"),
     # silently no restarts before: the command starts at python
     (["-np", "2", "--restarts", "python", "t.py", "--epochs", "2"],
      "--restarts must be followed by an integer >= 0. Received: --restarts followed by the "
      "command, python t.py --epochs 2"),
     (["-np", "2", "--restarts", "1", "-H", "a:2", "--min-np", "t.py"],
      "--min-np must be followed by an integer >= 1. Received: --min-np followed by the "
      "command, t.py"),
     (["-np", "2", "--restarts", "1", "--min-np", "0", "-H", "a:2", "t.py"],
      "--min-np must be an integer >= 1. Received: --min-np 0"),
     (["-np", "2", "--min-np", "1", "-H", "a:2", "t.py"],
      "--min-np applies when a failed job is restarted: give --restarts N (N >= 1) too. "
      "Received: --min-np 1 without --restarts"),
     (["-np", "2", "--restarts", "1", "--min-np", "1", "t.py"],
      "--min-np relaunches on the hosts still reachable: name them with -H or --hostfile. "
      "Received: --min-np 1 without hosts"),
     (["-np", "2", "--restarts", "1", "--min-np", "4", "-H", "a:2,b:2", "t.py"],
      "--min-np must not exceed -np. Received: --min-np 4, -np 2")],
)  # fmt: skip
def test_bad_restart_flags_say_what_is_wrong(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse(argv)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "argv, tail",
    [(["-np", "2", "python", "train.py", "--lr", "3"], [PY, "train.py", "--lr", "3"]),
     (["-np", "2", "python3", "train.py"], [PY, "train.py"]),
     (["-np", "2", "python3.11", "-u", "train.py"], [PY, "-u", "train.py"]),
     (["-np", "2", "train.py"], [PY, "train.py"]),
     (["-np", "2", "python", "-m", "pkg.train", "--lr", "3"], [PY, "-m", "pkg.train", "--lr", "3"]),
     (["-np", "2", "-x", "A=1", "python", "t.py", "python"], ["-x", "A=1", PY, "t.py", "python"])],
)  # fmt: skip
def test_a_leading_python_means_tfsifts_own_interpreter(
    argv: list[str], tail: list[str], user_machine: None
) -> None:
    assert command(parse(argv)) == [*DEFAULTS, *tail]


def test_a_path_to_an_interpreter_is_used_as_given(tmp_path: Path, user_machine: None) -> None:
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    parsed = parse(["-np", "2", str(python), "train.py"])
    assert parsed == RunArgs(2, (), ("train.py",), str(python))
    assert command(parsed) == [*DEFAULTS, str(python), "train.py"]


@pytest.mark.parametrize(
    "argv, flags",
    [(["-np", "2", "-H", "localhost:2", "python", "t.py"], ["--host", "localhost:2"]),
     (["-np", "2", "--host=a:1,b", "t.py"], ["--host", "a:1,b"]),
     (["-np", "2", "-host", "a:1", "-H", "b:1", "t.py"], ["--host", "a:1", "--host", "b:1"]),
     (["-np", "2", "-H", "a:1", "--oversubscribe", "t.py"], ["--host", "a:1", "--oversubscribe"])],
)  # fmt: skip
def test_horovodrun_host_lists_go_to_mpirun_as_host(
    argv: list[str], flags: list[str], user_machine: None
) -> None:
    assert command(parse(argv)) == [*DEFAULTS, *flags, PY, "t.py"]


def test_command_puts_tfsift_defaults_then_the_users_flags_then_python() -> None:
    cmd = command(parse(["-np", "2", "--mca", "btl", "self,vader", "t.py", "a"]))
    assert cmd[:5] == ["mpirun", "-np", "2", "--bind-to", "none"]
    assert cmd[-8:] == ["-x", "TF_CPP_MIN_LOG_LEVEL", "--mca", "btl", "self,vader",
                        sys.executable, "t.py", "a"]  # fmt: skip


def test_hosts_turn_off_local_oversubscription_and_user_binding_wins() -> None:
    cmd = command(parse(["-np", "64", "-H", "a:32,b:32", "--bind-to", "core", "t.py"]))
    assert "--oversubscribe" not in cmd  # 64 ranks on a 2-core machine, but on two hosts
    assert cmd.count("--bind-to") == 1 and cmd[cmd.index("--bind-to") + 1] == "core"
    local = command(parse(["-np", "64", "--oversubscribe", "t.py"]))
    assert local.count("--oversubscribe") == 1


def test_the_ranks_get_quiet_tensorflow_unless_the_user_chose_a_level() -> None:
    assert environment({"PATH": "/bin"})["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert environment({"TF_CPP_MIN_LOG_LEVEL": "0"})["TF_CPP_MIN_LOG_LEVEL"] == "0"
    assert environment({})["OMPI_ALLOW_RUN_AS_ROOT"] == "1"


def test_main_launches_the_split_command(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[list[str], dict[str, str]]] = []
    popen = subprocess.Popen

    def launch(cmd: list[str], env: dict[str, str], **kwargs: Any) -> Any:
        calls.append((cmd, env))
        fake = [
            sys.executable,
            "-c",
            "import sys; sys.stderr.write('I0000 port.cc:1] x\\n'); sys.exit(3)",
        ]
        return popen(fake, env=env, **kwargs)

    monkeypatch.setattr(run.subprocess, "Popen", launch)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")  # a level of the user's: no filtering
    assert main(["run", "-np", "2", "-H", "a:1,b:1", "train.py", "--epochs", "1"]) == 3
    [(cmd, env)] = calls
    assert cmd == command(parse(["-np", "2", "-H", "a:1,b:1", "train.py", "--epochs", "1"]))
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "1"
    assert capfd.readouterr().err == "I0000 port.cc:1] x\n"


def test_mpirun_still_running_after_a_rank_aborted_the_job_is_ended_after_the_grace(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], a_script: None
) -> None:
    # as across hosts, when mpirun waits for the daemon of a host the network lost
    stuck = "tfsift: rank 0 waited 3 s for stage 1 (rank 1, host b); aborting the job\n"
    fake = [sys.executable, "-c", f"import sys, time; sys.stderr.write({stuck!r}); "
            "sys.stderr.flush(); time.sleep(60)"]  # fmt: skip
    monkeypatch.setattr(run, "command", lambda parsed: fake)
    monkeypatch.setenv("TFSIFT_EXIT_GRACE", "0.5")
    start = time.monotonic()
    assert main(["run", "-np", "2", "train.py"]) != 0
    assert time.monotonic() - start < 10
    assert capfd.readouterr().err == stuck + (
        "tfsift run: mpirun had not ended 0.5 s after a rank aborted the job (a host may be "
        "unreachable: its daemon never confirms); ending mpirun (TFSIFT_EXIT_GRACE sets the "
        "wait)\n"
    )


def test_mpirun_that_ends_after_an_abort_is_left_to_end(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], a_script: None
) -> None:
    line = "tfsift: rank 1 failed, aborting the job:\n"
    fake = [sys.executable, "-c", f"import sys; sys.stderr.write({line!r}); sys.exit(1)"]
    monkeypatch.setattr(run, "command", lambda parsed: fake)
    monkeypatch.setenv("TFSIFT_EXIT_GRACE", "0.3")
    assert main(["run", "-np", "2", "train.py"]) == 1
    time.sleep(0.5)  # past the grace: nothing more is said
    assert capfd.readouterr().err == line


NOISE = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1795442907.792739     969 port.cc:153] oneDNN custom operations are on. You "
    "may see slightly different numerical results due to floating-point round-off errors "
    "from different computation orders. To turn them off, set the environment variable "
    "`TF_ENABLE_ONEDNN_OPTS=0`.\n"
)


def test_the_quiet_default_drops_only_tensorflows_start_up_lines(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], a_script: None
) -> None:
    lines = NOISE + "a rank's own line\n" + NOISE + "WARNING: All log messages, and more\n"
    fake = [sys.executable, "-c", f"import sys; sys.stderr.write({lines!r}); sys.exit(4)"]
    monkeypatch.setattr(run, "command", lambda parsed: fake)
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    assert main(["run", "-np", "2", "train.py"]) == 4
    assert capfd.readouterr().err == "a rank's own line\nWARNING: All log messages, and more\n"


def test_help_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    assert "passing mpirun's own flags through" in capsys.readouterr().out
    assert main(["run"]) == 2
    capsys.readouterr()
    # usage errors end as argparse's do: the message, no traceback, exit code 2
    with pytest.raises(SystemExit) as exit_:
        main(["run", "-np", "2"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.startswith("tfsift run: expected a script")
    # a script that is not there: every rank printed Python's "can't open file"
    with pytest.raises(SystemExit) as exit_:
        main(["run", "-np", "2", "no_such_script.py"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        f"tfsift run: the script must be a file here. Received: no_such_script.py (from "
        f"{os.getcwd()})\n"
    )


@pytest.mark.parametrize("grace", ["abc", "0", "-1"])
def test_a_bad_exit_grace_is_refused_before_mpirun_starts(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    a_script: None,
    grace: str,
) -> None:
    launched: list[object] = []  # it started mpirun, then ended with a traceback
    monkeypatch.setattr(run.subprocess, "Popen", lambda *a, **k: launched.append(a))
    monkeypatch.setenv("TFSIFT_EXIT_GRACE", grace)
    with pytest.raises(SystemExit) as exit_:
        main(["run", "-np", "2", "train.py"])
    assert (exit_.value.code, launched) == (2, [])
    assert capsys.readouterr().err == (
        f"tfsift run: TFSIFT_EXIT_GRACE must be a number of seconds > 0. Received: {grace!r}\n"
    )


@pytest.mark.mpi
def test_a_real_launch_passes_flags_arguments_and_the_quiet_level(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(
        "import json, os, sys\n"
        "print(json.dumps([os.environ.get('TF_CPP_MIN_LOG_LEVEL'), os.environ.get('SEEN'),"
        " sys.argv[1:]]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-m", "tfsift.cli", "run", "-np", "1", "-x", "SEEN=yes",
         str(script), "--flag", "value"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == ["2", "yes", ["--flag", "value"]]


@pytest.mark.mpi
def test_a_real_launch_with_python_first_runs_the_script_on_every_rank(tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(
        "import json, os, sys\n"
        "print(json.dumps([os.environ['OMPI_COMM_WORLD_RANK'], sys.executable, sys.argv[1:]]))\n"
    )
    # as launched from a shell: tests before this one made pytest's process an MPI
    # singleton, whose PMIx variables make a child mpirun given --host exit 1 silently
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMIX_", "OMPI_"))}
    done = subprocess.run(
        [PY, "-m", "tfsift.cli", "run", "-np", "2", "-H", "localhost:2", "python", str(script),
         "--flag"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # mpirun forwards each rank's output in chunks: two ranks' lines may share one line
    found = re.findall(r'\["\d+", "[^"]*", \[[^\]]*\]\]', done.stdout)
    ranks = sorted(json.loads(record) for record in found)
    assert ranks == [["0", PY, ["--flag"]], ["1", PY, ["--flag"]]]


def test_docstring_examples_run() -> None:
    assert doctest.testmod(run).failed == 0


def test_descendants_are_the_whole_tree_below_a_process() -> None:
    parent = subprocess.Popen(["sh", "-c", "sh -c 'sleep 30' & sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 5
        while len(run.descendants(parent.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        below = run.descendants(parent.pid)
        names = sorted(Path(f"/proc/{pid}/comm").read_text().strip() for pid in below)
        assert names == ["sh", "sleep", "sleep"]  # a child's child too
    finally:
        for pid in run.descendants(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()


@pytest.mark.mpi
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_alone_ends_every_rank_and_no_restart(
    tmp_path: Path, sig: signal.Signals
) -> None:
    # a scheduler or supervisor signals the launcher's process alone: it ended at once and
    # left mpirun and every rank running until the script ended (a minute here)
    script = tmp_path / "sleeps.py"
    script.write_text(
        "import os, sys, time\n"
        "rank = os.environ['OMPI_COMM_WORLD_RANK']\n"
        "open(os.path.join(sys.argv[1], 'rank' + rank), 'w').write(str(os.getpid()))\n"
        "time.sleep(60)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMIX_", "OMPI_"))}
    launcher = subprocess.Popen(
        [PY, "-m", "tfsift.cli", "run", "-np", "2", "--restarts", "2", str(script),
         str(tmp_path)],
        cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    pids = [tmp_path / "rank0", tmp_path / "rank1"]
    deadline = time.monotonic() + 60
    while not all(p.exists() and p.read_text() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    launcher.send_signal(sig)  # the launcher alone: its own session, not its group
    _, stderr = launcher.communicate(timeout=30)
    assert launcher.returncode == 128 + sig
    assert stderr.splitlines()[-1] == (
        f"tfsift run: {sig.name} passed to mpirun, which ended the ranks; not restarting"
    )
    for pid in (int(p.read_text()) for p in pids):  # ended (a zombie at most)
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
