"""The step plan: everything a ``@tfsift.step`` function needs, built once at its first call.

The first call of a step function partitions the model (if no step did before),
learns whether the function trains, and fixes K, M, the schedule's actions for this
rank, the tensor specs of the stage's messages, the communicator and the last
stage's head. Every later call reads that one immutable object; a call made after
``tfsift.init`` changed the configuration, or with arguments of another structure,
is refused with a message saying which value changed, instead of running a stale
schedule into the executor. With virtual stages a rank runs v chunks: the plan holds
one ``Chunk`` (stage, role, message specs, head, split backward) per chunk, and the
schedule's actions name the chunk they run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf
from keras import tree

from partitioner.schedule import Action
from tfsift.parallel.comm import PipeComm
from tfsift.parallel.runtime import Runtime
from tfsift.pipeline.head import Head
from tfsift.pipeline.metrics import NONE, SharedMetrics
from tfsift.pipeline.roles import Role
from tfsift.pipeline.split import SplitBackward
from tfsift.pipeline.stage import Stage
from tfsift.pipeline.tied import TiedWeights

if TYPE_CHECKING:  # the model module imports this package: no import cycle at run time
    from tfsift.model import DistributedModel

Spec = tuple[tuple[int, ...], Any]


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One stage of the model this rank runs (with virtual stages, one of its chunks).

    Args:
        stage: the stage (chunk c of the model).
        role: what a forward and a backward action mean on it (first, middle, last).
        in_specs: (shape without batch, dtype) of each tensor it receives forward.
        grad_specs: the same for each gradient it receives backward (float outputs only).
        head: the last stage's fused step-function call (None on other stages).
        split: its backward as B and W, where the schedule splits it
            (``partitioner.schedule.splits_stage``); None elsewhere.
    """

    stage: Stage
    role: Role
    in_specs: tuple[Spec, ...]
    grad_specs: tuple[Spec, ...]
    head: Head | None = None
    split: SplitBackward | None = None

    @property
    def index(self) -> int:
        """c, its index among the model's stages (chunks)."""
        return self.stage.index


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """What every call of one step function runs on this rank (letters: K stages, M
    microbatches, s this rank's stage, v virtual stages).

    Args:
        K, M, pipeline, optimize: the configuration the plan was made for.
        model: the ``DistributedModel`` the step function calls.
        chunks: the stages this rank runs: stage s, or with virtual stages chunks s,
            s + K, ..., in that order.
        actions: this rank's actions of the schedule, communication included (each names
            the chunk it runs).
        output_structure: the nesting of the model call's outputs.
        comm: point-to-point messages along this rank's pipeline.
        backward: the function calls ``tfsift.gradients`` (a training step).
        training: the model is called with ``training=True``.
        arguments: the structure of the arguments the plan was made for.
        runtime: the ``tfsift.init`` this plan belongs to.
        shared: the metrics the function updates, shared along the pipeline after a step.
        tied: the weights this stage shares with others, whose gradients are summed.
        combine: the rank's gradients (``model.trainable_variables``) from each chunk's
            gradient sum, by chunk index (``Chunks.combine``); None: the one chunk's.
    """

    K: int
    M: int
    pipeline: str
    optimize: str
    model: DistributedModel
    chunks: tuple[Chunk, ...]
    actions: tuple[Action, ...]
    output_structure: Any
    comm: PipeComm
    backward: bool
    training: bool
    arguments: str
    runtime: Runtime
    shared: SharedMetrics = NONE
    tied: TiedWeights = dataclasses.field(default_factory=TiedWeights)
    combine: Callable[[dict[int, list[tf.Tensor] | None]], list[tf.Tensor] | None] | None = None

    @property
    def s(self) -> int:
        """This rank's stage index (its first chunk's)."""
        return self.chunks[0].index

    @property
    def last(self) -> bool:
        """Whether this rank holds the last stage (which runs the step function's head)."""
        return self.s == self.K - 1

    @property
    def head(self) -> Head | None:
        """The step function's head, on the last stage's rank (its last chunk's)."""
        return self.chunks[-1].head

    def chunk(self, c: int) -> Chunk:
        """The chunk of model stage ``c`` (one this rank runs)."""
        return self.chunks[(c - self.s) // self.K]

    def rank_of(self, c: int) -> int:
        """The stage (rank of the pipeline) that runs model stage (chunk) ``c``."""
        return c % self.K

    def check(self, rt: Runtime, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Refuses a call this plan cannot run.

        Raises:
            RuntimeError: ``tfsift.init`` was called again since the plan was made.
            ValueError: the arguments' structure differs from the first call's, or a
                layer's ``trainable`` changed since the model was partitioned.
        """
        if self.model.partitioned is not None:
            self.model.partitioned.check_trainable()
        if rt is not self.runtime:
            raise RuntimeError(
                "tfsift.init was called again after this @tfsift.step function was planned "
                f"for {self.describe_config()}; a plan cannot follow a new configuration, so "
                "create the model and its @tfsift.step functions after the last tfsift.init. "
                f"Received: {describe_config(rt)}"
            )
        received = describe_arguments(args, kwargs)
        if received != self.arguments:
            raise ValueError(
                "a @tfsift.step function must be called with arguments of the same structure "
                f"every time (its plan was made for {self.arguments}). Received: {received}"
            )

    def describe_config(self) -> str:
        return _config_text(self.K, self.M, self.pipeline, self.optimize)


def describe_config(rt: Runtime) -> str:
    """The configuration values a step plan depends on, as text."""
    cfg = rt.config
    return _config_text(cfg.partitions, cfg.microbatches, cfg.pipeline, cfg.optimize)


def _config_text(K: int, M: int, pipeline: str, optimize: str) -> str:
    return f"partitions={K}, microbatches={M}, pipeline={pipeline!r}, optimize={optimize!r}"


def describe_arguments(args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """Where the arguments hold tensors (or arrays), with each one's rank.

    Sizes and Python values are left out on purpose: a smaller last batch, or a number
    passed to the step function, runs on the same plan.
    """
    found = []
    for path, value in tree.flatten_with_path((tuple(args), dict(kwargs))):
        if tf.is_tensor(value) or isinstance(value, np.ndarray):
            where = _path_text(path)
            found.append(f"{where}: tensor(rank {len(value.shape)})")
    return "(" + ", ".join(found) + ")"


def _path_text(path: Sequence[Any]) -> str:
    kind, *rest = path
    head = f"args[{rest[0]}]" if kind == 0 else str(rest[0])
    return head + "".join(f"[{key!r}]" for key in rest[1:])
