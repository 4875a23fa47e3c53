"""Every rank: runs the README's and the docs' Python blocks as written, page by page.

usage: docs_check.py
  Each page runs in a namespace and a working directory of its own (pages/<page> in the
  job's reports folder, which the ranks share), its
  blocks in the page's order, on the 2 ranks of one job (a process takes one rank layout,
  and every page's ``tfsift.init`` but one asks for 2 ranks). Between the blocks come the
  reader's own parts, which a page leaves to the reader: data, a model where it says
  ``MyModel()``, a training step the page names but does not show. A block is never
  edited. The one block whose ``tfsift.init`` asks for another layout (4 stages) has its
  config validated by ``Config.from_dict``, the code ``tfsift.init`` runs first. Each rank
  reports, by page, the blocks it ran and validated, and what the page's claims can be
  checked against.
"""

from __future__ import annotations

import ast
import json
import linecache
import os
import re
from pathlib import Path
from typing import Any

from mpi import REPORTS, report, timed

ROOT = Path(__file__).resolve().parents[2]

# The reader's parts. Data is small and random: the blocks' claims are about running,
# not about accuracy.
IMAGES = """
import numpy as np, tensorflow as tf
rng = np.random.default_rng(0)
dataset = tf.data.Dataset.from_tensor_slices(
    (rng.normal(size=(64, 28, 28, 1)).astype("float32"), rng.integers(0, 10, 64))
)
"""
FEATURES = """
import numpy as np, tensorflow as tf
rng = np.random.default_rng(0)
dataset = tf.data.Dataset.from_tensor_slices(
    (rng.normal(size=(N_SAMPLES, 8)).astype("float32"), rng.integers(0, 10, N_SAMPLES))
)
"""
PER_SAMPLE = """
per_sample_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
"""
FORWARD_STEP = """
@tfsift.step
def forward_backward(x, y):
    loss = tf.reduce_mean(per_sample_loss(y, model(x, training=True)))
    return tfsift.gradients(loss, model.trainable_variables), loss
"""
TRAIN_STEP = (
    """
model = MyModel()
optimizer = keras.optimizers.Adam(1e-3)
"""
    + FORWARD_STEP
)
# the from_arrays block's "same loop": its epochs, the third pruned by row
FROM_ARRAYS_EPOCHS = """
for epoch in range(N):
    for x, y, w in train:
        grads, losses = weighted_step(x, y, w)
        train.record(losses)
        optimizer.apply_gradients(zip(tfsift.allreduce(grads), model.trainable_variables))
by_row = type(train).__name__, tfsift.sift_metrics()["policy/pruned"]
"""
# the from_rows block's files (each sample "decoded" from its name) and its epochs, the
# third pruned by row: load reads only the rows trained
FROM_ROWS_FILES = """
paths = [f"sample-{i}" for i in range(len(x_train))]
labels = y_train
read = []
def decode(path):
    read.append(int(path.removeprefix("sample-")))
    return x_train[read[-1]]
"""
FROM_ROWS_EPOCHS = """
del read[:]  # the first batch, read when the dataset was made
trained = []
for epoch in range(N):
    for x, y, w in train:
        trained += [int(np.flatnonzero((x_train == row).all(axis=1))[0]) for row in x.numpy()]
        grads, losses = weighted_step(x, y, w)
        train.record(losses)
        optimizer.apply_gradients(zip(tfsift.allreduce(grads), model.trainable_variables))
from_rows = read == trained, len(trained) < N * len(x_train) // B * B
"""
DENSE_MODEL = """
class MyModel(tfsift.DistributedModel):
    def __init__(self):
        super().__init__()
        self.d1 = keras.layers.Dense(32, activation="relu")
        self.drop1 = keras.layers.Dropout(0.1)
        self.d2 = keras.layers.Dense(10)

    def call(self, x):
        return self.d2(self.drop1(self.d1(x)))
"""

