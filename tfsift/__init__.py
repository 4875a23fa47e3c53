"""tfsift: pipeline and data-parallel training with data sifting for Keras 3.

The public names are imported on first use, so that ``tfsift --version`` and the
pure planning commands do not pay for importing TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tfsift.version import __version__

if TYPE_CHECKING:
    from tfsift.api import (
        dp_process_set,
        dp_rank,
        dp_size,
        init,
        local_rank,
        mp_process_set,
        mp_rank,
        mp_size,
        rank,
        size,
    )
    from tfsift.collectives import allreduce, broadcast_variables
    from tfsift.context import gradients
    from tfsift.data import shard
    from tfsift.model import DistributedModel
    from tfsift.pipeline_step import step
    from tfsift.placement import partition
    from tfsift.step_output import StepOutput
    from tfsift.timing import timeline

_EXPORTS = {
    "DistributedModel": "tfsift.model",
    "StepOutput": "tfsift.step_output",
    "allreduce": "tfsift.collectives",
    "broadcast_variables": "tfsift.collectives",
    "dp_process_set": "tfsift.api",
    "dp_rank": "tfsift.api",
    "dp_size": "tfsift.api",
    "gradients": "tfsift.context",
    "init": "tfsift.api",
    "local_rank": "tfsift.api",
    "mp_process_set": "tfsift.api",
    "mp_rank": "tfsift.api",
    "mp_size": "tfsift.api",
    "partition": "tfsift.placement",
    "rank": "tfsift.api",
    "shard": "tfsift.data",
    "size": "tfsift.api",
    "step": "tfsift.pipeline_step",
    "timeline": "tfsift.timing",
}
__all__ = [
    "DistributedModel",
    "StepOutput",
    "__version__",
    "allreduce",
    "broadcast_variables",
    "dp_process_set",
    "dp_rank",
    "dp_size",
    "gradients",
    "init",
    "local_rank",
    "mp_process_set",
    "mp_rank",
    "mp_size",
    "partition",
    "rank",
    "shard",
    "size",
    "step",
    "timeline",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tfsift' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
