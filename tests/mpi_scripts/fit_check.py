"""Every rank: model.fit against the README's @tfsift.step loop, and Keras' callbacks
(ModelCheckpoint, CSVLogger, EarlyStopping) and tfsift's BackupAndRestore; report what
each rank saw.

usage: fit_check.py K    (partitions; the world's other factor is data-parallel replicas)
  Runs in the shared 2-rank jobs (tests/mpi.py), which hold one stdout for every scenario:
  each rank reports what it printed.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift
from mpi import REPORTS, report

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
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=100.0, patience=1, verbose=1)
    history = model.fit(dataset(0), epochs=10, validation_data=dataset(1), callbacks=[stop])
    return len(history.history["loss"])


def sifted_history(K: int) -> dict[str, list[float]]:
    keras.utils.set_random_seed(SEED)
    model = Net(K)
    model.compile(optimizer="adam", loss=LOSS, metrics=["accuracy"])
    config = tfsift.SiftConfig(policy="big_loss", keep=0.5)
    history: dict[str, list[float]] = model.fit(dataset(0), epochs=2, sift=config).history
    return history


class Interrupt(keras.callbacks.Callback):
    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if epoch == 1:
            raise KeyboardInterrupt("stopped after epoch 1")


class StopsAlone(keras.callbacks.Callback):
    """Stops training on rank ``who`` only (a time budget, a file one host sees): at batch
    ``batch`` of epoch 1, or (batch None) at the end of epoch 1."""

    def __init__(self, batch: int | None, who: int) -> None:
        super().__init__()
        self.batch, self.epoch, self.batches = batch, 0, 0
        self.alone = tfsift.rank() == who

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.batches += 1
        if self.alone and self.batch is not None and (self.epoch, batch) == (1, self.batch):
            self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.alone and self.batch is None and epoch == 1:
            self.model.stop_training = True


def stopped_alone(K: int) -> dict[str, Any]:
    """A callback that stops rank 1 alone at a batch, then rank 0 alone at an epoch's end:
    the epochs and batches each rank trained (both waited for the one that stopped until
    the timeout before). And ModelCheckpoint given to rank 0 only: the error."""
    found: dict[str, Any] = {}
    for case, batch, who in (("at_batch", 2, 1), ("at_epoch", None, 0)):
        stop = StopsAlone(batch, who)
        history = adam_model(K).fit(dataset(1), epochs=EPOCHS, verbose=0, callbacks=[stop])
        found[case] = [len(history.history["loss"]), stop.batches]
    best = keras.callbacks.ModelCheckpoint(
        str(Path(os.environ[REPORTS]) / "alone.keras"), "loss", save_best_only=True
    )
    try:
        adam_model(K).fit(
            dataset(1), epochs=1, verbose=0,
            callbacks=[best, keras.callbacks.CSVLogger(os.devnull)] if tfsift.rank() == 0 else [],
        )  # fmt: skip
    except ValueError as error:
        found["rank_0_checkpoint"] = str(error)
    keras.utils.set_random_seed(SEED)
    own_rate = Net(K)  # a learning rate of each rank's own: each stage trained at its own
    own_rate.compile(optimizer=keras.optimizers.Adam(0.05 * (1 + tfsift.rank())), loss=LOSS)
    try:
        own_rate.fit(dataset(1), epochs=1, verbose=0)
    except ValueError as error:
        found["own_learning_rate"] = str(error)
    for case, start in (("schedule", 0.05), ("own_schedule", 0.05 * (1 + tfsift.rank()))):
        model = Net(K)  # a schedule Keras cannot serialize (no get_config) trains as in Keras
        model.compile(optimizer=keras.optimizers.Adam(Halving(start)), loss=LOSS)
        try:
            found[case] = len(model.fit(dataset(1), epochs=1, verbose=0).history["loss"])
        except ValueError as error:
            found[case] = str(error)
    decayed = keras.optimizers.AdamW(0.05, weight_decay=0.1)
    if tfsift.rank() == 0:  # each stage decayed its own choice of weights, without a word
        decayed.exclude_from_weight_decay(var_names=["bias"])
    own_exclusions = Net(K)
    own_exclusions.compile(optimizer=decayed, loss=LOSS)
    try:
        own_exclusions.fit(dataset(1), epochs=1, verbose=0)
    except ValueError as error:
        found["own_exclusions"] = str(error)
    shorter = dataset(1).take(2 + tfsift.rank())  # shards of other lengths, by hand
    try:  # the longer waited for the other in the gradients' average until the timeout
        adam_model(K).fit(shorter, epochs=1, verbose=0)
    except ValueError as error:
        found["other_lengths"] = str(error)
    for case, freq in (
        ("histograms", {"histogram_freq": 1}),
        ("embeddings", {"embeddings_freq": 1}),
    ):
        board = keras.callbacks.TensorBoard(str(Path(os.environ[REPORTS]) / f"board{K}"), **freq)
        try:  # rank 0 alone cannot read stage 1's weights, nor save_weights without the others
            found[case] = len(adam_model(K).fit(dataset(1), epochs=1, verbose=0,
                                                callbacks=[board]).history["loss"])  # fmt: skip
        except ValueError as error:
            found[case] = str(error)
    return found


class Halving(keras.optimizers.schedules.LearningRateSchedule):  # type: ignore[misc]
    """``start / (1 + step)``, without the get_config Keras needs only to save it."""

    def __init__(self, start: float) -> None:
        self.start = start

    def __call__(self, step: Any) -> Any:
        return self.start / (1.0 + keras.ops.cast(step, "float32"))


def adam_model(K: int) -> Net:
    keras.utils.set_random_seed(SEED)
    model = Net(K)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=LOSS)
    return model


def with_callbacks(K: int, out: Path) -> dict[str, Any]:
    """ModelCheckpoint (best .keras, weights each epoch), CSVLogger, EarlyStopping's message
    and tfsift's BackupAndRestore on every rank; what they left behind."""
    rank = tfsift.rank()
    model = adam_model(K)
    best = keras.callbacks.ModelCheckpoint(out / "best.keras", "loss", save_best_only=True)
    each = keras.callbacks.ModelCheckpoint(out / "w-{epoch}.weights.h5", save_weights_only=True)
    csv = keras.callbacks.CSVLogger(str(out / f"log-rank{rank}.csv"))
    stop = keras.callbacks.EarlyStopping("loss", min_delta=100.0, patience=1, verbose=1)
    model.fit(dataset(1), epochs=EPOCHS, verbose=0, callbacks=[best, each, csv, stop])
    x = np.concatenate([x for x, _ in dataset(1)])
    want = model.predict(x, batch_size=B, verbose=0)
    loaded = adam_model(K)
    loaded.predict(x, batch_size=B, verbose=0)  # partitions it
    loaded.load_weights(out / "w-2.weights.h5")  # collective, as the save was
    found = {
        "files": sorted(p.name for p in out.iterdir()),
        "weights_file_error": float(
            np.max(np.abs(loaded.predict(x, batch_size=B, verbose=0) - want))
        ),
    }
    if rank == 0:  # a plain Keras model, anywhere
        plain = keras.saving.load_model(out / "best.keras")
        found["keras_file_error"] = float(np.max(np.abs(plain.predict(x, verbose=0) - want)))

    whole = adam_model(K)
    whole.fit(dataset(1), epochs=EPOCHS, verbose=0)
    backup = out / "backup"
    try:
        adam_model(K).fit(
            dataset(1), epochs=EPOCHS, verbose=0,
            callbacks=[tfsift.callbacks.BackupAndRestore(backup), Interrupt()],
        )  # fmt: skip
    except KeyboardInterrupt:
        found["backed_up"] = sorted(p.name for p in backup.iterdir() if p.name.startswith("ckpt"))
    resumed = adam_model(K)
    history = resumed.fit(
        dataset(1), epochs=EPOCHS, verbose=0,
        callbacks=[tfsift.callbacks.BackupAndRestore(backup)],
    )  # fmt: skip
    pairs = zip(resumed.trainable_variables, whole.trainable_variables, strict=True)
    found["resumed_epochs"] = len(history.history["loss"])
    found["resumed_weight_diff"] = max(float(np.max(np.abs(a - b))) for a, b in pairs)
    found["backup_left"] = backup.exists()
    found.update(sifted_backup(K, out / "sifted-backup"))
    return found


