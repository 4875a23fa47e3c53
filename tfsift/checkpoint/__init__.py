"""Checkpoints, resume and export of a partitioned model (docs/checkpoints.md)."""

from tfsift.checkpoint.export import load_weights, save_model
from tfsift.checkpoint.files import CheckpointError
from tfsift.checkpoint.manager import CheckpointManager

__all__ = ["CheckpointError", "CheckpointManager", "load_weights", "save_model"]
