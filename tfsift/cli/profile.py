"""``tfsift profile TARGET``: trace and time a model, write its cost model as JSON."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import Any

_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64")


def add_subcommand(commands: Any) -> None:
    """Registers ``profile`` on the ``tfsift`` argument parser."""
    cmd = commands.add_parser(
        "profile",
        help="profile a model's layers and write the partitioner cost model (JSON)",
        description="Traces the model, times every layer's forward and backward on one "
        "microbatch of random inputs and sizes its tensors, then writes the cost model that "
        "`tfsift plan` and `tfsift simulate` read (e.g. tfsift profile model.py:Net "
        "--microbatch-size 32 --input-shape 28,28,1 -o costs.json).",
    )
    cmd.add_argument(
        "target",
        help="FILE.py:Name or package.module:Name; Name is a model class "
        "or a callable returning a model, called with no arguments",
    )
    cmd.add_argument(
        "--microbatch-size",
        "--batch-size",  # its first name: a batch size B is the samples of all M microbatches
        dest="microbatch_size",
        type=int,
        required=True,
        metavar="b",
        help="samples per microbatch, b = B / M (the plan scales it to your batch)",
    )
    cmd.add_argument("--input-shape", required=True, help="per-sample input shape, e.g. 28,28,1")
    cmd.add_argument(
        "--dtype", default="float32", choices=_DTYPES, help="the inputs' dtype (default float32)"
    )
    cmd.add_argument(
        "--repeats", type=int, default=5, help="timed runs per layer; the median is kept (5)"
    )
    cmd.add_argument(
        "--output", "-o", default="costs.json", help="the cost file to write (costs.json)"
    )
    cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Builds the target model, profiles one random microbatch and writes the cost model."""
    from tfsift.cli.run import import_tensorflow_quietly

    import_tensorflow_quietly()
    import tensorflow as tf

    from tfsift.pipeline.stage import microbatch_seconds
    from tfsift.planning.graph import trace
    from tfsift.planning.profiler import format_table, profile

    if args.microbatch_size < 1:
        raise SystemExit(
            f"tfsift profile: --microbatch-size must be >= 1. Received: {args.microbatch_size}"
        )
    shape = _parse_shape(args.input_shape)
    factory = load_target(args.target)
    model = factory()
    example = tf.random.stateless_uniform((args.microbatch_size, *shape), seed=(0, 0), maxval=1)
    example = tf.cast(example * (10 if args.dtype.startswith("int") else 1), args.dtype)
    costs = profile(trace(model, [example]), [example], args.repeats, microbatch_seconds)
    costs.save(args.output)
    print(format_table(costs))
    print(f"wrote {args.output}")
    return 0


def load_target(target: str) -> Any:
    """Resolves ``FILE.py:Name`` or ``module:Name`` to the named object."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise SystemExit(
            f"tfsift profile: target must look like FILE.py:Name or module:Name. "
            f"Received: {target!r}"
        )
    if where.endswith(".py"):
        if not os.path.exists(where):
            raise SystemExit(f"tfsift profile: no such file. Received: {where!r}")
        spec = importlib.util.spec_from_file_location("_tfsift_profile_target", where)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, os.path.dirname(os.path.abspath(where)))
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    if not hasattr(module, name):
        raise SystemExit(f"tfsift profile: {where} has no attribute {name!r}")
    return getattr(module, name)


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise SystemExit(
            f"tfsift profile: --input-shape must be positive integers like 28,28,1. "
            f"Received: {text!r}"
        )
    return shape
