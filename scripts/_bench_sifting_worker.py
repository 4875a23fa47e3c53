"""One job of ``scripts/bench_sifting_epochs.py``: trains one task and seed with each method.

Every rank runs one compute thread and reports, per method, the held-out metric at each
evaluation (every ``eval_every`` optimizer steps, the training clock stopped) with the
training seconds, optimizer steps and samples so far, and ``tfsift.sift_metrics()`` at the
end. With training scores each step hands its per-sample losses (unweighted; on every
rank) back to the sifted dataset with ``record``, on the clock; with InfoBatch's weights
the step's loss is the mean of weight x loss.
"""

from __future__ import annotations

import tensorflow as tf

# One compute thread per rank, fixed before any TensorFlow op runs.
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfsift  # noqa: E402
from bench import harness  # noqa: E402

Config = dict[str, Any]
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def mnist1d(task: Config, cache: Path) -> Arrays:
    """MNIST-1D, generated once, then cached."""
    path = cache / f"mnist1d-{task['samples']}-{task['data_seed']}.npz"
    if not path.exists():
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.num_samples, args.seed = task["samples"], task["data_seed"]
        data = make_dataset(args)
        cache.mkdir(parents=True, exist_ok=True)
        np.savez(path, x=data["x"], y=data["y"], x_test=data["x_test"], y_test=data["y_test"])
    d = np.load(path)
    return d["x"], d["y"], d["x_test"], d["y_test"]


def digits(task: Config, cache: Path) -> Arrays:
    """scikit-learn's 8x8 digits, pixels / 16, a stratified 80/20 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    split = train_test_split(x / 16.0, y, test_size=0.2, stratify=y, random_state=task["data_seed"])
    return split[0], split[2], split[1], split[3]


def friedman(task: Config, cache: Path) -> Arrays:
    """Friedman #1 regression (10 features, 5 informative, Gaussian noise), y standardised."""
    from sklearn.datasets import make_friedman1

    x, y = make_friedman1(task["samples"], n_features=10, noise=1.0, random_state=task["data_seed"])
    y = (y - y.mean()) / y.std()
    cut = int(0.8 * len(x))
    return x[:cut], y[:cut, None], x[cut:], y[cut:, None]


LOADERS: dict[str, Callable[[Config, Path], Arrays]] = {
    "mnist1d": mnist1d, "digits": digits, "friedman": friedman,
}  # fmt: skip


def load(task: Config, seed: int, cache: Path) -> Arrays:
    """The task's arrays, ``noise`` of the training labels replaced by another class."""
    x, y, x_test, y_test = LOADERS[task["data"]](task, cache)
    if task.get("noise", 0.0) > 0:
        classes, rng = int(y.max()) + 1, np.random.default_rng([seed, 13])
        flip = rng.random(len(y)) < task["noise"]
        y = y.copy()
        y[flip] = (y[flip] + rng.integers(1, classes, flip.sum())) % classes
    label = np.float32 if task["loss"] == "mse" else np.int32
    return x.astype(np.float32), y.astype(label), x_test.astype(np.float32), y_test.astype(label)


class ConvNet1D(tfsift.DistributedModel):
    """``layers`` x Conv1D(width, 5, same, relu) on a (length, 1) signal, then two Dense."""

    def __init__(self, length: int, width: int, layers: int, hidden: int, out: int) -> None:
        super().__init__()
        self.reshape = keras.layers.Reshape((length, 1))
        self.convs = [
            keras.layers.Conv1D(width, 5, padding="same", activation="relu", name=f"conv{i}")
            for i in range(layers)
        ]
        self.flatten = keras.layers.Flatten()
        self.hidden = keras.layers.Dense(hidden, activation="relu")
        self.head = keras.layers.Dense(out)

    def call(self, x: Any) -> Any:
        h = self.reshape(x)
        for conv in self.convs:
            h = conv(h)
        return self.head(self.hidden(self.flatten(h)))


