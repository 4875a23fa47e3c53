"""The optimizer's update as one compiled call, for ``fit`` and the custom loop."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras

from tfsift.pipeline.compiled import Compiled


def compiled_update(
    optimizer: keras.optimizers.Optimizer, model: keras.Model
) -> Callable[[Sequence[Any]], None]:
    """``optimizer``'s update of ``model``'s trainable variables, one compiled call a step.

    ``update = tfsift.compiled_update(optimizer, model)`` once, then ``update(grads)`` in
    place of ``optimizer.apply_gradients(zip(grads, model.trainable_variables))``: the same
    update. Eagerly, a Keras 3 optimizer updates each variable in Python, which on a small
    model costs more than the step itself; a ``tf.function`` of it canonicalises its
    arguments at every call, which this one skips (``scripts/bench_calls.py``). ``fit``
    updates through it.

    The variables are read at each call, so on a pipeline they are this rank's stage's
    (``tfsift.allreduce``'s gradients are in that order); a stage without trainable
    variables gets no gradients, and ``update([])`` does nothing. The optimizer's slots
    are made eagerly at the first call, as ``apply_gradients`` makes them.

    Example:
        >>> update = tfsift.compiled_update(optimizer, model)
        >>> grads = tfsift.allreduce(grads)                  # doctest: +SKIP
        >>> update(grads)                                    # doctest: +SKIP
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "compiled_update(optimizer, model) expects a keras.optimizers.Optimizer. "
            f"Received: {type(optimizer).__name__}"
        )
    if not isinstance(model, keras.Model):
        raise TypeError(
            "compiled_update(optimizer, model) expects a keras.Model (a "
            f"tfsift.DistributedModel). Received: {type(model).__name__}"
        )
    # Keras' code only: nothing for AutoGraph to convert
    apply = Compiled(
        lambda grads: optimizer.apply(grads, model.trainable_variables),
        "the optimizer's update",
        autograph=False,
    )

    def update(grads: Sequence[Any]) -> None:
        variables = model.trainable_variables
        if len(grads) != len(variables):
            raise ValueError(
                f"update(grads) expects one gradient per trainable variable of this rank's "
                f"stage of {model.name!r}, in their order ({len(variables)}). Received: "
                f"{len(grads)} gradients"
            )
        if not variables:
            return
        if not optimizer.built:  # its slots made eagerly, not inside the trace
            optimizer.build(variables)
        apply(list(grads))

    return update
