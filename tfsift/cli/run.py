"""``tfsift run``: launch a script under mpirun, passing mpirun's own flags through.

    tfsift run -np 4 -H a:2,b:2 --mca btl tcp,self python train.py --epochs 3
               └── mpirun flags (-np required) ──┘ └─┬──┘ └─ script, args ──┘
                                                  optional

The script is the first argument ending in ``.py``; anything else to run with Python
(``-m package.module``) goes after ``--`` or after ``python``. As with horovodrun, a
Python interpreter may come first: a bare ``python``, ``python3`` or ``python3.11`` means
the interpreter tfsift itself runs in (so the ranks import the same tfsift, whatever
``python`` the hosts' PATH finds); a path to one (``/opt/py/bin/python3``) is used as
given; with none, tfsift's own runs the script. ``-np N`` is required. horovodrun's
``-H host:n[,host:n]`` (or ``--host``) goes to mpirun as ``--host host:n,...`` (a bare
host is one slot), and ``-np`` must not exceed the slots it gives unless
``--oversubscribe`` is passed. tfsift adds what the machine needs
(``--allow-run-as-root`` as root, ``--oversubscribe`` for more local ranks
than cores unless hosts are given, ``--bind-to none`` unless given) and sets
``TF_CPP_MIN_LOG_LEVEL=2`` for the ranks (exported to every host with ``-x``; set it
yourself to choose another level). That hides TensorFlow's C++ INFO and WARNING lines
(the CPU feature guard; on GPUs the library loading and device lines). TensorFlow 2.21
writes two more lines through absl before its level applies ("All log messages before
absl::InitializeLog()" and oneDNN's notice, twice per rank); with the quiet default,
``tfsift run`` drops exactly those lines from the ranks' stderr as it forwards it, line by
line (``STARTUP_NOISE``). Everything else passes through unchanged. When a rank's line
says tfsift is aborting the job and mpirun is still running ``TFSIFT_EXIT_GRACE`` seconds
later (across hosts it waits for the daemon of a host the network lost), ``tfsift run``
ends mpirun and its children, saying so.

``--restarts N`` (tfsift run's own flag, torchrun's ``--max-restarts``): when the job
fails (a rank exits non-zero or is killed, the watchdog ends it, a host drops), the same
command is launched again, up to N times, with ``TFSIFT_RESTART_COUNT`` (0, 1, ...) set
for the ranks; the script resumes from its last complete checkpoint (CheckpointManager,
tfsift.callbacks.BackupAndRestore). Each end is one line on stderr, ``tfsift run: attempt
1 of 3 failed (exit code 137, ...); starting attempt 2 of 3``. A failure that repeats
identically, with the same exit code and the same first Python error line (``ValueError:
...``, the first exception a rank printed) or, without one, the same exit code a rank
chose (below 128) and the same last lines, is a bug in the script: it stops the run after
the first restart. Ctrl-C stops it too, and a SIGINT, SIGTERM or SIGHUP sent to
``tfsift run`` alone is passed to mpirun, which ends every rank (docs/failures.md,
Restarts).

``--min-np M`` (with ``--restarts`` and hosts): before each restart, every host is probed
with ssh, and the job is relaunched on those that answer, with the largest multiple of M
ranks their slots and ``-np`` allow (at least M; all the hosts and ``-np`` again once they
all answer). The script, restarted on fewer replicas, restores its checkpoint into that
layout; ``tfsift.from_arrays(..., global_batch_size=G)`` keeps the global batch and the
place in the epoch (docs/cluster.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from tfsift.cli import hosts, restarts, shrink
from tfsift.env import TFSIFT_EXIT_GRACE, TFSIFT_RESTART_COUNT, exit_grace
from tfsift.parallel.launch import mpirun_command, stat_fields

# TensorFlow's C++ log threshold: 2 hides INFO and WARNING (the start-up lines), keeps
# errors. Read by TensorFlow, not by tfsift, so it is named here rather than in env.py.
TF_CPP_MIN_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
QUIET_TF = "2"
# What TensorFlow 2.21 prints through absl before TF_CPP_MIN_LOG_LEVEL applies (twice
# per process); matched whole, so that nothing else is ever dropped.
STARTUP_NOISE = (
    re.compile(
        rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written "
        rb"to STDERR\r?\n?"
    ),
    re.compile(rb"I\d{4} [\d:.]+ +\d+ port\.cc:\d+\] oneDNN custom operations are on\. .*\r?\n?"),
)


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow in this process as ``tfsift run`` has its ranks do it: at
    ``TF_CPP_MIN_LOG_LEVEL=2`` unless set, and at a level of 2 or more without the
    ``STARTUP_NOISE`` lines absl writes to file descriptor 2 during the import (for the
    commands that import TensorFlow themselves: ``doctor``, ``profile``). Anything else
    written there is passed on unchanged."""
    if "tensorflow" in sys.modules:
        return
    os.environ.setdefault(TF_CPP_MIN_LOG_LEVEL, QUIET_TF)
    if os.environ[TF_CPP_MIN_LOG_LEVEL] not in ("2", "3"):
        import tensorflow

        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:  # a file: a pipe could fill and block
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read()
    for pattern in STARTUP_NOISE:
        text = pattern.sub(b"", text)
    if text:
        os.write(2, text)


