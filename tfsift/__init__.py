"""tfsift: pipeline and data-parallel training with data sifting for Keras 3.

The public names are imported on first use, so that ``tfsift --version`` and the
pure planning commands do not pay for importing TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tfsift import env as _env
from tfsift.version import __version__

# Before anything imports mpi4py.MPI (which starts MPI): see env.OMPI_MCA_MPI_YIELD_WHEN_IDLE.
_env.set_mpi_defaults()

if TYPE_CHECKING:
    from tfsift.checkpoint import CheckpointManager, load_weights, save_model
    from tfsift.model import DistributedModel
    from tfsift.parallel.arrays import from_arrays, from_rows
    from tfsift.parallel.collectives import allreduce, broadcast_variables
    from tfsift.parallel.ranks import (
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
    from tfsift.parallel.shard import shard
    from tfsift.pipeline.context import gradients
    from tfsift.pipeline.outputs import StepOutput
    from tfsift.pipeline.step import step
    from tfsift.pipeline.timeline import timeline
    from tfsift.planning.placement import partition
    from tfsift.sift.config import SiftConfig
    from tfsift.sift.transform import sift, sift_metrics
    from tfsift.training.reductions import clip_by_global_norm
    from tfsift.training.regularizers import add_weight_penalties
    from tfsift.training.update import compiled_update

_EXPORTS = {
    "add_weight_penalties": "tfsift.training.regularizers",
    "CheckpointManager": "tfsift.checkpoint",
    "DistributedModel": "tfsift.model",
    "SiftConfig": "tfsift.sift.config",
    "StepOutput": "tfsift.pipeline.outputs",
    "allreduce": "tfsift.parallel.collectives",
    "broadcast_variables": "tfsift.parallel.collectives",
    "clip_by_global_norm": "tfsift.training.reductions",
    "compiled_update": "tfsift.training.update",
    "dp_process_set": "tfsift.parallel.ranks",
    "dp_rank": "tfsift.parallel.ranks",
    "dp_size": "tfsift.parallel.ranks",
    "from_arrays": "tfsift.parallel.arrays",
    "from_rows": "tfsift.parallel.arrays",
    "gradients": "tfsift.pipeline.context",
    "init": "tfsift.parallel.ranks",
    "load_weights": "tfsift.checkpoint",
    "local_rank": "tfsift.parallel.ranks",
    "mp_process_set": "tfsift.parallel.ranks",
    "mp_rank": "tfsift.parallel.ranks",
    "mp_size": "tfsift.parallel.ranks",
    "partition": "tfsift.planning.placement",
    "rank": "tfsift.parallel.ranks",
    "save_model": "tfsift.checkpoint",
    "shard": "tfsift.parallel.shard",
    "sift": "tfsift.sift.transform",
    "sift_metrics": "tfsift.sift.transform",
    "size": "tfsift.parallel.ranks",
    "step": "tfsift.pipeline.step",
    "timeline": "tfsift.pipeline.timeline",
}
__all__ = [
    "CheckpointManager",
    "DistributedModel",
    "SiftConfig",
    "StepOutput",
    "__version__",
    "add_weight_penalties",
    "allreduce",
    "broadcast_variables",
    "callbacks",
    "clip_by_global_norm",
    "compiled_update",
    "dp_process_set",
    "dp_rank",
    "dp_size",
    "from_arrays",
    "from_rows",
    "gradients",
    "init",
    "load_weights",
    "local_rank",
    "mp_process_set",
    "mp_rank",
    "mp_size",
    "partition",
    "rank",
    "save_model",
    "shard",
    "sift",
    "sift_metrics",
    "size",
    "step",
    "timeline",
]


def __getattr__(name: str) -> Any:
    if name in ("sift", "callbacks"):  # sub-packages (sift is callable: tfsift/sift/__init__)
        return importlib.import_module(f"tfsift.{name}")
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tfsift' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
