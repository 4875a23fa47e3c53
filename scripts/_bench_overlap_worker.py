"""The MPI part of ``scripts/bench_overlap.py``: one model's variants timed on 2 ranks.

Its one argument is a JSON object: bench_overlap's ``Settings`` and the job's ``convs``,
``config`` (``tfsift.init``'s), ``plan`` (the plan file), ``policy`` and ``variants``
(name: SiftConfig options, null for no sifting). Each rank writes each run's raw step
times (``harness.write_rank``); rank 0 prints each run's ms per step as it goes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from sift_mnist1d import load

import tfsift
from bench import harness

OWN_CUT = "cut for it"  # such variants share a plan file made with room for the scoring
# what sifting kept, and what overlap had: the source batches scored while stage 0 waited,
# its expected wait per step, a unit's cost there, the share of its receives that came late
METRICS = ("kept_fraction", "samples_unscored", "samples_seen", "overlapped_fraction")
METRICS += ("overlap_wait_ms", "overlap_unit_ms", "overlap_late_fraction")
Job = dict[str, Any]


class ConvNet(tfsift.DistributedModel):
    """``examples/sift_mnist1d.py``'s ConvNet1D with ``convs`` convolutions (it has 2)."""

    def __init__(self, convs: int) -> None:
        super().__init__()
        # fixed layer names: every variant of a model reuses the plan of its first
        # (plan_file), so that the variants are timed on the same cut
        self.reshape = keras.layers.Reshape((40, 1), name="reshape")
        self.first = keras.layers.Conv1D(32, 5, padding="same", activation="relu", name="conv0")
        with tfsift.partition(1):  # used only with auto_partition=False
            self.convs = [
                keras.layers.Conv1D(32, 5, padding="same", activation="relu", name=f"conv{i + 1}")
                for i in range(convs - 1)
            ]
            self.flatten = keras.layers.Flatten(name="flatten")
            self.dense1 = keras.layers.Dense(128, activation="relu", name="dense0")
            self.dense2 = keras.layers.Dense(10, name="dense1")

    def call(self, x: Any) -> Any:
        h = self.first(self.reshape(x))
        for conv in self.convs:
            h = conv(h)
        return self.dense2(self.dense1(self.flatten(h)))


def source(x: np.ndarray, y: np.ndarray, job: Job) -> tf.data.Dataset:
    """The training batches: batched from samples by tf.data (``source="samples"``), or
    slices of arrays batched beforehand (``"batches"``), which costs tf.data almost
    nothing. Either way a background thread prefetches 4 of them."""
    b = job["batch"]
    if job["source"] == "samples":
        train = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        return train.batch(b, drop_remainder=True).prefetch(4)
    n = len(x) // b * b
    batched = (x[:n].reshape(-1, b, *x.shape[1:]), y[:n].reshape(-1, b))
    return tf.data.Dataset.from_tensor_slices(batched).repeat().prefetch(4)


def sifted(train: tf.data.Dataset, model: ConvNet, per_sample: Any, name: str, job: Job) -> Any:
    """``train`` sifted as the variant says (as it is for no sifting)."""
    options = job["variants"][name]
    if options is None and name.endswith(OWN_CUT):
        # plain training on the plan made with room for scoring (plan_differences compares
        # the scoring it was made for): the source batches per step the policy reads
        from partitioner.experimental.scoring import sifted_step_time
        from tfsift import hooks

        kept = tfsift.SiftConfig(**job["policy"]).expected_kept()
        hooks.reserve_stage0(model, hooks.Reservation(1 / kept, sifted_step_time))
    if options is None:
        return train
    fixed = {"exit_after": "first", "score_batches": job["score_batches"]}
    config = tfsift.SiftConfig(**{**job["policy"], **fixed, **options})
    return train.apply(tfsift.sift(model, per_sample, config))


def time_variant(name: str, job: Job, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """One run on this rank: stage 0's last node, when the warm-up ended (``start``), each
    timed step's stamps (``t``: before ``next()``, after it, after the step, after the
    update), if it came right after a round (``after``), and the sifting metrics."""
    keras.utils.set_random_seed(0)
    model = ConvNet(job["convs"])
    per_sample = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    optimizer = keras.optimizers.Adam(1e-3)

    @tf.function  # an eager Adam update costs more than this model's step
    def apply(grads: list[tf.Tensor]) -> None:
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    @tfsift.step
    def train_step(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = keras.ops.mean(per_sample(labels, model(images, training=True)))
        return tfsift.gradients(loss, model.trainable_variables), loss

    options = job["variants"][name]
    batches, warmup = iter(sifted(source(x, y, job), model, per_sample, name, job)), job["warmup"]
    stamps: list[list[float]] = []
    rounds: list[bool] = []  # per step, whether it came right after a round
    seen = 0  # source samples the sifted dataset had read before this step's next()
    for _ in range(warmup + job["steps"]):
        t0 = time.perf_counter()
        images, labels = next(batches)
        t1 = time.perf_counter()
        grads, _ = train_step(images, labels)
        t2 = time.perf_counter()
        grads = tfsift.allreduce(grads)
        if grads:
            apply(grads)
        stamps.append([t0, t1, t2, time.perf_counter()])
        # the sifted dataset runs its rounds on this thread, inside next(): one read of
        # its counters per step, after the update
        now = tfsift.sift_metrics()["samples_seen"] if options else 0
        rounds.append(now != seen)
        seen = now
    part = model.partitioned
    assert part is not None
    metrics = tfsift.sift_metrics() if options else {}
    return {
        "stage0": part.graph.nodes[part.bounds[1] - 1].name,
        "start": stamps[warmup - 1][3],
        "t": stamps[warmup:],
        "after": rounds[warmup:],
        "metrics": {k: float(metrics[k]) for k in METRICS if k in metrics},
    }


def main() -> None:
    job: Job = json.loads(sys.argv[1])
    # one compute thread per rank (harness.ENV says so too): a rank stands in for a
    # device, and stage 0 scoring while it waits must not take a core from stage 1
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    x, y, _, _ = load(job["samples"], 0)
    names = list(job["variants"])
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r, name in harness.rotations(names, job["repeats"]):
        own = ".sift" if name.endswith(OWN_CUT) else ""  # made (once) with room for scoring
        tfsift.init({**job["config"], "plan_file": job["plan"] + own})
        runs[name].append(time_variant(name, job, x, y))
        if tfsift.rank() == 0:
            run = runs[name][-1]
            ms = (run["t"][-1][3] - run["start"]) / job["steps"] * 1e3
            print(f"  repeat {r + 1}: {name}: {ms:.1f} ms/step", flush=True)
    harness.write_rank(tfsift.rank(), runs)


if __name__ == "__main__":
    main()
