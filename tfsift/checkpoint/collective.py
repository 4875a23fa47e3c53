"""Ranks that decide together: one rank's result (or error) for all, or everyone's or nobody's.

Every checkpoint operation is collective, and an error on one rank must become the same
error on every rank, never a rank left waiting in the next collective. A rank that never
comes (stalled, or on a host the network lost) ends the job after the config's ``timeout``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from tfsift.checkpoint.files import CheckpointError
from tfsift.parallel import watchdog

T = TypeVar("T")
Outcome = tuple[str, Any, str]  # ("ok", value, "") or ("error", kind, message)
_KINDS: dict[str, type[Exception]] = {
    "CheckpointError": CheckpointError,
    "ValueError": ValueError,
    "TypeError": TypeError,
    # a format whose package is not installed (an ONNX export): what Keras raises
    "ImportError": ImportError,
    "ModuleNotFoundError": ModuleNotFoundError,
}


def on_root(comm: Any, fn: Callable[[], T]) -> T:
    """Runs ``fn`` on rank 0 of ``comm``; every rank returns its result or raises its error."""
    outcome: Outcome | None = None
    local = None
    if comm.Get_rank() == 0:
        outcome, local = _attempt(fn, 0)
    if comm.Get_size() > 1:
        with bounded():
            outcome = comm.bcast(outcome, root=0)
    assert outcome is not None
    return _unwrap([outcome], local)[0]  # type: ignore[no-any-return]


def together(comm: Any, fn: Callable[[], T]) -> T:
    """Runs ``fn`` on every rank and returns this rank's result, or raises the first
    failure, naming its rank, on every rank."""
    mine, local = _attempt(fn, comm.Get_rank())
    value = mine[1]
    status = (mine[0], mine[1] if mine[0] == "error" else None, mine[2])
    if comm.Get_size() > 1:
        with bounded():
            statuses = comm.allgather(status)
    else:
        statuses = [status]
    _unwrap(statuses, local)
    return value  # type: ignore[no-any-return]


def bounded() -> Any:
    """A guard for a blocking checkpoint collective: the job ends, naming this rank, if the
    other ranks have not all joined it within the config's ``timeout`` (none without
    ``tfsift.init``: a communicator the caller made)."""
    return watchdog.bounded(
        lambda: (
            "the other ranks to join a checkpoint operation (every rank must call a save, "
            "a restore or an export; a rank did not, stalled, or its host cannot be reached)"
        )
    )


def _attempt(fn: Callable[[], Any], rank: int) -> tuple[Outcome, Exception | None]:
    try:
        return ("ok", fn(), ""), None
    except Exception as err:
        kind = "CheckpointError" if isinstance(err, OSError) else type(err).__name__
        return ("error", kind, f"rank {rank}: {err}"), err


def _unwrap(outcomes: list[Outcome], local: Exception | None) -> list[Any]:
    for status, kind, message in outcomes:
        if status == "error":  # the failing rank keeps its own traceback as the cause
            raise _KINDS.get(kind, RuntimeError)(message) from local
    return [value for _, value, _ in outcomes]
