"""The tfsift logger: rank-tagged lines, INFO on rank 0 only, and idempotent set-up."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from tfsift import logs


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> Iterator[logging.Logger]:
    """The tfsift logger, not propagating to the root's handlers (pytest's capture)."""
    logger = logging.getLogger("tfsift")
    monkeypatch.setattr(logger, "propagate", False)
    level = logger.level
    logger.setLevel(logging.NOTSET)
    yield logger
    logs.reset()
    logger.setLevel(level)


def test_rank_zero_shows_info_and_every_line_names_the_rank(log: logging.Logger) -> None:
    out = io.StringIO()
    logs.configure(0, out)
    log.info("profiling %d nodes", 4)
    log.warning("slow")
    assert out.getvalue() == "[tfsift rank 0] profiling 4 nodes\n[tfsift rank 0] WARNING: slow\n"


def test_other_ranks_show_warnings_only(log: logging.Logger) -> None:
    out = io.StringIO()
    logs.configure(3, out)
    log.info("plan")
    log.error("broken")
    logging.getLogger("tfsift.planning").warning("child")  # a child logger gets the rank too
    assert out.getvalue() == "[tfsift rank 3] ERROR: broken\n[tfsift rank 3] WARNING: child\n"


def test_configuring_twice_prints_each_line_once(log: logging.Logger) -> None:
    first, second = io.StringIO(), io.StringIO()
    logs.configure(0, first)
    logs.configure(0, second)
    log.info("once")
    assert (first.getvalue(), second.getvalue()) == ("", "[tfsift rank 0] once\n")
    assert len(log.handlers) == 1 and len(log.filters) == 1


def test_a_level_the_user_set_is_kept(log: logging.Logger) -> None:
    out = io.StringIO()
    log.setLevel(logging.DEBUG)
    logs.configure(1, out)
    logs.configure(1, out)
    log.debug("detail")
    assert out.getvalue() == "[tfsift rank 1] detail\n"
    logs.reset()
    assert log.level == logging.DEBUG and log.handlers == []


def test_reset_undoes_configure(log: logging.Logger) -> None:
    logs.configure(1, io.StringIO())
    assert log.level == logging.WARNING
    logs.reset()
    assert (log.level, log.handlers, log.filters) == (logging.NOTSET, [], [])


def test_with_root_handlers_lines_go_there_once_carrying_the_rank(
    log: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = io.StringIO(), io.StringIO()
    root = logging.StreamHandler(theirs)
    root.setFormatter(logging.Formatter("%(rank)s|%(levelname)s|%(message)s"))
    monkeypatch.setattr(log, "propagate", True)
    logging.getLogger().addHandler(root)  # as logging.basicConfig does
    try:
        logs.configure(2, ours)
        log.warning("hello")
    finally:
        logging.getLogger().removeHandler(root)
    assert (ours.getvalue(), theirs.getvalue()) == ("", "2|WARNING|hello\n")


def test_no_log_message_repeats_the_prefix_the_handler_writes() -> None:
    """``[tfsift rank 0] tfsift: saved checkpoint``: the handler names tfsift already."""
    import ast
    from pathlib import Path

    root = Path(logs.__file__).parent
    doubled = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("debug", "info", "warning", "error", "exception")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).startswith("tfsift: ")
            ):
                doubled.append(f"{path.relative_to(root)}:{node.lineno}")
    assert doubled == []
