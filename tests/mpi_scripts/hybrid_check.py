"""N ranks as pipelines of K stages x N/K replicas: weights after training vs one process.

usage: hybrid_check.py K PLACEMENT STEPS [PIPELINE]  (PIPELINE: the schedule, default
       the config's; with virtual stages ``interleaved/2``)
"""

from __future__ import annotations

import socket
import sys

import keras
import numpy as np
import tensorflow as tf

import tfsift
from models import (
    LOSS,
    MODELS,
    copy_stage_weights,
    data,
    gradient_map,
    rel_error,
    schedule,
    training_step,
)
from mpi import report
from tfsift.parallel import runtime

B, M, SEED = 8, 2, 7


def reference(
    steps: int, replicas: int
) -> tuple[keras.Model, dict[int, np.ndarray], list[np.ndarray]]:
    keras.utils.set_random_seed(SEED)
    model = MODELS["skip"]()
    inputs = keras.Input((8, 8, 1))
    functional = keras.Model(inputs, model.call(inputs))
    init = {id(v): v.numpy() for v in model.variables}
    optimizer = keras.optimizers.Adam(0.01)
    for t in range(steps):
        x, y = data(B * replicas, seed=t)
        with tf.GradientTape() as tape:
            loss = LOSS(y, functional(x, training=True))
        optimizer.apply_gradients(
            zip(
                tape.gradient(loss, model.trainable_variables),
                model.trainable_variables,
                strict=True,
            )
        )
    return model, init, [v.numpy() for v in model.trainable_variables]


def main() -> None:
    K, placement, steps = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    pipeline = schedule(sys.argv[4]) if len(sys.argv) > 4 else {}
    tfsift.init({"partitions": K, "microbatches": M, "placement_strategy": placement, **pipeline})
    R, r = tfsift.dp_size(), tfsift.dp_rank()
    ref, init, final = reference(steps, R)
    keras.utils.set_random_seed(SEED)
    model = MODELS["skip"]()
    optimizer = keras.optimizers.Adam(0.01)

    forward_backward = training_step(model)

    model.partition_model([data(B)[0][: B // M]])
    copy_stage_weights(ref, init, model)
    if r != 0:  # replicas other than dp_rank 0 start wrong; the broadcast must fix them
        for var in model.trainable_variables:
            var.assign(var + 1.0)
    tfsift.broadcast_variables(model.variables)
    losses = []
    for t in range(steps):
        x, y = data(B * R, seed=t)
        grads, loss = forward_backward(x[r * B : (r + 1) * B], y[r * B : (r + 1) * B])
        grads = tfsift.allreduce([g.accumulate() for g in grads])
        if grads:  # the solver may give a stage only the reshape
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        losses.append(float(loss.reduce_mean()))
    plain = [int(v) for v in tfsift.shard(tf.data.Dataset.range(16)).take(3)]
    shuffled = [int(v) for v in tfsift.shard(tf.data.Dataset.range(64), 64, seed=3).take(8)]
    order = gradient_map(ref, model)
    errors = [
        rel_error(v.numpy(), final[i])
        for v, i in zip(model.trainable_variables, order, strict=True)
    ]
    report(
        rank=tfsift.rank(),
        host=socket.gethostname(),  # a simulated host's name when run on them
        stage=tfsift.mp_rank(),
        replica=r,
        pipeline=runtime.get().config.pipeline,
        virtual=model.partitioned.virtual_stages,  # type: ignore[union-attr]
        mp_size=tfsift.mp_size(),
        dp_size=R,
        shard=plain,
        shuffled=shuffled,
        weight_error=max(errors, default=0.0),
        num_vars=len(errors),
        losses=losses,
        dp_set=getattr(tfsift.dp_process_set(), "ranks", None),
        mp_set=getattr(tfsift.mp_process_set(), "ranks", None),
    )


if __name__ == "__main__":
    main()
