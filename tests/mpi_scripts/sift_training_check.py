"""Every rank: sift by the losses of the training pass (scores="training"); report the table.

usage: sift_training_check.py K POLICY [POLICY ...]
  K stages; the other ranks are replicas. POLICY "relative", "infobatch",
  "infobatch_rows" (InfoBatch on tfsift.from_arrays, planned by row) or "infobatch_load"
  (the same on tfsift.from_rows, each batch read by a load function): each runs in
  turn in this one job (a new model from the same seed), reported in order. Three epochs
  of a dataset shuffled before it is sharded, so that a sample trained on one replica
  comes to another the next epoch. Each rank reports the batches it yielded, the losses
  it recorded, its score table by sample id, its policy's state, and how often a scorer
  was called (never, with training scores).
"""

from __future__ import annotations

import sys
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift
from mpi import report
from tfsift.sift import scorer as scorer_module
from tfsift.sift.stale import ScoreCache

N, B, EPOCHS, SEED = 256, 16, 3, 5
PER_SAMPLE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(16, activation="tanh")
        self.drop = keras.layers.Dropout(0.3)  # training losses differ from forward ones
        self.b = keras.layers.Dense(8, activation="tanh")
        self.c = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.c(self.b(self.drop(self.a(x))))


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 4)).astype(np.float32)
    x[:, 0] = np.arange(N) / 1000  # the sample id rides along in the features
    return x, rng.integers(0, 3, N)


def ids(x: Any) -> list[int]:
    return [round(float(v) * 1000) for v in np.asarray(x)[:, 0]]


def count_scorer_calls() -> list[int]:
    """Counts the calls of every scorer (each would run a scoring forward)."""
    calls = [0]
    for cls in (scorer_module.FullScorer, scorer_module.StepScorer, scorer_module.NoScorer):
        original = cls.__call__

        def counted(self: Any, element: Any, original: Any = original) -> Any:
            calls[0] += 1
            return original(self, element)

        cls.__call__ = counted  # type: ignore[method-assign]
    return calls


def table_by_id(cache: ScoreCache, by_row: bool) -> dict[int, list[float]]:
    """The score table as {sample id: [loss, epoch]}, from the samples' fingerprints (or
    rows, which are the ids)."""
    keys = np.arange(N, dtype=np.float64)
    if not by_row:
        keys = ScoreCache(1).fingerprints(list(data()))  # the projection the sifter's uses
    state = cache.state()
    at = {float(k): i for i, k in enumerate(state["keys"])}
    return {
        i: [float(state["losses"][at[k]]), int(state["epochs"][at[k]])]
        for i, k in enumerate(keys.tolist())
        if k in at
    }


def main() -> None:
    tfsift.init({"partitions": int(sys.argv[1]), "microbatches": 2, "profile_repeats": 1})
    calls = count_scorer_calls()
    report(rank=tfsift.rank(), cases=[run_case(policy, calls) for policy in sys.argv[2:]])


def run_case(policy: str, calls: list[int]) -> dict[str, Any]:
    calls[0] = 0
    keras.utils.set_random_seed(SEED)
    model = Net()
    gathered: list[int] = []  # the rows a from_arrays or from_rows source read
    by_row = policy in ("infobatch_rows", "infobatch_load")
    if policy == "infobatch_rows":
        source = tfsift.from_arrays(data(), B, seed=SEED)
        gather = source.gather
        source.gather = lambda rows: (gathered.extend(rows.tolist()), gather(rows))[1]
    elif policy == "infobatch_load":
        arrays = data()

        def load(rows: np.ndarray) -> Any:
            gathered.extend(rows.tolist())
            return tuple(a[rows] for a in arrays)

        source = tfsift.from_rows(load, N, B, seed=SEED)
        gathered.clear()  # the first batch's rows, read when it was made
    if by_row:
        policy = "infobatch"
    else:
        shuffled = tf.data.Dataset.from_tensor_slices(data()).shuffle(N, seed=SEED)
        source = tfsift.shard(shuffled).batch(B, drop_remainder=True)
    fields: dict[str, Any] = {"policy": policy, "scores": "training", "stale": 1, "seed": SEED}
    if policy == "infobatch":
        fields.update(stale=EPOCHS, epochs=EPOCHS, anneal=0.0, rescale="unbiased")
    else:
        fields.update(beta=1.0, history=64)
    train = source.apply(tfsift.sift(config=tfsift.SiftConfig(**fields)))
    optimizer = keras.optimizers.SGD(0.1)

    @tfsift.step
    def step(xb: tf.Tensor, yb: tf.Tensor) -> Any:
        losses = PER_SAMPLE(yb, model(xb, training=True))
        grads = tfsift.gradients(tf.reduce_mean(losses), model.trainable_variables)
        return grads, losses

    batches: list[list[list[int]]] = []
    recorded: list[tuple[int, float, int]] = []  # (id, loss, epoch)
    for epoch in range(1, EPOCHS + 1):
        batches.append([])
        for xb, yb, *_ in train:
            grads, losses = step(xb, yb)
            grads = tfsift.allreduce(grads)
            if grads:
                optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            train.record(losses)
            batches[-1].append(ids(xb))
            values = losses.concat().numpy().tolist()
            recorded += [(i, v, epoch) for i, v in zip(ids(xb), values, strict=True)]
    sifter = train.sifter
    rounds = getattr(sifter, "rounds", sifter)  # a streaming sifter's rounds hold them
    assert rounds.recorder is not None
    rounds.recorder.merge(sifter._group)  # the last epoch's records (collective)
    policy_state = rounds.policy.state()
    return dict(
        rank=tfsift.rank(),
        stage=tfsift.mp_rank(),
        replica=tfsift.dp_rank(),
        batches=batches,
        recorded=recorded,
        table=table_by_id(rounds.recorder.cache, by_row),
        gathered=gathered,
        policy={k: np.asarray(v).tolist() for k, v in _flat(policy_state).items()},
        scorer_calls=calls[0],
        metrics={k: v for k, v in tfsift.sift_metrics().items() if isinstance(v, (int, float))},
    )


def _flat(state: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


if __name__ == "__main__":
    main()
