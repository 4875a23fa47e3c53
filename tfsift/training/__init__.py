"""Keras' training API for DistributedModel: ``compile``, ``fit``, ``evaluate``, ``predict``."""

from tfsift.training.compiled import Compiled, compile_model, compiled_of
from tfsift.training.loop import evaluate, fit, predict

__all__ = ["Compiled", "compile_model", "compiled_of", "evaluate", "fit", "predict"]