_NP = ("-np", "-n", "--np", "-c")
_HOSTS = ("-H", "-host", "--host", "-hostfile", "--hostfile", "-machinefile", "--machinefile")
_HOST_LISTS = ("-H", "-host", "--host")  # the flags that list hosts with their slots
_SWITCHES = ("--oversubscribe", "--allow-run-as-root")  # mpirun_command's flags without values
# What names a Python interpreter as the first word of the command, as horovodrun users type it.
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")
_RESTARTS, _MIN_NP = "--restarts", "--min-np"  # tfsift run's own flags, not mpirun's
# What each of the flags tfsift run reads itself takes, for the message when none follows
_VALUES = {
    **dict.fromkeys(_NP, "an integer >= 1"),
    _RESTARTS: "an integer >= 0",
    _MIN_NP: "an integer >= 1",
    **dict.fromkeys(_HOSTS, "a hostfile"),
    **dict.fromkeys(_HOST_LISTS, "host:n[,host:n]"),
}
_USAGE = (
    "tfsift run -np N [-H HOST:N,...] [--restarts N [--min-np N]] [MPIRUN FLAGS] [python] "
    "SCRIPT.py [ARGS] | tfsift run -np N [FLAGS] [python | --] -m MODULE"
)


@dataclasses.dataclass(frozen=True)
class RunArgs:
    """A ``tfsift run`` command line, split.

    Args:
        np: the number of ranks.
        mpirun_flags: every other argument before the script, in order, for mpirun.
        script: the script and its arguments (or ``-m module ...``), for Python.
        python: the path of the interpreter the user named, or None for tfsift's own.
        restarts: ``--restarts``: how many times a failed job is launched again.
        min_np: ``--min-np``: relaunch on the hosts still reachable, with at least this
            many ranks (None: always on the hosts given).
    """

    np: int
    mpirun_flags: tuple[str, ...]
    script: tuple[str, ...]
    python: str | None = None
    restarts: int = 0
    min_np: int | None = None

    @property
    def hosts_given(self) -> bool:
        """Whether the flags name hosts (then the local core count says nothing)."""
        return any(flag.split("=")[0] in _HOSTS for flag in self.mpirun_flags)


