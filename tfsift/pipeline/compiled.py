"""A ``tf.function`` whose per-call dispatch is a dictionary lookup.

A pipeline calls each stage's compiled functions once per microbatch. On every
call ``tf.function`` canonicalises all its arguments into a function type and
looks that up among its traces, which is a large part of a call's fixed cost
(docs/benchmarks-log.md, Fixed cost per call, measured it). ``Compiled`` keys
the concrete functions by the arguments' structure, shapes, dtypes and Python
values itself (a lookup's gradient, ``tf.IndexedSlices``, by its parts), and falls back
to the ``tf.function`` for arguments it cannot key (an unhashable Python value, a ragged
or sparse tensor).

Calling the concrete function binds the arguments to its signature once more (about a
fifth of a small stage's call, ``scripts/bench_small.py``). Where the tensors it would
pass are exactly the arguments' tensors in ``tf.nest`` order, which is checked on a
signature's first call against TensorFlow's own unpacking, later calls hand them over
flat (``ConcreteFunction._call_flat``: TensorFlow 2.21's, pinned by constraints.txt;
without it every call binds).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Any

import tensorflow as tf
from tensorflow.python.autograph.core import config as autograph_config
from tensorflow.python.eager.polymorphic_function import function_type_utils

log = logging.getLogger("tfsift")
# AutoGraph rewrites every function a traced one calls unless its module is on this list
# (TensorFlow and Keras are): the stage code run inside each trace was parsed, rewritten and
# compiled anew in every process, and an AutoGraph-wrapped call costs more while tracing
# (a 4-stage char-transformer job: about 0.6 CPU seconds a rank). tfsift's own code uses
# no Python control flow on tensors; a user function called from a traced one (a
# @tfsift.step function, the loss given to fit) is still converted, as Keras leaves it.
autograph_config.CONVERSION_RULES = (
    autograph_config.DoNotConvert("tfsift"),
    *autograph_config.CONVERSION_RULES,
)
RETRACE_WARNING = 8  # traces of one function after which tfsift warns, once


class Compiled:
    """``tf.function(fn, reduce_retracing=True)``, called through cached concrete functions.

    Example:
        >>> double = Compiled(lambda x: 2 * x)
        >>> double(tf.ones((2,))).numpy()
        array([2., 2.], dtype=float32)
    """

    def __init__(
        self, fn: Callable[..., Any], name: str | None = None, autograph: bool = True
    ) -> None:
        # autograph=False: ``fn`` is tfsift's own and calls no user Python (only Keras
        # operations), so not even its top level is rewritten
        self.function = tf.function(fn, reduce_retracing=True, autograph=autograph)
        # per signature: its concrete function, and whether its calls go flat
        self._concrete: dict[Hashable, tuple[Any, bool]] = {}
        self._warned = False
        self.name = name or getattr(fn, "__qualname__", repr(fn))

    def __call__(self, *args: Any) -> Any:
        return self.call_keyed(signature(args), *args)

    def call_keyed(self, key: Hashable | None, *args: Any) -> Any:
        """``self(*args)`` where the caller already has ``signature(args)`` (or None)."""
        if key is None:
            return self.function(*args)
        known = self._concrete.get(key)
        if known is not None:
            concrete, flat = known
            if flat:
                return concrete._call_flat(flat_tensors(args), concrete.captured_inputs)
        else:
            concrete = self.function.get_concrete_function(*args)
            self._concrete[key] = concrete, goes_flat(concrete, args)
            # Real traces, not signatures: with reduce_retracing a new shape mostly
            # reuses a trace of relaxed shapes (the early-exit scorer meets a new batch
            # size per leftover, and warned with 2 traces in all); a new Python value
            # always traces.
            traced = self.function.experimental_get_tracing_count()
            if traced >= RETRACE_WARNING and not self._warned:
                self._warned = True
                self._warn(key, traced)
        return concrete(*args)

    def _warn(self, key: Hashable, traced: int) -> None:
        # tf.function warns about frequent retracing only for calls it dispatches itself
        log.warning(
            "%s has been traced for %d different argument signatures; each new "
            "shape or Python value (a number passed to the step function, say) costs a "
            "trace. Pass values that change between calls as tensors. Latest signature: %s",
            self.name,
            traced,
            key,
        )

    @property
    def traces(self) -> int:
        """How many argument signatures have a concrete function (several may share one
        trace of relaxed shapes)."""
        return len(self._concrete)


def signature(value: Any) -> Hashable | None:
    """A hashable key for the trace ``value`` needs: structure, shapes, dtypes and the
    Python values (which a trace bakes in); ``None`` if a leaf cannot be keyed."""
    if isinstance(value, tf.Tensor):
        return (tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        parts = tuple(signature(v) for v in value)
        return None if None in parts else (type(value), parts)
    if isinstance(value, dict):
        items = tuple((k, signature(v)) for k, v in value.items())
        return None if any(s is None for _, s in items) else (dict, items)
    if value is None:
        return ("None",)
    if isinstance(value, tf.IndexedSlices):  # a lookup's gradient, keyed by its parts
        parts = (value.values, value.indices, value.dense_shape)
        return ("IndexedSlices", *(signature(part) for part in parts))
    if tf.is_tensor(value):  # another composite tensor (ragged, sparse): tf.function keys it
        return None
    try:
        hash(value)
    except TypeError:
        return None
    return ("V", type(value), value)


def flat_tensors(value: Any) -> list[tf.Tensor]:
    """The tensors among ``value``'s leaves in ``tf.nest`` order (a dict's sorted keys)."""
    if isinstance(value, tf.Tensor):
        return [value]
    if isinstance(value, tf.IndexedSlices):  # its components, in TensorFlow's order
        parts = (value.values, value.indices, value.dense_shape)
        return [t for t in parts if t is not None]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flat_tensors(v)]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in flat_tensors(value[k])]
    return []


def goes_flat(concrete: Any, args: tuple[Any, ...]) -> bool:
    """Whether ``flat_tensors(args)`` is what binding ``args`` to ``concrete`` passes it."""
    if not hasattr(concrete, "_call_flat"):
        return False
    try:
        bound = function_type_utils.canonicalize_function_inputs(args, {}, concrete.function_type)
        theirs = concrete.function_type.unpack_inputs(bound)
    except Exception:  # any doubt: bind every call, as TensorFlow does
        return False
    mine = flat_tensors(args)
    return len(theirs) == len(mine) and all(a is b for a, b in zip(theirs, mine, strict=True))