class MLP(tfsift.DistributedModel):
    """Dense(width, relu) x ``layers``, then Dense(out)."""

    def __init__(self, width: int, layers: int, out: int) -> None:
        super().__init__()
        self.blocks = [keras.layers.Dense(width, activation="relu") for _ in range(layers)]
        self.head = keras.layers.Dense(out)

    def call(self, x: Any) -> Any:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Run:
    """Trains one fresh model with one method and records the held-out curve."""

    def __init__(self, job: Config, method: Config, data: Arrays) -> None:
        self.job, self.task, self.method = job, job["task"], method
        self.off_clock: list[float] = []  # one-time seconds taken off the clock
        keras.utils.set_random_seed(job["seed"])  # the same initial weights for every method
        self.x, self.y, self.x_test, self.y_test = data
        spec, out = self.task["model"], 1 if self.task["loss"] == "mse" else 10
        if spec["kind"] == "cnn":
            args = (self.x.shape[1], spec["width"], spec["layers"], spec["hidden"], out)
            self.model: tfsift.DistributedModel = ConvNet1D(*args)
        else:
            self.model = MLP(spec["width"], spec["layers"], out)
        if self.task["loss"] == "mse":
            self.loss = keras.losses.MeanSquaredError(reduction=None)
        else:
            self.loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        self.optimizer = keras.optimizers.Adam(self.task["lr"])
        self.config = self.sift_config() if method["policy"] != "none" else None
        self.recording = self.config is not None and self.config.scores == "training"
        self.weighted = self.config is not None and self.config.rescale is not None
        self.train_step, self.predict = self._steps()
        self.apply = tf.function(self._apply)  # eager Adam costs more than a small model's step
        self.sifted: Any = None  # the sifted dataset, which records (scores="training")
        self.clock_total, self.clock_since = 0.0, None  # training seconds: between start and stop
        self.steps = self.samples = 0
        self.curve: list[list[float]] = []

    def _steps(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        model, loss, per_sample = self.model, self.loss, self.recording

        @tfsift.step
        def train_step(x: tf.Tensor, y: tf.Tensor, *weight: tf.Tensor) -> Any:
            """Gradients of the mean loss (of weight x loss with weights); returns the
            per-sample losses, unweighted, with training scores (else their mean)."""
            losses = loss(y, model(x, training=True))
            mean = keras.ops.mean(losses * weight[0] if weight else losses)
            grads = tfsift.gradients(mean, model.trainable_variables)
            return grads, losses if per_sample else mean

        @tfsift.step
        def predict(x: tf.Tensor) -> Any:
            return model(x, training=False)

        return train_step, predict

    def _apply(self, grads: list[tf.Tensor]) -> None:
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))

    def start(self) -> None:
        self.clock_since = time.perf_counter()

    def stop(self) -> None:
        assert self.clock_since is not None
        self.clock_total += time.perf_counter() - self.clock_since
        self.clock_since = None

    def now(self) -> float:
        since = self.clock_since
        return self.clock_total + (time.perf_counter() - since if since is not None else 0.0)

    def dataset(self) -> tf.data.Dataset:
        # the data order's seed; the initial weights are the job's seed's in every run
        B, seed = self.task["batch"], self.job["seed"] + self.method.get("order", 0)
        if self.method.get("source") == "arrays":  # batches gathered by row
            train = tfsift.from_arrays((self.x, self.y), B, seed=seed)
        else:
            rows = tf.data.Dataset.from_tensor_slices((self.x, self.y))
            source = tfsift.shard(rows, len(self.x), seed)
            train = source.batch(B, drop_remainder=True).prefetch(2)
        if self.config is None:
            return train
        self.sifted = train.apply(tfsift.sift(self.model, self.loss, self.config))
        return self.sifted

    def sift_config(self) -> tfsift.SiftConfig:
        """The method's config; ``scores``, ``stale`` and the sample weights are what
        ``SiftConfig`` implies from the policy."""
        m = self.method
        return tfsift.SiftConfig(
            policy=m["policy"], delay=self.task["delay"], score_batches=self.job["score_batches"],
            seed=self.job["seed"], prune=float(m["prune"]), anneal=float(m["anneal"]),
            epochs=self.task["epochs"] if m["policy"] == "infobatch" else None,
        )  # fmt: skip

    def evaluate(self) -> float:
        """Held-out accuracy, or mean squared error; every rank runs the same batches."""
        M, n = self.job["microbatches"], len(self.x_test)
        chunk = max(M, (min(1000, n) // M) * M)
        outputs, used = [], 0
        while n - used >= M:
            size = min(chunk, (n - used) // M * M)
            logits = self.predict(tf.constant(self.x_test[used : used + size])).concat()
            outputs.append(logits.numpy())
            used += size
        pred, truth = np.concatenate(outputs), self.y_test[:used]
        if self.task["loss"] == "mse":
            return float(np.mean((pred - truth) ** 2))
        return float(np.mean(np.argmax(pred, axis=-1) == truth))

    def record(self) -> None:
        self.curve.append([self.now(), self.steps, self.samples, self.evaluate()])

    def train(self) -> Config:
        """Traces the training step and the update once, outside the clock (the update
        applies zero gradients, which moves Adam's weights by 0), then trains the task's
        epochs."""
        B = self.task["batch"]
        train = self.dataset()
        x, y = self.x[:B], self.y[:B]
        weight = [tf.ones(len(x))] if self.weighted else []
        grads = tfsift.allreduce(self.train_step(tf.constant(x), tf.constant(y), *weight)[0])
        if grads:
            self.apply([tf.zeros_like(g) for g in grads])
        self.record()
        self.start()
        for _ in range(self.task["epochs"]):
            for batch in self.batches(train):
                self.step(*batch)
                if self.steps % self.task["eval_every"] == 0:  # equal on every rank
                    self.stop()
                    self.record()
                    self.start()
        self.stop()
        if self.curve[-1][1] != self.steps:
            self.record()
        metrics = tfsift.sift_metrics() if self.method["policy"] != "none" else {}
        sift = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
        return {"method": self.method["name"], "epochs": self.task["epochs"], "curve": self.curve,
                "off_clock_s": self.off_clock, "sift": sift}  # fmt: skip

    def batches(self, train: tf.data.Dataset) -> Iterator[tuple[tf.Tensor, ...]]:
        """``train``'s batches, ``(x, y)`` or ``(x, y, weight)``, with one-time work taken off
        the clock (and kept): the first request (the shuffle buffer's first fill) and the
        one that ran the first scoring round (tracing the scoring step)."""
        iterator = iter(train)
        while True:
            start = time.perf_counter()
            batch = next(iterator, None)
            if batch is None:
                return
            if not self.off_clock or self.first_scoring():
                self.off_clock.append(time.perf_counter() - start)
                self.clock_total -= self.off_clock[-1]
            yield batch

    def first_scoring(self) -> bool:
        if self.method["policy"] == "none" or len(self.off_clock) > 1:
            return False
        return bool(tfsift.sift_metrics().get("samples_scored", 0))

    def step(self, x: tf.Tensor, y: tf.Tensor, *weight: tf.Tensor) -> None:
        grads, losses = self.train_step(x, y, *weight)
        if self.recording:  # the batch's per-sample losses (a StepOutput, on every rank)
            self.sifted.record(losses)
        grads = tfsift.allreduce(grads)
        if grads:
            self.apply(grads)
        self.steps += 1
        self.samples += int(x.shape[0])


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    # the schedule its tables were measured with, before "auto" became the default
    tfsift.init({"partitions": job["partitions"], "microbatches": job["microbatches"],
                 "pipeline": "interleaved"})  # fmt: skip
    data = load(job["task"], job["seed"], Path(job["cache"]))
    results: list[Config] = []
    for method in job["methods"]:
        start = time.perf_counter()
        result = Run(job, method, data).train() | {"wall_s": time.perf_counter() - start}
        results.append(result)
        if tfsift.rank() == 0:
            last = result["curve"][-1]
            print(f"  {job['task']['name']} seed {job['seed']} {result['method']}: "
                  f"{last[0]:.1f} s, {last[1]} steps, metric {last[3]:.4f}", file=sys.stderr,
                  flush=True)  # fmt: skip
    harness.write_rank(tfsift.rank(), {"job": job, "rank": tfsift.rank(), "results": results})
