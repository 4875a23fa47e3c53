"""The executor frees each step's tensors as soon as the step returns."""

from __future__ import annotations

import gc
import types
import weakref

from tfsift.pipeline.executor import Executor


def test_an_executor_is_freed_without_the_cycle_collector() -> None:
    gc.disable()
    try:
        executor = Executor(
            types.SimpleNamespace(index=0),  # type: ignore[arg-type]
            1,
            None,
            None,
            [],
            ([], []),
            None,
            True,
            True,  # type: ignore[arg-type]
            None,
        )
        alive = weakref.ref(executor)
        del executor
        assert alive() is None
    finally:
        gc.enable()