def add_subcommand(commands: Any) -> None:
    """Registers ``run``; it takes its arguments raw, since mpirun's flags are open-ended."""
    cmd = commands.add_parser(
        "run",
        help="launch a training script with mpirun (-np N, mpirun flags, then the script)",
        usage=_USAGE,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        # '+' so that argparse claims none of mpirun's '-' flags; -h is handled in `run`.
        prefix_chars="+",
        add_help=False,
    )
    cmd.add_argument("argv", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    cmd.set_defaults(func=run, run_parser=cmd)


def run(args: argparse.Namespace) -> int:
    """Launches the job (again after a failure, up to ``--restarts`` times) and returns
    mpirun's exit code of the last attempt."""
    if not args.argv or args.argv[0] in ("-h", "--help"):
        args.run_parser.print_help()
        return 0 if args.argv else 2
    try:
        parsed = parse(args.argv)
        # read before mpirun starts: a bad value ended the launcher with a traceback after it
        grace = exit_grace()
    except ValueError as err:
        refuse(str(err))
    script = parsed.script[0]
    if script.endswith(".py") and not parsed.hosts_given and not os.path.isfile(script):
        # every rank would print Python's "can't open file" (on other hosts it may exist)
        refuse(f"the script must be a file here. Received: {script} (from {os.getcwd()})")
    env = environment(os.environ)
    # the user chose a level: all of it
    quiet = env[TF_CPP_MIN_LOG_LEVEL] == QUIET_TF and TF_CPP_MIN_LOG_LEVEL not in os.environ

    given = shrink.Layout(parsed.np, parsed.mpirun_flags)
    current = given

    def launch(attempt: int) -> restarts.Outcome:
        if parsed.restarts:
            env[TFSIFT_RESTART_COUNT] = str(attempt)
        where = dataclasses.replace(parsed, np=current.np, mpirun_flags=current.mpirun_flags)
        return launch_once(where, env, quiet, grace)

    def before_restart(attempt: int) -> str | None:
        nonlocal current
        if parsed.min_np is None:
            return None
        shrunk = current != given
        current, said = shrink.relaunch(given, parsed.min_np)
        return said or (f"on every host given again, with -np {given.np}" if shrunk else None)

    try:
        return restarts.attempts(parsed.restarts, launch, say, before_restart)
    except KeyboardInterrupt:
        say("interrupted; not restarting")
        return 130
    except Interrupted as stop:
        say(
            f"{signal.Signals(stop.signum).name} passed to mpirun, which ended the ranks; "
            "not restarting"
        )
        return 128 + stop.signum


# The signals a supervisor or a scheduler sends the launcher alone (Slurm's scancel,
# systemd, a timeout): passed on to mpirun, which ends every rank, as torchrun ends its
# workers. A terminal's Ctrl-C reaches mpirun and the ranks themselves too.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(Exception):
    """The launcher received ``signum`` (one of ``FORWARDED``) and mpirun has ended."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def launch_once(
    parsed: RunArgs, env: Mapping[str, str], quiet: bool, grace: float
) -> restarts.Outcome:
    """Runs mpirun once, forwarding the ranks' stderr; how it ended. ``grace``: the seconds
    ``LingerGuard`` and ``outlived`` wait (``TFSIFT_EXIT_GRACE``).

    Raises:
        Interrupted: a ``FORWARDED`` signal arrived; it was passed to mpirun, which ended.
    """
    watch = restarts.ErrorWatch()
    with subprocess.Popen(command(parsed), env=env, stderr=subprocess.PIPE) as proc:
        assert proc.stderr is not None
        ender = LingerGuard(proc, grace)

        def seen(line: bytes) -> None:
            ender.seen(line)
            # its timestamps and PIDs would make two identical failures differ
            if not any(pattern.fullmatch(line) for pattern in STARTUP_NOISE):
                watch.seen(line)

        with passed_on(proc) as received:
            forward(proc.stderr, sys.stderr.buffer, quiet=quiet, seen=seen)
            proc.wait()
    ender.cancel()
    if received:
        outlived(received.ranks, grace)
        raise Interrupted(received[0])
    return watch.outcome(proc.returncode)


class Received(list[int]):
    """The signals ``passed_on`` received, and mpirun's processes below it at the first."""

    def __init__(self) -> None:
        super().__init__()
        self.ranks: list[int] = []


def outlived(pids: Sequence[int], grace: float) -> None:
    """Waits up to ``grace`` seconds for ``pids`` (mpirun's ranks and daemons, which end
    shortly after mpirun passes a signal on) to end, then ends those left with SIGKILL: a
    supervisor that relaunches at once must not meet the last job's ranks."""
    deadline = time.monotonic() + grace
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if _running(pid)]
    kill(alive)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is no zombie (ended, not yet reaped)."""
    fields = stat_fields(pid)
    return fields is not None and fields[:1] != ["Z"]


def kill(pids: Sequence[int], proc: Any = None) -> None:
    """SIGKILL to each of ``pids`` still there, then to ``proc`` (a ``Popen``) if given."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if proc is not None:
        with contextlib.suppress(OSError):
            proc.kill()


