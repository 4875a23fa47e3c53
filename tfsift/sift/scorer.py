"""Per-sample losses of candidate samples, from a forward-only pass through the pipeline.

``FullScorer`` wraps the model and a per-sample loss into a forward-only
``@tfsift.step`` (the forward-only schedule: no backward, no dropout, no BatchNorm
statistic updates, since the model is called with ``training=False``). The losses
are computed on the last stage and broadcast along the pipeline, so every rank of a
pipeline holds the same losses and takes the same keep decisions. ``StepScorer``
calls a user's own forward-only step instead, for elements that are not ``(x, y)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from keras import tree

from tfsift.parallel import runtime
from tfsift.pipeline.outputs import StepOutput
from tfsift.pipeline.step import step

Element = Any  # one dataset element: a tuple, a dict, or a tensor (NumPy arrays here)


@dataclasses.dataclass(frozen=True)
class Scores:
    """What scoring a group of samples gives the policy.

    Args:
        losses: one loss per sample, shape (B,).
        logits: the model's outputs (for ``grad_norm``), or None.
        labels: the labels, when the element is an ``(x, y)`` pair and logits are asked.
        scored: None if every sample was scored; else only the first ``scored`` were
            (overlap with ``leftover="keep"``), and the rest have NaN losses and logits
            and are kept unscored.
    """

    losses: np.ndarray
    logits: np.ndarray | None = None
    labels: np.ndarray | None = None
    scored: int | None = None


class Scorer:
    """What the sifter asks of a scorer; the full scorers learn nothing between rounds."""

    needs_logits = False
    metrics: dict[str, float] = {}  # noqa: RUF012 - read-only default, never mutated
    # The training batch size B, set by the sifter. A scorer that is the first to call the
    # model partitions it for microbatches of B / M, the training step's, not for the
    # g times larger scoring batches: the profile and so the cut depend on that size.
    batch_size: int | None = None

    def __call__(self, element: Element) -> Scores:
        raise NotImplementedError

    def bind(self, group: Any) -> None:
        """Told the replica group once, before the first round."""

    def expect(self, element_spec: Any) -> None:
        """Told the dataset's element spec when the transform is applied (before any step)."""

    def prepare(self, element: Element) -> None:
        """Told the next round's element before the training step that precedes it."""

    def warm(self, element: Element) -> None:
        """Called for each round of the delay (nothing is scored then)."""

    def learn(self, kept: np.ndarray) -> None:
        """Called after each selection with the kept positions of the last scoring."""

    def state(self) -> dict[str, Any]:
        """What the scorer learnt (nothing, for the full scorers)."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores ``state()``."""


class NoScorer(Scorer):
    """``scores="training"``: the losses come from the training steps, never from here."""

    def __call__(self, element: Element) -> Scores:
        raise RuntimeError(
            "scores='training' runs no scoring pass; a round asked for one (a bug in "
            "tfsift: please report it with this message)"
        )


class FullScorer(Scorer):
    """Scores ``(x, y)`` elements with ``per_sample_loss(y, model(x, training=False))``."""

    def __init__(self, model: Any, per_sample_loss: Callable[..., Any], needs_logits: bool) -> None:
        self.needs_logits = needs_logits
        self.model = model

        @step
        def score(x: Any, y: Any) -> Any:
            predictions = model(x, training=False)
            losses = per_sample_loss(y, predictions)
            return (losses, predictions) if needs_logits else losses

        self._step = score

    def __call__(self, element: Element) -> Scores:
        if not (isinstance(element, tuple) and len(element) == 2):
            raise ValueError(
                "tfsift.sift(model, per_sample_loss) needs dataset elements that are (x, y) "
                "pairs; for other elements pass a forward-only @tfsift.step that returns "
                "per-sample losses: tfsift.sift(score_step, config=config). Received: "
                f"{describe(element)}"
            )
        x, y = element
        partition_for_training(self.model, x, self.batch_size)
        out = self._step(x, y)
        if not self.needs_logits:
            return Scores(concat(out))
        losses, logits = out
        return Scores(concat(losses), concat(logits), np.asarray(y))


class StepScorer(Scorer):
    """Scores any element with the user's forward-only ``@tfsift.step`` function."""

    def __init__(self, score_step: Callable[..., Any]) -> None:
        self._step = score_step
        self._called = False

    def __call__(self, element: Element) -> Scores:
        B = self.batch_size
        n = int(tree.flatten(element)[0].shape[0])
        if not self._called and B and n > B:
            # the step's first call partitions the model: give it one training batch first
            # (its losses are computed again below, so that scoring keeps a single shape)
            self._called = True
            self(tree.map_structure(lambda leaf: leaf[:B], element))
        self._called = True
        out = self._step(*element) if isinstance(element, tuple) else self._step(element)
        return Scores(concat(out))


def partition_for_training(model: Any, x: Any, batch_size: int | None) -> None:
    """Partitions ``model`` (if no step has yet) for the training step's microbatch of
    ``batch_size / M`` rows of ``x`` rather than for the scoring call's larger one."""
    if model.partitioned is not None or not batch_size:
        return
    model.partition_model(training_microbatch(x, batch_size))


def training_microbatch(x: Any, batch_size: int) -> list[tf.Tensor]:
    """The first ``batch_size / M`` rows of ``x``, each of its tensors' (a dict or tuple of
    inputs keeps its nesting): the model inputs of one microbatch of a training step on
    batches of ``batch_size``."""
    rows = batch_size // runtime.get().config.microbatches
    return [tree.map_structure(lambda a: tf.convert_to_tensor(np.asarray(a)[:rows]), x)]


def concat(value: Any) -> np.ndarray:
    """A step output (``StepOutput``, tensor or array) as one array joined along axis 0."""
    if isinstance(value, StepOutput):
        parts = [np.asarray(v) for v in value.outputs]
        if any(p.ndim == 0 for p in parts):
            # one value per microbatch: a reduced loss, refused by check_losses as such
            return parts[0]
        return np.concatenate(parts, axis=0)
    if isinstance(value, (tuple, list, dict)):
        raise ValueError(
            "the scoring step must return the per-sample losses alone (one tensor of shape "
            f"(B,)). Received: a {type(value).__name__}"
        )
    if isinstance(value, np.ndarray):  # before tf.is_tensor, which takes 8 us to say no
        return value
    return np.asarray(value.numpy() if tf.is_tensor(value) else value)


def describe(element: Element) -> str:
    """A short description of an element's structure, for error messages."""
    if isinstance(element, tuple):
        return f"a tuple of {len(element)}"
    if isinstance(element, dict):
        return f"a dict with keys {sorted(element)}"
    return type(element).__name__
