"""Records what ``shard.prompt_end`` hands a module, for tests of where tfsift reads tf.data."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import tensorflow as tf


def record_prompt_end(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> list[Any]:
    """``module.prompt_end`` wrapped: the list it returns gets, per call, the autotuner
    setting of the dataset ``module`` then reads (False: off)."""
    read: list[Any] = []
    plain = module.prompt_end

    def recorded(dataset: tf.data.Dataset) -> tf.data.Dataset:
        out = plain(dataset)
        read.append(out.options().autotune.enabled)
        return out

    monkeypatch.setattr(module, "prompt_end", recorded)
    return read