@contextlib.contextmanager
def passed_on(proc: Any) -> Any:
    """Passes each ``FORWARDED`` signal the launcher receives to ``proc`` (mpirun) instead
    of ending the launcher, which left mpirun and every rank running; a second one ends
    mpirun and its children at once (SIGKILL), as a second Ctrl-C does mpirun's. Yields
    the signals received, in order; the former handlers come back after the block."""
    received = Received()

    def handle(signum: int, _: Any) -> None:
        received.append(signum)
        if len(received) == 1:
            received.ranks = descendants(proc.pid)  # mpirun may end before they do
            with contextlib.suppress(OSError):
                proc.send_signal(signum)
            return
        kill(descendants(proc.pid), proc)

    former = {sig: signal.signal(sig, handle) for sig in FORWARDED}
    try:
        yield received
    finally:
        for sig, handler in former.items():
            signal.signal(sig, handler)


def refuse(message: str) -> NoReturn:
    """Ends ``tfsift run`` before it launches anything, as argparse ends on a usage error:
    the message on stderr, no traceback, exit code 2."""
    say(message)
    raise SystemExit(2)


def say(message: str) -> None:
    """One line of ``tfsift run``'s own on stderr, among the ranks' lines."""
    sys.stderr.write(f"tfsift run: {message}\n")
    sys.stderr.flush()


ABORTING = restarts.ABORTING  # a rank's line when tfsift ends the job


class LingerGuard:
    """Ends mpirun if it is still running ``grace`` seconds after a rank aborted the job.

    ``MPI_Abort`` makes mpirun kill every rank and exit, but across hosts mpirun first
    waits for each host's daemon to confirm: a daemon on a host the network lost never
    does, and mpirun would wait for it (TCP gives up after many minutes) though every
    rank has ended (each rank's own timeout ends it). ``tfsift run`` sees the abort line
    and, ``grace`` seconds later, ends mpirun, saying so.
    """

    def __init__(self, proc: Any, grace: float) -> None:
        self.proc, self.grace = proc, grace
        self._timer: threading.Timer | None = None

    def seen(self, line: bytes) -> None:
        if self._timer is None and ABORTING.search(line):
            self._timer = threading.Timer(self.grace, self._end)
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _end(self) -> None:
        if self.proc.poll() is not None:
            return
        say(
            f"mpirun had not ended {self.grace:g} s after a rank aborted the job "
            f"(a host may be unreachable: its daemon never confirms); ending mpirun "
            f"({TFSIFT_EXIT_GRACE} sets the wait)"
        )
        # its children first (the ssh to the lost host, local daemons): they hold the
        # output pipes open, and nothing else would end them
        kill(descendants(self.proc.pid), self.proc)


