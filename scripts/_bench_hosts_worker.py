"""One rank of ``scripts/bench_hosts.py``: a 2-stage x 2-replica step, timed, and the bytes
its host sent and received on the simulated hosts' link meanwhile.

usage: _bench_hosts_worker.py CONFIG_JSON  (run by bench_hosts.py's harness, under
       ``scripts/simhosts.sh exec``)

The model is a chain of ``layers`` Dense(width) layers, relu, MSE, SGD; stage 0 holds the
first half (``tfsift.partition``), so every placement cuts it at the same place. Each
rank reports the steps' times (the slowest rank's, steps started together), its host's
name and the link's byte counters (``/sys/class/net/tfsift0/statistics``, which a process
in a simulated host's namespace sees as its host's) before and after the timed steps.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

# bench_pipeline's worker imports tfsift before mpi4py and fixes one compute thread
from _bench_pipeline_worker import LOSS, synced_time
from mpi4py import MPI

import tfsift
from bench.harness import write_rank

LINK = Path("/sys/class/net/tfsift0/statistics")


class Chain(tfsift.DistributedModel):
    """``layers`` Dense(width) layers, the first half on stage 0."""

    def __init__(self, layers: int, width: int) -> None:
        super().__init__()
        self.names = [f"dense{i}" for i in range(layers)]
        for i, name in enumerate(self.names):  # placed as assigned, one attribute each
            with tfsift.partition(0 if i < layers // 2 else 1):
                setattr(self, name, keras.layers.Dense(width, activation="relu"))

    def call(self, x: Any) -> Any:
        for name in self.names:
            x = getattr(self, name)(x)
        return x


def counters() -> dict[str, int]:
    """This host's link counters (none on a machine without the simulated link)."""
    if not LINK.exists():
        return {"tx_bytes": 0, "rx_bytes": 0}
    return {name: int((LINK / name).read_text()) for name in ("tx_bytes", "rx_bytes")}


def main() -> None:
    cfg = json.loads(sys.argv[1])
    tfsift.init(
        {
            "partitions": 2,
            "microbatches": cfg["M"],
            "placement_strategy": cfg["placement"],
            "auto_partition": False,
            "timeout": 600,
        }
    )
    rng = np.random.default_rng(tfsift.dp_rank())
    shape = (cfg["batch"], cfg["width"])
    x = tf.constant(rng.normal(size=shape).astype("float32"))
    y = tf.constant(rng.normal(size=shape).astype("float32"))
    model = Chain(cfg["layers"], cfg["width"])

    @tfsift.step
    def forward_backward(x: tf.Tensor, y: tf.Tensor) -> Any:
        loss = LOSS(y, model(x, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    forward_backward(x, y)  # partitions the model
    update = tfsift.compiled_update(keras.optimizers.SGD(1e-3), model)

    def train() -> None:
        grads, _ = forward_backward(x, y)
        update(tfsift.allreduce([g.accumulate() for g in grads]))

    for _ in range(cfg["warmup"]):
        synced_time(train, collect=False)
    MPI.COMM_WORLD.Barrier()
    before = counters()
    times = [synced_time(train, collect=False) for _ in range(cfg["steps"])]
    after = counters()
    write_rank(
        tfsift.rank(),
        {
            "rank": tfsift.rank(),
            "host": socket.gethostname(),
            "times": times,
            "bytes": {name: after[name] - before[name] for name in before},
        },
    )


if __name__ == "__main__":
    main()