def sifted_backup(K: int, backup: Path) -> dict[str, Any]:
    """fit(sift=relative) stopped after epoch 1 and resumed with BackupAndRestore: the
    loss history, the policy's draws and the optimizer go on as if never stopped."""
    config = tfsift.SiftConfig(policy="relative", beta=1.0, history=64, seed=SEED)
    whole = adam_model(K)
    want = whole.fit(dataset(1), epochs=EPOCHS, verbose=0, sift=config).history["loss"]
    try:
        adam_model(K).fit(
            dataset(1), epochs=EPOCHS, verbose=0, sift=config,
            callbacks=[tfsift.callbacks.BackupAndRestore(backup), Interrupt()],
        )  # fmt: skip
    except KeyboardInterrupt:
        pass
    resumed = adam_model(K)
    got = resumed.fit(
        dataset(1), epochs=EPOCHS, verbose=0, sift=config,
        callbacks=[tfsift.callbacks.BackupAndRestore(backup)],
    ).history["loss"]  # fmt: skip
    pairs = zip(resumed.trainable_variables, whole.trainable_variables, strict=True)
    return {
        "sifted_resumed_losses": [got, want[len(want) - len(got) :]],
        "sifted_resumed_weight_diff": max(float(np.max(np.abs(a - b))) for a, b in pairs),
    }


