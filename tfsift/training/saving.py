"""Keras' ``save``, ``save_weights``, ``load_weights`` and ``export`` on a partitioned model.

Each is collective, as Keras callbacks call them on every rank (``ModelCheckpoint``,
``tfsift.callbacks.BackupAndRestore``): the stages' weights are gathered and rank 0 writes
one ordinary Keras file of the whole model (``tfsift.checkpoint.export``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfsift.checkpoint import export

if TYPE_CHECKING:
    from tfsift.model import DistributedModel


def save(model: DistributedModel, filepath: Any, overwrite: bool = True) -> None:
    """``model.save``: ``tfsift.save_model``, one ``.keras`` file of the whole model."""
    export.save_model(model, _writable(filepath, overwrite))


def save_weights(model: DistributedModel, filepath: Any, overwrite: bool = True) -> None:
    """``model.save_weights``: one ``.weights.h5`` file of the whole model's weights."""
    export.save_weights(model, _writable(filepath, overwrite))


def export_model(model: DistributedModel, filepath: Any, **kwargs: Any) -> None:
    """``model.export``: Keras' export of the whole model (``tfsift.checkpoint.export``)."""
    export.export_model(model, filepath, **kwargs)


def load_weights(model: DistributedModel, filepath: Any) -> None:
    """``model.load_weights``: ``tfsift.load_weights`` (a ``.keras`` or ``.weights.h5``
    file into a model that has run a step, or a checkpoint directory, whose manifest
    holds the inputs to partition a model that has not)."""
    path = Path(filepath)
    is_file = path.suffix == ".keras" or path.name.endswith(export.WEIGHTS_SUFFIX)
    if model.partitioned is None and is_file:
        raise ValueError(
            f"model.load_weights of a file needs DistributedModel {model.name!r} partitioned, "
            "which happens at its first step (fit, predict or a @tfsift.step call): call it "
            "after a step, or use tfsift.load_weights(model, path, example=<a batch of "
            f"inputs>). Received: filepath={str(filepath)!r}"
        )
    export.load_weights(model, filepath)


def _writable(filepath: Any, overwrite: bool) -> Path:
    path = Path(filepath)
    if not overwrite and path.exists():
        raise FileExistsError(f"{path} exists and overwrite=False. Received: filepath={path}")
    return path
