"""Input pipelines for data-parallel replicas."""

from __future__ import annotations

import tensorflow as tf

from tfsift.parallel import runtime


def shard(dataset: tf.data.Dataset, shuffle_buffer: int = 0, seed: int = 0) -> tf.data.Dataset:
    """Gives each data-parallel replica its own shard; every stage of a pipeline gets the same one.

    Args:
        dataset: unbatched or batched dataset; sharding is by element.
        shuffle_buffer: if positive, shuffle each shard with this buffer and the seed
            ``seed + dp_rank``.
        seed: base shuffle seed.
    """
    rt = runtime.get()
    replicas, replica = rt.topology.replicas, rt.replica
    out = dataset.shard(replicas, replica) if replicas > 1 else dataset
    if shuffle_buffer > 0:
        out = out.shuffle(shuffle_buffer, seed=seed + replica, reshuffle_each_iteration=True)
    return out
