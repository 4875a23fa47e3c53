"""The ``tfsift`` logger: the rank in every line, INFO shown on rank 0 and warnings everywhere.

Library modules log to ``logging.getLogger("tfsift")`` and never configure it;
``configure(rank)``, called once per process by ``tfsift.init``, does:

- a filter on the logger gives every record a ``rank`` attribute (a format string of
  your own can use ``%(rank)s``);
- a handler on stderr writes ``[tfsift rank 1] message`` (``[tfsift rank 1] WARNING:
  message`` from warnings up), unless the root logger has handlers (``logging.basicConfig``
  or pytest's capture): the record reaches those through propagation, so writing it here
  as well would print it twice;
- the level, unless you set one yourself: INFO on rank 0, WARNING on the other ranks, so
  the plan and progress print once and a warning on any rank prints.

Calling it again (a second ``tfsift.init``) replaces the filter and handler and keeps a
level you set. Example::

    logging.getLogger("tfsift").setLevel(logging.DEBUG)  # every rank, debug lines too
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

LOGGER = "tfsift"


class RankFilter(logging.Filter):
    """Gives every record the ``rank`` attribute; lets every record through."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


class RankFormatter(logging.Formatter):
    """``[tfsift rank 1] message``, with the level name from WARNING up."""

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname}: " if record.levelno >= logging.WARNING else ""
        prefix = f"[tfsift rank {getattr(record, 'rank', '?')}] {level}"
        return prefix + super().format(record)


class RankHandler(logging.StreamHandler[TextIO]):
    """tfsift's stderr handler; silent while the root logger has handlers of its own.

    Args:
        rank: the rank written in every line.
        stream: where to write.
        level_set: the logger level ``configure`` chose with it (None: the user's).
    """

    def __init__(self, rank: int, stream: TextIO, level_set: int | None) -> None:
        super().__init__(stream)
        self.level_set = level_set
        self.addFilter(RankFilter(rank))  # records of child loggers too
        self.setFormatter(RankFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger(LOGGER).propagate and logging.getLogger().handlers:
            return  # the root's handlers print it; see the module docstring
        super().emit(record)


def configure(rank: int, stream: TextIO | None = None) -> logging.Logger:
    """Sets up the ``tfsift`` logger for ``rank``; harmless to call again.

    Example:
        >>> log = configure(rank=0)
        >>> log.info("profiling")  # stderr: [tfsift rank 0] profiling

    Args:
        rank: this process's global rank.
        stream: where the handler writes (default ``sys.stderr``, looked up when called).

    Returns:
        The ``tfsift`` logger.
    """
    log = logging.getLogger(LOGGER)
    ours = _level_set(log)
    _remove(log)
    if log.level in (logging.NOTSET, ours):  # not a level the user chose
        ours = logging.INFO if rank == 0 else logging.WARNING
        log.setLevel(ours)
    else:
        ours = None
    log.addFilter(RankFilter(rank))
    log.addHandler(RankHandler(rank, stream or sys.stderr, ours))
    return log


def reset() -> None:
    """Undoes ``configure``: its filter and handler go, and its level unless since changed."""
    log = logging.getLogger(LOGGER)
    ours = _level_set(log)
    _remove(log)
    if ours is not None and log.level == ours:
        log.setLevel(logging.NOTSET)


def _level_set(log: logging.Logger) -> int | None:
    handlers = [h for h in log.handlers if isinstance(h, RankHandler)]
    return handlers[-1].level_set if handlers else None


def _remove(log: logging.Logger) -> None:
    for f in [f for f in log.filters if isinstance(f, RankFilter)]:
        log.removeFilter(f)
    for h in [h for h in log.handlers if isinstance(h, RankHandler)]:
        log.removeHandler(h)