# page -> steps: ("block", i) runs the page's i-th Python block, ("code", src) the reader's
# part, ("validate", i) the config of block i's tfsift.init (another rank layout).
SCENARIOS: dict[str, list[tuple[str, Any]]] = {
    "big-models.md": [
        ("code", "import keras, tfsift\ntfsift.init({'partitions': 2, 'microbatches': 2})"),
        ("block", 0),  # a model with a tied embedding
        (
            "code",
            "import numpy as np\nrng = np.random.default_rng(0)\n"
            "tokens = rng.integers(0, 64, (32, 8)).astype('int32')\n"
            "next_tokens = np.roll(tokens, -1, axis=1)",
        ),
        ("block", 1),  # fit with AdamW, a schedule and global_clipnorm
        (
            "code",
            """
optimizer = keras.optimizers.AdamW(1e-3)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

@tfsift.step
def train_step(ids, targets):
    loss = loss_fn(targets, model(ids, training=True))
    return tfsift.gradients(loss, model.trainable_variables), loss

grads, loss = train_step(tokens[:8], next_tokens[:8])
""",
        ),
        ("block", 2),  # clip_by_global_norm in a hand-written update
        ("code", "update = tfsift.compiled_update(optimizer, model)"),
        ("block", 3),  # weight penalties in the loop
        ("block", 4),  # mixed_float16 with a loss scale
        ("block", 5),  # a model of two outputs, a dict of losses and weights
    ],
    "README.md": [
        ("code", IMAGES),
        ("block", 0),  # the training loop on 2 stages
        ("block", 1),  # checkpoints and export
        ("block", 2),  # infobatch on training scores, its step defined
        ("code", "test = tfsift.shard(dataset.take(32)).batch(32, drop_remainder=True)"),
        ("block", 3),  # fit, evaluate
    ],
    "checkpoints.md": [
        # one microbatch a step: the page needs 300 steps, not their pipelining
        ("code", "import keras, tfsift\ntfsift.init({'partitions': 2, 'microbatches': 1})"),
        ("code", "N_SAMPLES = 7_000\n" + FEATURES + DENSE_MODEL + PER_SAMPLE),
        (
            "code",
            TRAIN_STEP
            + """
# about 440 of 437 + 3 batches kept: enough to save at step 300
config = tfsift.SiftConfig(policy="relative", beta=0.25)
train = tfsift.shard(dataset).batch(16, drop_remainder=True)
train = train.apply(tfsift.sift(model, per_sample_loss, config))
""",
        ),
        ("block", 0),  # the loop with saves, save_model
        ("block", 1),  # reading a checkpoint's files with NumPy
        ("code", "x = rng.normal(size=(4, 8)).astype('float32')"),
        ("block", 2),  # load_model without tfsift
        ("block", 3),  # a custom layer registered
    ],
    "config.md": [
        ("code", "import tfsift"),
        ("block", 0),  # tfsift.init with memory_cap and plan_file
        ("block", 1),  # three SiftConfigs
    ],
    "migrating.md": [
        ("block", 0),  # init
        ("code", "N_SAMPLES = 128\n" + FEATURES),
        ("block", 1),  # tfsift.shard
        ("code", DENSE_MODEL),
        ("block", 2),  # the @tfsift.step loop
        ("block", 3),  # compile, fit
        ("block", 4),  # broadcast_variables
        ("block", 5),  # checkpoints
        ("block", 6),  # a loss printed on rank 0
        ("validate", 7),  # 4 stages with memory_cap: another rank layout
        ("block", 8),  # plan_file
        ("code", "images, labels = next(iter(train))\ntemperature = tf.constant(2.0)"),
        ("block", 9),  # non_split_inputs, merge
        ("block", 10),  # manual placement
        (
            "code",
            """
two = TwoStages()
optimizer = keras.optimizers.Adam(1e-3)

@tfsift.step
def two_step(x, y):
    loss = loss_obj(y, two(x, training=True))
    return tfsift.gradients(loss, two.trainable_variables), loss

grads, loss = two_step(images, labels)
held = {id(v) for v in two.trainable_variables}
PLACED = [name for name in ("body", "head") if held & {id(v) for v in getattr(two, name).weights}]
""",
        ),
    ],
    "sifting.md": [
        ("code", "import keras, tfsift\ntfsift.init({'partitions': 2, 'microbatches': 4})"),
        ("code", "N_SAMPLES = 128\nB = 32\nN = 3\n" + FEATURES + DENSE_MODEL + "model = MyModel()"),
        ("code", "x_train, y_train = (np.stack([t.numpy() for t in a]) for a in zip(*dataset))"),
        ("block", 0),  # fit with InfoBatch in one line
        ("block", 1),  # the InfoBatch loop on tfsift.from_arrays, its step defined
        ("code", FORWARD_STEP),
        ("block", 2),  # forward-scored relative
        ("block", 3),  # relative on training scores
        ("block", 4),  # infobatch through tf.data
        ("block", 5),  # infobatch on tfsift.from_arrays
        ("code", FROM_ARRAYS_EPOCHS),
        ("code", FROM_ROWS_FILES),
        ("block", 6),  # infobatch on tfsift.from_rows
        ("code", FROM_ROWS_EPOCHS),
        # the metrics block's run: a dataset sifted afresh, for its N epochs
        ("code", "train = tfsift.from_arrays((x_train, y_train), batch_size=B)"),
        ("code", "train = train.apply(tfsift.sift(config=config))"),
        ("block", 7),  # an epoch's metrics
    ],
}

