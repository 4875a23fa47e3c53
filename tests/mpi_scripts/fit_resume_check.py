"""fit(x, y) on shuffled arrays with tfsift.callbacks.BackupAndRestore, a rank killed with
SIGKILL mid-run, and the same command run again: it must end with the uninterrupted
run's weights, bitwise.

usage: fit_resume_check.py DIR MODE   (1 stage x 2 replicas)
  MODE "killed": trains the uninterrupted run first (its weights to DIR/whole-rank<r>.npy),
      then the same fit with a backup in DIR/backup, rank 1 killing itself in epoch 3
      (after the backup of epoch 2); the job never ends normally.
  MODE "resumed": the same fit with the backup again; reports its weights, the
      uninterrupted run's and the epochs it trained.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np

import tfsift
from mpi import report

N, B, EPOCHS, KILL_EPOCH, SEED = 96, 8, 4, 2, 5  # KILL_EPOCH: Keras' 0-based index


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(12, activation="relu")
        self.drop = keras.layers.Dropout(0.25)  # its seed state is restored too
        self.b = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.b(self.drop(self.a(x)))


class Kill(keras.callbacks.Callback):
    """Rank 1 dies as ``kill -9`` would kill it, in the middle of epoch ``KILL_EPOCH``."""

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self._epoch == KILL_EPOCH and batch == 2 and tfsift.rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch = epoch


def fit(callbacks: list[keras.callbacks.Callback]) -> tuple[Net, Any]:
    keras.utils.set_random_seed(SEED)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)
    model = Net()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(0.02), loss=loss)
    # shuffle=True (Keras' default): each epoch permutes the rows before the replicas' deal
    history = model.fit(x, y, batch_size=B, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    return model, history


def weights(model: Net) -> np.ndarray:
    return np.concatenate([np.ravel(v.numpy()) for v in model.trainable_variables])


def main() -> None:
    directory, mode = Path(sys.argv[1]), sys.argv[2]
    tfsift.init({"partitions": 1, "microbatches": 2})
    mine = directory / f"whole-rank{tfsift.rank()}.npy"
    backup = tfsift.callbacks.BackupAndRestore(directory / "backup")
    if mode == "killed":
        np.save(mine, weights(fit([])[0]))
        fit([backup, Kill()])
        raise SystemExit("rank 1 was to be killed in epoch 3")
    model, history = fit([backup])
    report(
        rank=tfsift.rank(),
        epochs=len(history.history["loss"]),
        weights=weights(model).tolist(),
        whole=np.load(mine).tolist(),
    )


if __name__ == "__main__":
    main()
