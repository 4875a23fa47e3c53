"""StepOutput: one value per microbatch, returned by a ``@tfsift.step`` function."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfsift.parallel.collectives import one_value
from tfsift.pipeline.compiled import Compiled
from tfsift.planning.autodiff import elementwise


class StepOutput:
    """The values one output of a step took on each of the M microbatches.

    Example:
        >>> out = StepOutput([tf.constant(1.0), tf.constant(3.0)])
        >>> float(out.reduce_mean())
        2.0

    Raises:
        TypeError: ``outputs`` a tensor or an array (a list of the microbatches' values is
            expected: a tensor's rows would be taken for microbatches).
        ValueError: no value at all.
    """

    def __init__(self, outputs: Sequence[tf.Tensor]) -> None:
        if one_value(outputs):
            raise TypeError(
                "StepOutput expects a list with one value per microbatch. Received: "
                f"{type(outputs).__name__}"
            )
        if not outputs:
            raise ValueError(
                "StepOutput expects one value per microbatch, at least one. Received: []"
            )
        self.outputs = [tf.convert_to_tensor(x) for x in outputs]

    def __len__(self) -> int:
        return len(self.outputs)

    def __repr__(self) -> str:
        return f"StepOutput(microbatches={len(self.outputs)})"

    def reduce_mean(self) -> tf.Tensor:
        """Element-wise mean over microbatches."""
        return tf.reduce_mean(self.stack(), axis=0)

    def reduce_sum(self) -> tf.Tensor:
        """Element-wise sum over microbatches."""
        return tf.reduce_sum(self.stack(), axis=0)

    def accumulate(self) -> tf.Tensor:
        """The mean over microbatches: the full-batch gradient when each loss is a batch mean."""
        return self.reduce_mean()

    def concat(self) -> tf.Tensor:
        """The microbatches joined back along axis 0 (e.g. per-sample predictions)."""
        return tf.concat(self.outputs, axis=0)

    merge = concat

    def stack(self) -> tf.Tensor:
        """The microbatch values stacked on a new axis 0."""
        return tf.stack(self.outputs, axis=0)


class GradientOutput(StepOutput):
    """A gradient summed over the microbatches as their backwards finish.

    Only the sum is kept (holding M per-microbatch copies of every gradient would cost
    M times the model's gradient memory), so ``accumulate``/``reduce_mean`` and
    ``reduce_sum`` work while the per-microbatch views raise.
    """

    def __init__(
        self, total: tf.Tensor, count: int, step: StepGradients | None = None, index: int = 0
    ) -> None:
        self.total = total
        self.count = count
        self._step, self._index = step, index  # the step's other gradients: divided at once

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"GradientOutput(microbatches={self.count})"

    @property
    def outputs(self) -> list[tf.Tensor]:  # type: ignore[override]
        raise RuntimeError(
            "per-microbatch gradients are not kept (they would cost M copies); "
            "use accumulate(), reduce_mean() or reduce_sum()"
        )

    def reduce_mean(self) -> tf.Tensor:
        if self.count == 1:
            return self.total
        if self._step is not None:
            return self._step.mean(self._index)
        return _over(self.total, tf.constant(self.count))

    def reduce_sum(self) -> tf.Tensor:
        return self.total


class StepGradients:
    """One step's gradient sums, divided by M together at the first ``reduce_mean``.

    ``tfsift.allreduce(grads)`` asks for every gradient's mean: one compiled call
    instead of two eager operations a gradient (a model of 10 variables: about 0.5 ms a
    step on one CPU thread, ``scripts/bench_small.py``).
    """

    def __init__(
        self,
        totals: Sequence[tf.Tensor],
        count: int,
        means: Sequence[tf.Tensor] | None = None,
    ) -> None:
        self.totals, self.count = list(totals), count
        # given where the step computed them already (one stage: in its one call)
        self._means: list[tf.Tensor] | None = None if means is None else list(means)

    @property
    def outputs(self) -> list[GradientOutput]:
        """One ``GradientOutput`` a gradient (they refer to this; this not to them: no
        reference cycle to keep a step's tensors alive until a full collection)."""
        return [GradientOutput(t, self.count, self, i) for i, t in enumerate(self.totals)]

    def mean(self, index: int) -> tf.Tensor:
        if self._means is None:
            # M as a tensor: as a Python number it would be a constant that Grappler turns
            # the division by into a product with its reciprocal, which rounds differently
            self._means = list(_DIVIDE(self.totals, tf.constant(self.count)))
        return self._means[index]


def divide(totals: Sequence[tf.Tensor], count: tf.Tensor) -> list[tf.Tensor]:
    """Each total over ``count`` (a tensor, never a constant: see ``StepGradients.mean``);
    a lookup's ``tf.IndexedSlices`` stays slices."""
    return [_over(t, count) for t in totals]


def _over(total: Any, count: tf.Tensor) -> Any:
    return elementwise(total, lambda v: v / tf.cast(count, v.dtype))


_DIVIDE = Compiled(divide, "the gradients' mean over microbatches", autograph=False)