def descendants(pid: int) -> list[int]:
    """The processes below ``pid``, from Linux's /proc (none elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = stat_fields(entry.name)
        if fields is not None:  # None: ended meanwhile
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def forward(
    source: Any, sink: Any, *, quiet: bool = True, seen: Callable[[bytes], None] | None = None
) -> None:
    r"""Copies ``source`` to ``sink`` line by line, without TensorFlow's start-up noise
    (with it if not ``quiet``), showing each line to ``seen`` first.

    Example:
        >>> import io
        >>> out = io.BytesIO()
        >>> noise = b"WARNING: All log messages before absl::InitializeLog() is called"
        >>> noise += b" are written to STDERR\n"
        >>> forward(io.BytesIO(noise + b"Traceback\n"), out)
        >>> out.getvalue()
        b'Traceback\n'
    """
    for line in source:
        if seen is not None:
            seen(line)
        if not quiet or not any(pattern.fullmatch(line) for pattern in STARTUP_NOISE):
            sink.write(line)
            sink.flush()


def parse(argv: Sequence[str]) -> RunArgs:
    """Splits ``-np N [mpirun flags] [python] script.py [args]`` (or ``... -- -m module``).

    Example:
        >>> parse(["-np", "2", "-H", "a:2", "python", "t.py", "-v"])  # doctest: +ELLIPSIS
        RunArgs(np=2, mpirun_flags=('--host', 'a:2'), script=('t.py', '-v'), python=None, ...)
        >>> parse(["--restarts", "3", "-np", "2", "t.py"]).restarts
        3

    Raises:
        ValueError: no script, no valid ``-np``, more ranks than the ``-H`` slots,
            ``--restarts``/``--min-np`` without a valid value or the flags they need, or a
            flag tfsift reads with the command right after it.
    """
    flags, python, script = _split_command(list(argv))
    _check_last_flag(flags, argv[len(flags) :])
    values: dict[str, int] = {}
    rest: list[str] = []
    i = 0
    while i < len(flags):
        name, eq, value = flags[i].partition("=")
        key = "-np" if name in _NP else name
        if key not in ("-np", _RESTARTS, _MIN_NP):
            rest.append(flags[i])
        else:  # a value follows: _check_last_flag
            values[key] = _count(key, value if eq else flags[i + 1], 0 if key == _RESTARTS else 1)
            i += 0 if eq else 1
        i += 1
    if "-np" not in values:
        raise ValueError(f"-np N is required. Received: {' '.join(argv)}")
    np = values["-np"]
    rest, lists = _hosts(rest)
    _check_slots(np, lists, rest)
    parsed = RunArgs(
        np, tuple(rest), tuple(script), python, values.get(_RESTARTS, 0), values.get(_MIN_NP)
    )
    _check_restarts(parsed)
    return parsed


def command(parsed: RunArgs) -> list[str]:
    """The mpirun command line: tfsift's defaults, the user's flags, then Python and the script.

    A default the user's flags already set (``--bind-to``, ``--oversubscribe``) is left
    out, and so is ``--oversubscribe`` when hosts are given.
    """
    *launcher, python = mpirun_command(parsed.np, [])
    given = {flag.split("=")[0].replace("--", "-") for flag in parsed.mpirun_flags}
    if "-bind-to" in given:
        at = launcher.index("--bind-to")
        del launcher[at : at + 2]
    dropped = {f for f in _SWITCHES if f.replace("--", "-") in given}
    dropped |= {"--oversubscribe"} if parsed.hosts_given else set()
    launcher = [f for f in launcher if f not in dropped]
    export = ["-x", TF_CPP_MIN_LOG_LEVEL]
    export += ["-x", TFSIFT_RESTART_COUNT] if parsed.restarts else []
    return [*launcher, *export, *parsed.mpirun_flags, parsed.python or python, *parsed.script]


def environment(base: Mapping[str, str]) -> dict[str, str]:
    """The ranks' environment: ``base``, allowed to run as root, TensorFlow's C++ start-up
    logging quiet unless ``base`` sets ``TF_CPP_MIN_LOG_LEVEL``."""
    env = dict(base, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.setdefault(TF_CPP_MIN_LOG_LEVEL, QUIET_TF)
    return env


def _split_command(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """``argv`` as mpirun's flags, the interpreter the user named (a path, or None) and
    what Python runs: the command starts at ``--``, a ``.py`` file or a Python interpreter."""
    at = next((i for i, arg in enumerate(argv) if _starts_command(arg)), len(argv))
    flags, rest = argv[:at], argv[at:]
    if rest[:1] == ["--"]:  # what follows, an interpreter first too (`-- python t.py`)
        rest = rest[1:]
    named = rest[0] if rest and _is_python(rest[0]) else None
    script = rest[1:] if named else rest
    if not script:
        raise ValueError(
            "expected a script (the first argument ending in .py, or what follows -- or "
            f"python). Received: {' '.join(argv) or 'nothing'}"
        )
    return flags, named if named and os.sep in named else None, script


def _starts_command(arg: str) -> bool:
    return arg == "--" or arg.endswith(".py") or _is_python(arg)


def _is_python(arg: str) -> bool:
    """A bare ``python``/``python3``/``python3.11``, or a path to an executable named so."""
    if not _PYTHON.fullmatch(os.path.basename(arg)):
        return False
    return os.sep not in arg or (os.path.isfile(arg) and os.access(arg, os.X_OK))


def _check_last_flag(flags: Sequence[str], command: Sequence[str]) -> None:
    """Refuses a flag of tfsift run's own with the command right after it: the command
    starts at a ``.py``, ``python`` or ``--``, so ``--restarts python t.py`` left
    ``--restarts`` without a value, and the job ran without restarts (``-H`` would have
    taken the interpreter as its hosts)."""
    flag = flags[-1] if flags else ""
    if flag in _VALUES:
        raise ValueError(
            f"{flag} must be followed by {_VALUES[flag]}. Received: {flag} followed by the "
            f"command, {' '.join(command)}"
        )


def _hosts(flags: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """``flags`` with each ``-H``/``-host``/``--host`` list passed as ``--host LIST``, and
    those lists as (the flag the user wrote, the list)."""
    out: list[str] = []
    lists: list[tuple[str, str]] = []
    i = 0
    while i < len(flags):
        name, eq, value = flags[i].partition("=")
        if name in _HOST_LISTS and (eq or i + 1 < len(flags)):
            lists.append((name, value if eq else flags[i + 1]))
            out += ["--host", lists[-1][1]]
            i += 0 if eq else 1
        else:
            out.append(flags[i])
        i += 1
    return out, lists


def _check_slots(np: int, lists: list[tuple[str, str]], flags: Sequence[str]) -> None:
    """Refuses more ranks than the host lists give slots (``host:n`` is n, a bare host 1),
    as horovodrun does, unless ``--oversubscribe`` asks for more."""
    if not lists or {"-oversubscribe", "--oversubscribe"} & set(flags):
        return
    slots = sum(h.slots for name, text in lists for h in hosts.parse_list(text, name))
    if np > slots:
        given = " ".join(f"{name} {text}" for name, text in lists)
        raise ValueError(
            "-np must not exceed the slots the hosts give (host:n gives n, a bare host 1; "
            f"--oversubscribe allows more). Received: -np {np} exceeds the {slots} slots "
            f"given by {given}"
        )


def _check_restarts(parsed: RunArgs) -> None:
    """``--min-np`` shrinks a restarted job onto the hosts left: it needs restarts, hosts,
    and at most ``-np`` ranks."""
    if parsed.min_np is None:
        return
    if not parsed.restarts:
        raise ValueError(
            f"{_MIN_NP} applies when a failed job is restarted: give --restarts N (N >= 1) "
            f"too. Received: {_MIN_NP} {parsed.min_np} without --restarts"
        )
    if not parsed.hosts_given:
        raise ValueError(
            f"{_MIN_NP} relaunches on the hosts still reachable: name them with -H or "
            f"--hostfile. Received: {_MIN_NP} {parsed.min_np} without hosts"
        )
    if parsed.min_np > parsed.np:
        raise ValueError(
            f"{_MIN_NP} must not exceed -np. Received: {_MIN_NP} {parsed.min_np}, -np {parsed.np}"
        )


def _count(flag: str, text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise ValueError(f"{flag} must be an integer >= {least}. Received: {flag} {text}")
    return value
