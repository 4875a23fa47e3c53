"""``tfsift run --restarts N``: relaunching a failed job, and telling a bug from a lost machine.

A job that fails (a rank exits non-zero or is killed, the watchdog ends it, a host drops)
is launched again, up to N times, as torchrun's ``--max-restarts`` does; the script
resumes from its last complete checkpoint. Each attempt's end is an ``Outcome``: the
launcher's exit status and the first Python exception a rank printed. A failure that
repeats identically (``repeats``) is a bug in the script, not the machine, and ends the
run after the first restart instead of burning the others::

    attempt 1 ─► failed ─► attempt 2 ─► failed the same way ─► stop, with the error
                               └─► failed another way, or no Python error ─► attempt 3 ...
"""

from __future__ import annotations

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
NO_ERROR = "no Python error: a rank was killed, the watchdog ended the job or a host was lost"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one attempt ended.

    Args:
        returncode: the launcher's exit status (negative: ended by that signal).
        error: the first line of the first Python exception a rank printed on stderr
            (``ZeroDivisionError: division by zero``: the type and the first line of
            the message), or None when no rank printed one.
    """

    returncode: int
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    def describe(self) -> str:
        """``exit code 1, ZeroDivisionError: division by zero``, for the messages (``killed
        by signal 9`` where the launcher was ended by one)."""
        code = self.returncode
        status = f"exit code {code}" if code >= 0 else f"killed by signal {-code}"
        return f"{status}, {self.error or NO_ERROR}"


def repeats(previous: Outcome | None, latest: Outcome) -> bool:
    """Whether ``latest`` failed identically to the attempt before it, ``previous``: both
    failed with the same exit status and the same Python error line. A failure without a
    Python error (a rank killed by a signal or the OOM killer, the watchdog ending a
    stalled job, a host lost) never repeats identically: it comes from the machine, and
    a restart is what it needs.

    Example:
        >>> bug = Outcome(1, "ZeroDivisionError: division by zero")
        >>> repeats(bug, Outcome(1, "ZeroDivisionError: division by zero"))
        True
        >>> repeats(Outcome(137), Outcome(137)), repeats(bug, Outcome(1, "ValueError: x"))
        (False, False)
    """
    if previous is None or not latest.failed or latest.error is None:
        return False
    return latest == previous


class ErrorWatch:
    """Finds the first Python exception in a job's stderr, shown one line at a time.

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

    def seen(self, line: bytes) -> None:
        if self.error is not None:
            return
        text = _TAG.sub("", line.decode("utf-8", "replace").rstrip("\r\n"), count=1)
        if text.startswith(_TRACEBACK):
            self._in_traceback = True
        elif self._in_traceback and _ERROR.fullmatch(text):
            self.error = text


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
                f"{number} failed as attempt {attempt} did ({outcome.describe()}): a failure "
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
