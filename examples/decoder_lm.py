"""Trains a GPT-style language model on Python's own source, the way big models are trained.

Run on 4 processes, as 4 pipeline stages or as 2 stages x 2 replicas:

    tfsift run -np 4 python examples/decoder_lm.py
    tfsift run -np 4 python examples/decoder_lm.py --partitions 2

Offline: the text is the source of standard-library modules (``MODULES``, read from the
running Python's library in that order, ``--chars`` in all); the last 10% of each module
is held out for validation. The model is a decoder: a token embedding and a learned
position embedding, ``--blocks`` pre-norm blocks of causal multi-head self-attention and
an MLP added to the residual stream, a final LayerNorm, and the token embedding reversed
as the output head (``keras.layers.ReversibleEmbedding``: the head's weights are the
embedding's, held by the first and the last stage). It trains with AdamW, a linear
warm-up then cosine decay, ``global_clipnorm`` and ``mixed_bfloat16``, as transformers are
trained; on a pipeline each of these is what it is in one process (docs/big-models.md).
Rank 0 prints each epoch's training loss and the validation loss and perplexity per
character, then a sampled continuation of ``--prompt``; ``--log-steps N`` prints the
loss of each of the first N steps (averaged over the replicas), ``--max-steps N`` stops
after N steps (then validates and samples).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import sys
import time
from typing import Any

import keras
import numpy as np

import tfsift

# Pure-Python modules of every CPython 3.11+; their files are read in this order.
MODULES = (
    "argparse",
    "dataclasses",
    "functools",
    "textwrap",
    "enum",
    "contextlib",
    "heapq",
    "shlex",
    "statistics",
    "fractions",
    "difflib",
    "calendar",
)
# Newline, printable ASCII, and one token for anything else (tabs, non-ASCII letters).
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
UNKNOWN = len(CHARS)
VOCAB = len(CHARS) + 1


class Positions(keras.layers.Layer):  # type: ignore[misc]
    """Adds a learned embedding of each of the ``length`` positions."""

    def __init__(self, length: int, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.length, self.dim = length, dim

    def build(self, shape: Any) -> None:
        init = keras.initializers.RandomNormal(stddev=0.02)
        self.table = self.add_weight(shape=(self.length, self.dim), initializer=init)

    def call(self, x: Any) -> Any:
        return x + keras.ops.cast(self.table, x.dtype)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "length": self.length, "dim": self.dim}


class DecoderLM(tfsift.DistributedModel):
    """Embeddings, ``blocks`` x (x + attention(norm(x)), then x + mlp(norm(x))), norm, and
    the token embedding reversed to the logits (float32, for the loss).

    The blocks' layers are attributes of the model (not of a block layer), so each is a
    node of the traced graph and the partitioner may cut inside a block; the residual
    stream crosses such a cut beside the branch.
    """

    def __init__(self, length: int, dim: int, heads: int, blocks: int) -> None:
        super().__init__()
        self.blocks = blocks
        init = keras.initializers.RandomNormal(stddev=0.02)
        # reverse_dtype: the head's logits in float32 under mixed precision, from the tied
        # layer itself (a cast after it would be a node a cut could leave alone on the
        # last stage, with no copy of the tie)
        self.embed = keras.layers.ReversibleEmbedding(
            VOCAB, dim, embeddings_initializer=init, reverse_dtype="float32", name="token_embedding"
        )
        self.positions = Positions(length, dim, name="position_embedding")
        for b in range(blocks):
            setattr(self, f"norm{b}a", keras.layers.LayerNormalization(name=f"block{b}_norm_a"))
            attention = keras.layers.MultiHeadAttention(heads, dim // heads, name=f"block{b}_attn")
            setattr(self, f"attention{b}", attention)
            setattr(self, f"norm{b}b", keras.layers.LayerNormalization(name=f"block{b}_norm_b"))
            hidden = keras.layers.Dense(4 * dim, activation="gelu", name=f"block{b}_mlp_in")
            setattr(self, f"hidden{b}", hidden)
            setattr(self, f"project{b}", keras.layers.Dense(dim, name=f"block{b}_mlp_out"))
        self.norm = keras.layers.LayerNormalization(name="final_norm")

    def call(self, ids: Any) -> Any:
        x = self.positions(self.embed(ids))
        for b in range(self.blocks):
            h = getattr(self, f"norm{b}a")(x)
            x = x + getattr(self, f"attention{b}")(h, h, use_causal_mask=True)
            h = getattr(self, f"hidden{b}")(getattr(self, f"norm{b}b")(x))
            x = x + getattr(self, f"project{b}")(h)
        return self.embed(self.norm(x), reverse=True)


def optimizer(args: argparse.Namespace, steps: int) -> keras.optimizers.Optimizer:
    """AdamW: a linear warm-up to ``--lr``, cosine decay to 0 at the last step, decoupled
    weight decay (not of norms, biases or embeddings), gradients clipped to a global norm
    of ``--clipnorm``."""
    warmup = min(args.warmup, steps // 2)
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, decay_steps=max(1, steps - warmup), warmup_target=args.lr, warmup_steps=warmup
    )
    adamw = keras.optimizers.AdamW(schedule, weight_decay=0.1, global_clipnorm=args.clipnorm)
    adamw.exclude_from_weight_decay(var_names=["gamma", "beta", "bias", "embedding", "table"])
    return adamw


def corpus(chars: int) -> tuple[str, str]:
    """(train, validation): the first ``chars`` characters of the source of ``MODULES``, in
    order; the last 10% of each module's text is held out for validation."""
    train, validation, total = [], [], 0
    for name in MODULES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        with open(spec.origin, encoding="utf-8") as f:
            source = f.read()[: chars - total]
        total += len(source)
        split = len(source) * 9 // 10
        train.append(source[:split])
        validation.append(source[split:])
        if total == chars:
            return "".join(train), "".join(validation)
    raise ValueError(f"--chars must be at most {total}. Received: {chars}")


