"""Every rank: overlap with the default exit, the first step before the first round; report
the cut and, on rank 0, the plan the planner made for the scoring.

usage: sift_room.py   (the plan file: plan.json in the job's reports folder)
"""

from __future__ import annotations

import os

import keras
import numpy as np
import tensorflow as tf
from sift_check import PER_SAMPLE, SEED, B, Net, data

import tfsift
from mpi import REPORTS, report
from partitioner.plan import Plan


def main() -> None:
    plan_file = f"{os.environ[REPORTS]}/plan.json"
    tfsift.init({"partitions": 2, "microbatches": 2, "profile_repeats": 1, "plan_file": plan_file})
    keras.utils.set_random_seed(SEED)
    model = Net(heavy=True)
    x, y = data()
    source = tfsift.shard(tf.data.Dataset.from_tensor_slices((x, y))).batch(B, drop_remainder=True)
    config = tfsift.SiftConfig(scorer="early_exit", overlap=True, beta=1.0, seed=SEED)
    sifted = source.apply(tfsift.sift(model, PER_SAMPLE, config))
    optimizer = keras.optimizers.SGD(0.1)

    @tfsift.step
    def step(xb: tf.Tensor, yb: tf.Tensor) -> object:
        loss = keras.ops.mean(PER_SAMPLE(yb, model(xb, training=True)))
        return tfsift.gradients(loss, model.trainable_variables), loss

    def train(xb: tf.Tensor, yb: tf.Tensor) -> None:
        grads, _ = step(xb, yb)
        grads = tfsift.allreduce(grads)
        if grads:
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    # a step before any round (as a warm-up would be): it partitions the model, and the
    # planner on rank 0 times a scoring call while the other ranks wait for the plan
    train(tf.constant(x[:B]), tf.constant(y[:B]))
    steps = 0
    for xb, yb in sifted:
        train(xb, yb)
        steps += 1
    plan = Plan.load(plan_file).to_dict() if tfsift.rank() == 0 else None
    part = model.partitioned
    assert part is not None
    report(
        rank=tfsift.rank(),
        bounds=list(part.bounds),
        plan=plan,
        steps=steps,
        overlapped=float(tfsift.sift_metrics().get("overlapped_fraction", np.nan)),
    )


if __name__ == "__main__":
    main()
