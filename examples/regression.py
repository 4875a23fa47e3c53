"""Trains a small MLP regressor (mean squared error) as a 2-stage pipeline, optionally sifted.

Run on 2 processes, one stage each (4 processes: 2 stages x 2 data-parallel replicas):

    mpirun -np 2 python examples/regression.py                    # diabetes, no sifting
    mpirun -np 2 python examples/regression.py --sift adaptive    # AdaSelection
    mpirun -np 2 python examples/regression.py --sift big_loss    # the hardest half

Offline: scikit-learn's diabetes data (442 patients, 10 features; ``--dataset friedman1``
generates Friedman's nonlinear benchmark with noise instead). Features and target are
standardised with the training split's statistics, so a model that predicts the mean
scores a test MSE of about 1; rank 0 prints that baseline and ordinary least squares'
next to the pipeline's. ``--sift POLICY`` trains on the samples a ``tfsift.SiftConfig``
policy keeps (``--keep`` of each batch after ``--delay`` batches; ``relative`` keeps
1/(1+beta) with beta=1). ``big_loss`` trains on the largest losses, which on noisy targets
are partly noise; ``adaptive`` (AdaSelection) learns how much weight to give big-loss
selection against six other methods from how much the loss falls. A sifted epoch takes
about ``--keep`` times the steps of an unsifted one.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift

Split = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class MLP(tfsift.DistributedModel):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.hidden1 = keras.layers.Dense(width, activation="relu", name="hidden1")
        self.hidden2 = keras.layers.Dense(width, activation="relu", name="hidden2")
        self.out = keras.layers.Dense(1, name="prediction")

    def call(self, x: Any) -> Any:
        return self.out(self.hidden2(self.hidden1(x)))


def load(name: str) -> Split:
    """(x_train, y_train, x_test, y_test), float32, y of shape (n, 1); standardised with
    the training split's means and standard deviations."""
    from sklearn.datasets import load_diabetes, make_friedman1

    if name == "diabetes":
        x, y = load_diabetes(return_X_y=True)
        test_size = 100
    else:
        x, y = make_friedman1(n_samples=5000, noise=1.0, random_state=0)
        test_size = 1000
    order = np.random.default_rng(0).permutation(len(x))
    test, train = order[:test_size], order[test_size:]
    mean, std = x[train].mean(axis=0), x[train].std(axis=0)
    y_mean, y_std = y[train].mean(), y[train].std()
    x, y = (x - mean) / std, ((y - y_mean) / y_std)[:, None]
    return (
        x[train].astype("float32"),
        y[train].astype("float32"),
        x[test].astype("float32"),
        y[test].astype("float32"),
    )


def least_squares_mse(data: Split) -> float:
    """Test MSE of ordinary least squares (with an intercept) fitted on the training split."""
    x, y, x_test, y_test = data
    design = np.c_[x, np.ones(len(x))]
    coef = np.linalg.lstsq(design, y, rcond=None)[0]
    return float(np.mean((np.c_[x_test, np.ones(len(x_test))] @ coef - y_test) ** 2))


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=["diabetes", "friedman1"], default="diabetes")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32, help="B, per replica")
    parser.add_argument("--width", type=int, default=32, help="of the two hidden layers")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--sift", default="none", help="a SiftConfig policy, or none")
    parser.add_argument("--keep", type=float, default=0.5, help="kept fraction (not relative)")
    parser.add_argument("--delay", type=int, default=20, help="source batches unsifted")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse()
    tfsift.init({"partitions": args.partitions, "microbatches": args.microbatches})
    keras.utils.set_random_seed(args.seed)
    data = load(args.dataset)
    x, y, x_test, y_test = data
    model = MLP(args.width)
    per_sample = keras.losses.MeanSquaredError(reduction=None)
    optimizer = keras.optimizers.Adam(args.lr)
    # the update in one compiled call: eagerly Keras updates each variable in Python
    update = tfsift.compiled_update(optimizer, model)

    @tfsift.step
    def train_step(features: tf.Tensor, targets: tf.Tensor) -> Any:
        loss = keras.ops.mean(per_sample(targets, model(features, training=True)))
        return tfsift.gradients(loss, model.trainable_variables), loss

    @tfsift.step
    def predict(features: tf.Tensor) -> Any:
        return model(features, training=False)

    source = tfsift.shard(tf.data.Dataset.from_tensor_slices((x, y)), 4096, args.seed)
    train = source.batch(args.batch, drop_remainder=True)
    if args.sift != "none":
        config = tfsift.SiftConfig(
            policy=args.sift, keep=args.keep, delay=args.delay, seed=args.seed
        )
        train = train.apply(tfsift.sift(model, per_sample, config))
    say = print if tfsift.rank() == 0 else (lambda *a, **k: None)
    say(
        f"{tfsift.size()} ranks: {tfsift.mp_size()} stages x {tfsift.dp_size()} replicas, "
        f"{args.dataset}: {len(x)} train / {len(x_test)} test; test mse of the training "
        f"mean {float(np.mean(y_test**2)):.4f}, of least squares {least_squares_mse(data):.4f}",
        flush=True,
    )
    start = time.perf_counter()
    for epoch in range(args.epochs):
        losses = []
        for features, targets in train:
            grads, loss = train_step(features, targets)
            grads = tfsift.allreduce(grads)
            update(grads)  # every rank, a stage without variables too (update([]))
            losses.append(float(loss.reduce_mean()))
        if (epoch + 1) % max(1, args.epochs // 6) == 0 or epoch + 1 == args.epochs:
            kept = tfsift.sift_metrics().get("kept_fraction", 1.0)
            say(
                f"epoch {epoch + 1}: kept {kept:.3f}, loss {np.mean(losses):.4f}, "
                f"test mse {mse(predict, x_test, y_test, args.batch):.4f}, "
                f"{time.perf_counter() - start:.1f} s",
                flush=True,
            )
    say(f"test mse: {mse(predict, x_test, y_test, args.batch):.4f}", flush=True)


def mse(predict: Any, x: np.ndarray, y: np.ndarray, batch: int) -> float:
    """Mean squared error over every test sample; the last batch is padded with zeros to
    ``batch`` (it must split into microbatches) and the padding's predictions dropped."""
    padded = np.concatenate([x, np.zeros((-len(x) % batch, x.shape[1]), x.dtype)])
    predictions = np.concatenate(
        [predict(tf.constant(padded[i : i + batch])).concat().numpy()
         for i in range(0, len(padded), batch)]
    )[: len(x)]  # fmt: skip
    return float(np.mean((predictions - y) ** 2))


if __name__ == "__main__":
    main()
