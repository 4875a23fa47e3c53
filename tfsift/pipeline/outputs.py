"""StepOutput: one value per microbatch, returned by a ``@tfsift.step`` function."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf


class StepOutput:
    """The values one output of a step took on each of the M microbatches.

    Example:
        >>> out = StepOutput([tf.constant(1.0), tf.constant(3.0)])
        >>> float(out.reduce_mean())
        2.0
    """

    def __init__(self, outputs: Sequence[tf.Tensor]) -> None:
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

    def __init__(self, total: tf.Tensor, count: int) -> None:
        self.total = total
        self.count = count

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
        return self.total / tf.cast(self.count, self.total.dtype)

    def reduce_sum(self) -> tf.Tensor:
        return self.total
