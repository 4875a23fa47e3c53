"""Keras' training API for DistributedModel: ``compile``, ``fit``, ``evaluate``, ``predict``,
the ``*_on_batch`` methods, and the collective ``save``, ``save_weights``, ``load_weights``."""

from tfsift.training.callbacks import quiet_elsewhere
from tfsift.training.compiled import Compiled, compile_model, compiled_of
from tfsift.training.loop import (
    evaluate,
    fit,
    predict,
    predict_on_batch,
    test_on_batch,
    train_on_batch,
)
from tfsift.training.saving import export_model, load_weights, save, save_weights

__all__ = [
    "Compiled",
    "compile_model",
    "compiled_of",
    "evaluate",
    "export_model",
    "fit",
    "load_weights",
    "predict",
    "predict_on_batch",
    "quiet_elsewhere",
    "save",
    "save_weights",
    "test_on_batch",
    "train_on_batch",
]
