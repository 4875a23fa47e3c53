"""``tfsift run --restarts N``: relaunching a failed job, and telling a bug from a lost machine.

A job that fails (a rank exits non-zero or is killed, the watchdog ends it, a host drops)
is launched again, up to N times, as torchrun's ``--max-restarts`` does; the script
resumes from its last complete checkpoint. Each attempt's end is an ``Outcome``: the
launcher's exit status, the first Python exception a rank printed, and what the job
printed last. A failure that repeats identically (``repeats``) is a bug in the script, not
the machine, and ends the run after the first restart instead of burning the others::

    attempt 1 ─► failed ─► attempt 2 ─► failed the same way ─► stop, with what repeated
                               └─► failed another way, or killed ─► attempt 3 ...
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Callable

# Python's header of a traceback, and the first line of a syntax error's report (which has
# no header when the script itself does not parse)
_TRACEBACK = ("Traceback (most recent call last):", '  File "')
# An exception's last line: the type (dotted, unindented), then ": message" or nothing
_ERROR = re.compile(r"[A-Za-z_][\w.]*(: .*)?")
# What mpirun's --tag-output puts before each line of a rank's output
_TAG = re.compile(r"\[\d+,\d+\]<std(err|out)>:\s?")
# A rank's line when tfsift ends the job (the abort hook, the watchdog, the exit check)
ABORTING = re.compile(rb"tfsift: .*aborting the job")
# mpirun frames its own reports with lines of dashes; inside, the job id, the PIDs and the
# rank that ended first change from one launch to the next, so their numbers are masked
_RULE = re.compile(r"-{40,}")
_NUMBER = re.compile(r"\d+")
# rank 0's log line at each checkpoint a CheckpointManager saves (tfsift.checkpoint.manager)
_SAVED = re.compile(r"saved checkpoint (\S+)$")
TAIL = 3  # the ranks' last lines an attempt without a Python error is compared by
NO_ERROR = "no Python error: a rank was killed, the watchdog ended the job or a host was lost"
# an exit status below 128 is one a process chose (128 + n: killed by signal n)
EXITED = (
    "no Python error: a rank exited with it (sys.exit, argparse), the watchdog ended the "
    "job or a host was lost"
)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one attempt ended.

    Args:
        returncode: the launcher's exit status (negative: ended by that signal).
        error: the first line of the first Python exception a rank printed on stderr
            (``ZeroDivisionError: division by zero``: the type and the first line of
            the message), or None when no rank printed one.
        last: the last ``TAIL`` lines the ranks printed on stderr, outside mpirun's
            reports (``ap.py: error: unrecognized arguments: --epochz 2``).
        report: mpirun's reports on stderr, their numbers masked (``Exit code: #``).
        aborted: whether a rank said tfsift is aborting the job (the watchdog, a rank
            that exited while the others ran).
        saved: the last checkpoint the attempt logged as saved (``saved checkpoint
            runs/ckpt/ckpt-8``), or None: an attempt that saved one went further than the
            one before it, so its failure is not the same one repeating.
    """

    returncode: int
    error: str | None = None
    last: tuple[str, ...] = ()
    report: tuple[str, ...] = ()
    aborted: bool = False
    saved: str | None = None

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    @property
    def exited(self) -> bool:
        """Whether the status is one a process chose (``sys.exit(2)``), not a signal's."""
        return 0 < self.returncode < 128

    def describe(self) -> str:
        """``exit code 1, ZeroDivisionError: division by zero``, for the messages (``killed
        by signal 9`` where the launcher was ended by one)."""
        code = self.returncode
        status = f"exit code {code}" if code >= 0 else f"killed by signal {-code}"
        chosen = self.exited and not self.aborted  # a status the script chose, not tfsift's
        return f"{status}, {self.error or (EXITED if chosen else NO_ERROR)}"

    def repeated(self) -> str:
        """What an identical failure repeated, for the message that stops the run."""
        if self.error is not None:
            return self.describe()
        what = f"last line {self.last[-1]!r}" if self.last else "report from mpirun"
        return f"exit code {self.returncode}, no Python error, the same {what}"


