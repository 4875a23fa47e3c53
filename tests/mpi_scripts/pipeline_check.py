"""Every rank: pipeline gradients and loss for many configs against a one-process reference.

usage: pipeline_check.py K MODELS MICROBATCHES PIPELINES OPTIMIZES [COMPILE] [COVER]
       (comma-separated lists; a pipeline with virtual stages reads ``interleaved/2``;
       COMPILE "true" (default) or "false": @tfsift.step(compile=...); COVER "all"
       (default) or "pairs": see ``models.grid``)
"""

from __future__ import annotations

import socket
import sys
from typing import Any

import keras
import numpy as np

import tfsift
from models import (
    LOSS,
    MODELS,
    copy_stage_weights,
    data,
    gradient_map,
    grid,
    layer_attrs,
    reference,
    rel_error,
    schedule,
)
from mpi import report
from tfsift.planning import keras_internals

BATCH, SEED = 8, 1234
REFERENCES: dict[tuple[str, int], tuple[Any, ...]] = {}


def check(
    name: str, K: int, M: int, pipeline: str, optimize: str, compile: bool
) -> dict[str, object]:
    tfsift.init(
        {
            "partitions": K,
            "microbatches": M,
            **schedule(pipeline),
            "optimize": optimize,
            "profile_repeats": 1,
        }
    )
    x, y = data(BATCH)
    if (name, M) not in REFERENCES:  # the same for every pipeline and optimize mode
        REFERENCES[name, M] = reference(name, x, y, M, SEED)
    ref, init, ref_grads, ref_loss = REFERENCES[name, M]
    keras.utils.set_random_seed(SEED)
    model = MODELS[name]()

    calls = []

    @tfsift.step(compile=compile)
    def forward_backward(images, labels):  # type: ignore[no-untyped-def]
        calls.append(1)  # Python: runs per microbatch eagerly, only when traced if compiled
        predictions = model(images, training=True)
        loss = LOSS(labels, predictions)
        return tfsift.gradients(loss, model.trainable_variables), loss, predictions

    model.partition_model([x[: BATCH // M]])
    copy_stage_weights(ref, init, model)
    grads, loss, predictions = forward_backward(x, y)
    forward_backward(x, y)  # a second step, to count the Python runs of the step function
    kept = {id(v) for v in model.variables}
    every = [v for layer in layer_attrs(model).values() for v in layer.variables]
    freed = {id(v) for v in every if keras_internals.is_freed(v)}
    summary: list[str] = []
    model.summary(print_fn=summary.append)
    order = gradient_map(ref, model)
    errors = [
        rel_error(g.accumulate().numpy(), ref_grads[i]) for g, i in zip(grads, order, strict=True)
    ]
    return {
        "model": name,
        "K": K,
        "M": M,
        "pipeline": pipeline,
        "optimize": optimize,
        "compile": compile,
        "body_calls": len(calls),
        "grad_error": max(errors) if errors else 0.0,
        "num_grads": len(grads),
        "loss": float(loss.reduce_mean()),
        "ref_loss": ref_loss,
        "pred_shape": list(predictions.concat().shape),
        "stage": tfsift.mp_rank(),
        "only_stage_weights_kept": freed == {id(v) for v in every} - kept,
        # whether the stage recomputed (optimize="memory", or "speed" where it timed faster)
        "recompute": model.partitioned.stage.recompute,  # type: ignore[union-attr]
        # the schedule it ran: the config's, or what pipeline="auto" chose
        "planned": model.partitioned.pipeline,  # type: ignore[union-attr]
        "virtual": model.partitioned.virtual_stages,  # type: ignore[union-attr]
        "deferred": model.partitioned.deferred,  # type: ignore[union-attr]
        "chunks": [s.index for s in model.partitioned.stage.stages],  # type: ignore[union-attr]
        "summary_title": summary[0],
    }


def main() -> None:
    K = int(sys.argv[1])
    lists = [arg.split(",") for arg in sys.argv[2:6]]
    compile = (sys.argv[6] if len(sys.argv) > 6 else "true") == "true"
    cover = sys.argv[7] if len(sys.argv) > 7 else "all"
    results = [check(n, K, int(m), p, o, compile) for n, m, p, o in grid(lists, cover)]
    report(
        rank=tfsift.rank(),
        host=socket.gethostname(),  # a simulated host's name when run on them
        results=results,
        nvars=int(np.sum([r["num_grads"] for r in results])),
    )


if __name__ == "__main__":
    main()