class Printed(io.StringIO):
    """What this rank prints (Keras' progress and callbacks write to ``sys.stdout``), kept
    for the report and still printed, for the job's output when a check fails."""

    def write(self, text: str) -> int:
        if sys.__stdout__ is not None:
            sys.__stdout__.write(text)
        return super().write(text)

    def flush(self) -> None:
        if sys.__stdout__ is not None:
            sys.__stdout__.flush()


def main() -> None:
    with contextlib.redirect_stdout(Printed()) as printed:
        found = checks(int(sys.argv[1]))
    report(**found, printed=printed.getvalue())


def checks(K: int) -> dict[str, Any]:
    out = Path(os.environ[REPORTS]) / "callbacks"
    out.mkdir(exist_ok=True)
    tfsift.init({"partitions": K, "microbatches": M, "auto_partition": False})
    fitted, history, evaluated, predicted = with_fit(K)
    looped = with_step_loop(K)
    pairs = zip(fitted.trainable_variables, looped.trainable_variables, strict=True)
    diff = max(float(np.max(np.abs(a.numpy() - b.numpy()))) for a, b in pairs)
    return dict(
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
        callbacks=with_callbacks(K, out),
        stopped_alone=stopped_alone(K),
        unheld=unheld(fitted),
    )


def unheld(model: Net) -> dict[str, list[str]]:
    """What reading or assigning the weights of a layer of another stage says, on this rank
    (Keras said "'NoneType' object is not callable"); the paths of the kernels tried (the
    layers' names are numbered by the models the job's process made before)."""
    said = []
    for use in (model.a.get_weights, lambda: model.c.kernel.assign(np.zeros((16, 3)))):
        try:
            use()
        except ValueError as error:
            said.append(str(error))
    return {"paths": [model.a.kernel.path, model.c.kernel.path], "said": said}


if __name__ == "__main__":
    main()