def encode(source: str) -> np.ndarray:
    """Token ids (int32): a character's index in ``CHARS``, else ``UNKNOWN``."""
    index = {c: i for i, c in enumerate(CHARS)}
    return np.array([index.get(c, UNKNOWN) for c in source], dtype=np.int32)


def windows(ids: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping (input, next-character target) pairs of ``length`` tokens."""
    n = (len(ids) - 1) // length
    x = ids[: n * length].reshape(n, length)
    y = ids[1 : n * length + 1].reshape(n, length)
    return x, y


def unigram_bits(ids: np.ndarray) -> float:
    """Entropy in bits of the character frequencies: what a model ignoring context reaches."""
    p = np.bincount(ids, minlength=VOCAB) / len(ids)
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=300_000, help="of text, 90%% train")
    parser.add_argument("--seq-len", type=int, default=64, help="T, characters per sample")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per replica")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3, help="after the warm-up")
    parser.add_argument("--warmup", type=int, default=100, help="steps")
    parser.add_argument("--clipnorm", type=float, default=1.0, help="global gradient norm")
    parser.add_argument("--precision", default="mixed_bfloat16", help="a Keras dtype policy")
    parser.add_argument("--log-steps", type=int, default=0, help="print the first N steps' loss")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after N steps")
    parser.add_argument("--prompt", default="def ", help="continued at the end")
    parser.add_argument("--generate", type=int, default=160, help="characters; 0: none")
    parser.add_argument("--temperature", type=float, default=0.8)
    return parser.parse_args()


def main() -> None:
    args = parse()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    keras.mixed_precision.set_global_policy(args.precision)
    tfsift.init({"partitions": args.partitions, "microbatches": args.microbatches})
    keras.utils.set_random_seed(0)
    train_text, validation_text = corpus(args.chars)
    x, y = windows(encode(train_text), args.seq_len)
    x_val, y_val = windows(encode(validation_text), args.seq_len)
    # each replica's batch of --batch-size comes from one permutation of the rows per epoch:
    # R replicas take the batches one process takes with R x --batch-size
    train = tfsift.from_arrays((x, y), batch_size=args.batch_size, seed=0)
    steps = len(train) * args.epochs
    model = DecoderLM(args.seq_len, args.dim, args.heads, args.blocks)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    adamw = optimizer(args, steps)
    # the update in one compiled call; on a pipeline its global norm spans every stage
    update = tfsift.compiled_update(adamw, model)

    @tfsift.step
    def train_step(inputs: Any, targets: Any) -> Any:
        loss = loss_fn(targets, model(inputs, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    @tfsift.step
    def evaluate(inputs: Any, targets: Any) -> Any:
        return loss_fn(targets, model(inputs, training=False))

    @tfsift.step
    def predict(inputs: Any) -> Any:
        return model(inputs, training=False)

    def validation_loss() -> float:
        batch = args.batch_size
        usable = len(x_val) - len(x_val) % batch
        losses = [
            float(evaluate(x_val[i : i + batch], y_val[i : i + batch]).reduce_mean())
            for i in range(0, usable, batch)
        ]
        return float(np.mean(losses))

    say = logging.getLogger("example").info if tfsift.rank() == 0 else (lambda *a: None)
    say(
        f"{tfsift.size()} ranks: {tfsift.mp_size()} stages x {tfsift.dp_size()} replicas, "
        f"{len(x)} train / {len(x_val)} validation samples of {args.seq_len} characters, "
        f"{args.precision}; unigram baseline {unigram_bits(encode(train_text)):.3f} bits"
    )
    val, done = math.nan, 0
    for epoch in range(args.epochs):
        start, losses = time.perf_counter(), []
        for inputs, targets in train:
            grads, loss = train_step(inputs, targets)
            update(tfsift.allreduce(grads))
            # every replica's loss, averaged: the loss of the whole batch
            losses.append(float(tfsift.allreduce([loss.reduce_mean()])[0]))
            done += 1
            if done <= args.log_steps:
                say(f"step {done} loss {losses[-1]:.6f}")
            if done == args.max_steps:
                break
        val = validation_loss()
        say(
            f"epoch {epoch + 1}/{args.epochs}  loss {np.mean(losses):.4f}  validation loss "
            f"{val:.4f}  perplexity {math.exp(val):.2f} ({val / math.log(2):.3f} bits per "
            f"character)  ({time.perf_counter() - start:.1f}s)"
        )
        if done == args.max_steps:
            break
    if args.generate:
        say(f"sampled continuation of {args.prompt!r}:\n{generate(predict, args)}")
    say(f"validation loss: {val:.4f}, perplexity {math.exp(val):.2f} per character")


def generate(predict: Any, args: argparse.Namespace) -> str:
    """``--prompt`` and ``--generate`` characters sampled at ``--temperature`` (seeded).

    Every rank runs it: the logits are broadcast along the pipeline, so every rank draws
    the same characters.
    """
    rng = np.random.default_rng(0)
    context = list(encode(args.prompt))
    for _ in range(args.generate):
        window = context[-args.seq_len :]
        padded = np.full((args.microbatches, args.seq_len), CHARS.index(" "), np.int32)
        padded[:, : len(window)] = window
        # causal attention: position len(window) - 1 does not see the padding after it
        logits = predict(padded).concat().numpy()[0, len(window) - 1].astype(np.float64)
        p = np.exp((logits - logits.max()) / args.temperature)
        context.append(int(rng.choice(VOCAB, p=p / p.sum())))
    return "".join(CHARS[i] if i < UNKNOWN else "?" for i in context)


if __name__ == "__main__":
    main()
