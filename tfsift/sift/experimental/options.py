"""The checks of ``SiftConfig``'s experimental fields: the early exit and overlap."""

from __future__ import annotations

from typing import Any

from tfsift.config import check_bool, check_choice
from tfsift.sift.config import EXPERIMENTAL, check_number, check_optional_name, is_set

LEFTOVERS = ("score", "keep")


def check(config: Any) -> None:
    """Refuses an experimental field of ``config`` (a ``SiftConfig``) that is malformed,
    or set where nothing reads it."""
    check_optional_name("exit_after", config.exit_after)
    if config.exit_head is not None and not callable(config.exit_head):
        raise ValueError(
            "exit_head must be None or a callable Keras layer. "
            f"Received: exit_head={config.exit_head!r}"
        )
    check_number("exit_lr", config.exit_lr, "> 0")
    check_bool("overlap", config.overlap)
    if config.overlap and config.scorer != "early_exit":
        raise ValueError(
            "overlap runs the early-exit scoring during the pipeline's drain; it needs "
            f"scorer='early_exit'. Received: overlap=True, scorer={config.scorer!r}"
        )
    check_choice("leftover", config.leftover, LEFTOVERS)
    if config.leftover != "score" and not config.overlap:
        raise ValueError(
            "leftover decides what overlap had no wait to score; it needs overlap=True. "
            f"Received: leftover={config.leftover!r}, overlap=False"
        )
    exits = [
        k
        for k in ("exit_after", "exit_head", "exit_lr")
        if is_set(getattr(config, k), EXPERIMENTAL[k])
    ]
    if exits and config.scorer != "early_exit":
        raise ValueError(
            f"{exits[0]} shapes the early-exit scoring pass; it needs scorer='early_exit'. "
            f"Received: scorer={config.scorer!r}, {exits[0]}={getattr(config, exits[0])!r}"
        )