# What a page's namespace holds at its end that the test checks, by page.
FINDINGS: dict[str, str] = {
    "README.md": "{'history': sorted(history.history), "
    "'accuracy': float(accuracy), 'sifted': sorted(tfsift.sift_metrics())}",
    "checkpoints.md": "{'files': sorted(os.listdir('runs/exp1/ckpt')), "
    "'weights': list(weights.files), 'keras_file': os.path.exists('model.keras'), "
    "'predictions': list(map(int, model.predict(x, verbose=0).shape))}",
    "migrating.md": "{'placed': PLACED, 'merged': list(map(int, predictions.shape)), "
    "'start': start}",
    "sifting.md": "{'loss': float(loss.reduce_mean()), 'sifted': sorted(tfsift.sift_metrics()), "
    "'by_row': by_row, 'from_rows': from_rows, 'fit_kept': history.history['sift_kept'], "
    "'epoch': epoch_metrics}",
}


def blocks(page: str) -> list[str]:
    path = ROOT / page if page == "README.md" else ROOT / "docs" / page
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def validate_init(block: str) -> None:
    """The dict literal that ``block`` passes to ``tfsift.init``, through ``Config.from_dict``."""
    from tfsift.config import Config

    calls = [
        node
        for node in ast.walk(ast.parse(block))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "init"
    ]
    assert len(calls) == 1, f"expected one tfsift.init call. Received: {len(calls)}"
    Config.from_dict(ast.literal_eval(calls[0].args[0]))


def run_page(page: str, base: Path) -> dict[str, Any]:
    work = base / page.removesuffix(".md")
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    texts = blocks(page)
    namespace: dict[str, Any] = {"__name__": "__docs__", "os": os}
    ran: list[int] = []
    validated: list[int] = []
    for kind, what in SCENARIOS[page]:
        if kind == "validate":
            validate_init(texts[what])
            validated.append(what)
            continue
        source, name = (
            (texts[what], f"<{page} block {what}>")
            if kind == "block"
            else (what, f"<{page}: the reader's part>")
        )
        # AutoGraph reads a step's source: linecache holds it as a file would
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        exec(compile(source, name, "exec"), namespace)
        if kind == "block":
            ran.append(what)
    findings = eval(FINDINGS[page], namespace) if page in FINDINGS else {}
    return {"ran": ran, "validated": validated, "blocks": len(texts), "findings": findings}


def main() -> None:
    base = Path(os.environ[REPORTS]) / "pages"
    pages = {}
    for page in SCENARIOS:
        with timed(f"  docs_check.py: {page}"):
            pages[page] = run_page(page, base)
    import tfsift

    report(rank=tfsift.rank(), pages=pages)
    print(json.dumps({"rank": tfsift.rank(), "done": True}))


if __name__ == "__main__":
    main()
