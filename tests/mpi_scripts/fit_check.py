"""Every rank: model.fit against the README's @tfsift.step loop; report what each rank saw.

usage: fit_check.py K    (partitions; the world's other factor is data-parallel replicas)
"""

from __future__ import annotations

import sys
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift
from mpi import report

N, B, M, SEED, EPOCHS = 128, 16, 2, 11, 3
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Net(tfsift.DistributedModel):
    def __init__(self, K: int) -> None:
        super().__init__()
        with tfsift.partition(0):
            self.a = keras.layers.Dense(16, activation="relu")
            self.drop = keras.layers.Dropout(0.2)  # the masks must match the loop's too
        with tfsift.partition(K - 1):
            self.b = keras.layers.Dense(16, activation="tanh")
            self.c = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.c(self.b(self.drop(self.a(x))))


def dataset(part: int) -> tf.data.Dataset:
    """``part`` 0: training data (sharded, reshuffled each epoch), 1: validation data."""
    rng = np.random.default_rng(part)
    x = rng.normal(size=(N, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)
    ds = tfsift.shard(tf.data.Dataset.from_tensor_slices((x, y)))
    if part == 0:
        ds = ds.shuffle(N, seed=SEED)
    return ds.batch(B, drop_remainder=True)


def lr(epoch: int, _: float = 0.0) -> float:
    return 0.05 / (epoch + 1)


def with_fit(K: int) -> tuple[Net, Any, Any, Any]:
    keras.utils.set_random_seed(SEED)
    model = Net(K)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=LOSS, metrics=["accuracy"])
    history = model.fit(
        dataset(0),
        epochs=EPOCHS,
        validation_data=dataset(1),
        callbacks=[keras.callbacks.LearningRateScheduler(lr)],
        verbose=2,
    )
    return model, history.history, model.evaluate(dataset(1), verbose=0), model.predict(dataset(1))


def with_step_loop(K: int) -> Net:
    keras.utils.set_random_seed(SEED)
    model = Net(K)
    optimizer = keras.optimizers.Adam(0.05)

    @tfsift.step
    def forward_backward(x: tf.Tensor, y: tf.Tensor) -> Any:
        loss = LOSS(y, model(x, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    train = dataset(0)
    for epoch in range(EPOCHS):
        optimizer.learning_rate = lr(epoch)
        for x, y in train:
            grads = tfsift.allreduce(forward_backward(x, y)[0])
            if grads:
                optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return model


def early_stopped_epochs(K: int) -> int:
    keras.utils.set_random_seed(SEED)
    model = Net(K)
    model.compile(optimizer="adam", loss=LOSS)
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=100.0, patience=1)
    history = model.fit(dataset(0), epochs=10, validation_data=dataset(1), callbacks=[stop])
    return len(history.history["loss"])


def sifted_history(K: int) -> dict[str, list[float]]:
    keras.utils.set_random_seed(SEED)
    model = Net(K)
    model.compile(optimizer="adam", loss=LOSS, metrics=["accuracy"])
    config = tfsift.SiftConfig(policy="big_loss", keep=0.5)
    history: dict[str, list[float]] = model.fit(dataset(0), epochs=2, sift=config).history
    return history


def main() -> None:
    K = int(sys.argv[1])
    tfsift.init({"partitions": K, "microbatches": M, "auto_partition": False})
    fitted, history, evaluated, predicted = with_fit(K)
    looped = with_step_loop(K)
    pairs = zip(fitted.trainable_variables, looped.trainable_variables, strict=True)
    diff = max(float(np.max(np.abs(a.numpy() - b.numpy()))) for a, b in pairs)
    report(
        rank=tfsift.rank(),
        stage=tfsift.mp_rank(),
        replica=tfsift.dp_rank(),
        history=history,
        evaluated=evaluated,
        predicted=predicted.tolist(),
        variables=len(fitted.trainable_variables),
        max_weight_diff=diff,
        early_stopped_epochs=early_stopped_epochs(K),
        sifted=sifted_history(K),
        kept_fraction=tfsift.sift_metrics()["kept_fraction"],
    )


if __name__ == "__main__":
    main()