def repeats(previous: Outcome | None, latest: Outcome) -> bool:
    """Whether ``latest`` failed identically to the attempt before it, ``previous``: both
    failed with the same exit status and the same Python error line; or, where no rank
    printed a Python error, with the same status a process chose (below 128: ``sys.exit``,
    argparse's 2), the same last lines from the ranks (in any order: ranks interleave) and
    the same reports from mpirun, with something printed. A failure ended by a signal (a
    rank killed, the OOM killer) or by tfsift aborting the job (the watchdog ending a
    stalled job, a host lost) never repeats identically: it comes from the machine, and a
    restart is what it needs. Nor does one whose attempt saved another checkpoint than the
    attempt before (``saved``): it went further, and a flaky error at a later step (a
    connection reset) is restarted while the run makes progress, as torchrun's are.

    Example:
        >>> bug = Outcome(1, "ZeroDivisionError: division by zero")
        >>> repeats(bug, Outcome(1, "ZeroDivisionError: division by zero"))
        True
        >>> repeats(Outcome(137), Outcome(137)), repeats(bug, Outcome(1, "ValueError: x"))
        (False, False)
        >>> typo = Outcome(2, last=("usage: t.py", "t.py: error: unrecognized arguments: -x"))
        >>> repeats(typo, typo), repeats(typo, Outcome(2))
        (True, False)
        >>> reset = Outcome(1, "ConnectionResetError: reset", saved="ckpt/ckpt-4")
        >>> repeats(reset, dataclasses.replace(reset, saved="ckpt/ckpt-8"))  # went further
        False
    """
    if previous is None or not latest.failed or latest.saved != previous.saved:
        return False
    if latest.error is not None:
        return (latest.returncode, latest.error) == (previous.returncode, previous.error)
    if not latest.exited or latest.aborted or not (latest.last or latest.report):
        return False
    return (
        previous.error is None
        and not previous.aborted
        and previous.returncode == latest.returncode
        and set(previous.last) == set(latest.last)
        and previous.report == latest.report
    )


class ErrorWatch:
    """Finds the first Python exception in a job's stderr, shown one line at a time, and
    what the job printed last (``outcome``).

    Example:
        >>> watch = ErrorWatch()
        >>> for line in [b"tfsift: rank 1 failed, aborting the job:\\n",
        ...              b"Traceback (most recent call last):\\n",
        ...              b'  File "t.py", line 3, in <module>\\n', b"    1 / 0\\n",
        ...              b"ZeroDivisionError: division by zero\\n"]:
        ...     watch.seen(line)
        >>> watch.error
        'ZeroDivisionError: division by zero'
    """

    def __init__(self) -> None:
        self.error: str | None = None
        self._in_traceback = False
        self._last: collections.deque[str] = collections.deque(maxlen=TAIL)
        # bounded: a rank's own lines of dashes would be taken for a report's frame
        self._report: collections.deque[str] = collections.deque(maxlen=50)
        self._in_report = False
        self._aborted = False
        self._saved: str | None = None

    def seen(self, line: bytes) -> None:
        text = _TAG.sub("", line.decode("utf-8", "replace").rstrip("\r\n"), count=1)
        saved = _SAVED.search(text)
        if saved:
            self._saved = saved.group(1)
        self._aborted = self._aborted or bool(ABORTING.search(line))
        if _RULE.fullmatch(text):
            self._in_report = not self._in_report
        elif self._in_report:
            self._report.append(_NUMBER.sub("#", text))
        elif text.strip():
            self._last.append(text)
        if self.error is not None:
            return
        if text.startswith(_TRACEBACK):
            self._in_traceback = True
        elif self._in_traceback and _ERROR.fullmatch(text):
            self.error = text

    def outcome(self, returncode: int) -> Outcome:
        """How the attempt whose lines were seen ended, with ``returncode``."""
        return Outcome(
            returncode,
            self.error,
            tuple(self._last),
            tuple(self._report),
            self._aborted,
            self._saved,
        )


def attempts(
    restarts: int,
    launch: Callable[[int], Outcome],
    say: Callable[[str], None],
    before_restart: Callable[[int], str | None] | None = None,
) -> int:
    """Runs ``launch(attempt)`` (attempt 0 the first) until it succeeds, its failure
    repeats identically, or ``restarts`` restarts are spent; returns the last exit status.

    ``before_restart(attempt)`` runs before each restart and returns what it changed, for
    the message (``tfsift run --min-np``: the hosts left), or raises ``RuntimeError`` to
    stop with its message. ``say`` prints one line on stderr.
    """
    total, previous = restarts + 1, None
    for attempt in range(total):
        outcome = launch(attempt)
        number = f"attempt {attempt + 1} of {total}"
        ended = f"{number} failed ({outcome.describe()})"
        if not outcome.failed:
            if attempt:
                say(f"{number} succeeded")
            return 0
        if repeats(previous, outcome):
            say(
                f"{number} failed as attempt {attempt} did ({outcome.repeated()}): a failure "
                f"that repeats identically is in the script, not the machine; not restarting "
                f"({total - attempt - 1} of --restarts {restarts} unused)"
            )
            return outcome.returncode
        if attempt + 1 == total:
            if restarts:
                say(f"{ended}; no restarts left (--restarts {restarts})")
            return outcome.returncode
        try:
            changed = before_restart(attempt + 1) if before_restart is not None else None
        except RuntimeError as err:
            say(f"{ended}; not restarting: {err}")
            return outcome.returncode
        where = f" {changed}" if changed else ""
        say(f"{ended}; starting attempt {attempt + 2} of {total}{where}")
        previous = outcome
    raise AssertionError("not reached: the last attempt returns")
