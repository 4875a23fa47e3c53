"""Every rank: a small GPT-style decoder trained as big-model users train one, against one
process: a token embedding tied to the output head (``keras.layers.ReversibleEmbedding``),
AdamW with warm-up and cosine decay, ``global_clipnorm`` (small enough to clip every
step), mixed precision with a loss scale; ``get_weights``, ``set_weights``, ``export``.

usage: bigmodel_check.py K CKPT_DIR [all|loop] [SCHEDULE]
  K stages (the world's other factor is data-parallel replicas); the fp32 loop leaves a
  checkpoint in CKPT_DIR (with K = 2) that the test restores in one process. ``loop``
  runs the fp32 custom loop only. SCHEDULE: a schedule as `models.schedule` reads it
  (default: the config's default).

The one-process reference runs first, on rank 0 (the others read what it found), on its
own copy of the model (the same seed and layer names, so the same variable paths): in
float32 on the whole global batch, as a single Keras process trains; in half precision
on the same microbatches as the pipeline (each microbatch's gradient is rounded to half
precision before they are added, so a whole-batch gradient differs by that rounding,
not by the pipeline).
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift
from mpi import computed_once, report

V, T, D, HEADS = 24, 8, 16, 2  # vocabulary, sequence, width, attention heads
B, M, SEED, STEPS, CLIP = 16, 2, 3, 12, 0.05  # global batch, microbatches, seed, steps, norm
MARK, MARKED = V - 1, (0, 5)  # a token only the batches of steps MARKED hold (Spike)
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
SCHEDULE: dict[str, Any] = {}  # the script's SCHEDULE argument as config values


@keras.saving.register_keras_serializable("tfsift_tests")
class Positions(keras.layers.Layer):  # type: ignore[misc]
    """Adds a learned embedding of each of the ``length`` positions."""

    def __init__(self, length: int, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.length, self.dim = length, dim

    def build(self, shape: Any) -> None:
        self.table = self.add_weight(shape=(self.length, self.dim), name="table")

    def call(self, x: Any) -> Any:
        return x + keras.ops.cast(self.table, x.dtype)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "length": self.length, "dim": self.dim}


@keras.saving.register_keras_serializable("tfsift_tests")
class Spike(keras.layers.Layer):  # type: ignore[misc]
    """``x * w``; the gradient of ``w`` is inf in a batch that holds the token ``MARK``, as a
    loss scale too high for float16 makes one layer's gradients overflow (here on chosen
    steps, so that the pipeline and the reference overflow alike, whatever their rounding)."""

    def build(self, x_shape: Any, ids_shape: Any) -> None:
        self.w = self.add_weight(shape=(x_shape[-1],), initializer="ones", name="w")

    def call(self, x: Any, ids: Any) -> Any:
        marked = tf.reduce_any(tf.equal(ids, MARK))

        @tf.custom_gradient  # type: ignore[misc]
        def scaled(x: Any, w: Any) -> Any:
            def grad(dy: Any) -> Any:
                gw = tf.reduce_sum(dy * x, axis=[0, 1])
                return dy * w, tf.where(marked, tf.cast(np.inf, gw.dtype), gw)

            return x * w, grad

        return scaled(x, keras.ops.cast(self.w, x.dtype))


class Decoder(tfsift.DistributedModel):
    """Tied token embedding, positions, one pre-norm block (causal attention, MLP), the
    token embedding reversed as the head. Named layers: the reference's paths match."""

    def __init__(self, spike: bool = False) -> None:
        super().__init__(name="decoder")
        # float32 logits from the head itself (KerasHub's way) rather than a cast after it:
        # a cast node of its own could be a last stage alone, holding no copy of the tie
        self.embed = keras.layers.ReversibleEmbedding(V, D, reverse_dtype="float32", name="embed")
        self.positions = Positions(T, D, name="positions")
        self.norm_a = keras.layers.LayerNormalization(name="norm_a")
        self.attention = keras.layers.MultiHeadAttention(
            HEADS, D // HEADS, use_bias=False, name="attention"
        )  # a key bias has no gradient but rounding, which Adam scales up
        self.norm_b = keras.layers.LayerNormalization(name="norm_b")
        self.mlp_in = keras.layers.Dense(2 * D, activation="gelu", name="mlp_in")
        self.mlp_out = keras.layers.Dense(D, name="mlp_out")
        self.norm = keras.layers.LayerNormalization(name="norm")
        self.spike = Spike(name="spike") if spike else None

    def call(self, ids: Any) -> Any:
        x = self.positions(self.embed(ids))
        h = self.norm_a(x)
        x = x + self.attention(h, h, use_causal_mask=True)
        x = x + self.mlp_out(self.mlp_in(self.norm_b(x)))
        h = self.norm(x)
        if self.spike is not None:
            h = self.spike(h, ids)
        return self.embed(h, reverse=True)


def optimizer(kind: str) -> Any:
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, decay_steps=STEPS, warmup_target=1e-2, warmup_steps=5
    )
    adamw = keras.optimizers.AdamW(schedule, weight_decay=0.01, global_clipnorm=CLIP)
    if kind == "scaled":
        return keras.optimizers.LossScaleOptimizer(adamw, dynamic_growth_steps=4)
    return adamw


def batches(steps: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    x = rng.integers(0, MARK, (steps * B, T)).astype(np.int32)
    for step in MARKED:
        if step < steps:
            x[step * B, 0] = MARK  # in the first microbatch of the first replica
    return x, np.roll(x, -1, axis=1)  # the next token, wrapping at the end


@contextlib.contextmanager
def policy(name: str) -> Iterator[None]:
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


_REFERENCES: dict[tuple[Any, ...], dict[str, Any]] = {}


def reference(kind: str, spike: bool, microbatched: bool, steps: int) -> dict[str, Any]:
    """One process: the whole model, Keras' optimizer, the same global batches; computed
    once per policy and arguments (the loop's and fit's cases share theirs), by rank 0."""
    key = (keras.mixed_precision.global_policy().name, kind, spike, microbatched, steps)
    if key not in _REFERENCES:
        _REFERENCES[key] = computed_once(
            "reference-" + "-".join(map(str, key)),
            lambda: _reference(kind, spike, microbatched, steps),
        )
    return _REFERENCES[key]


def _reference(kind: str, spike: bool, microbatched: bool, steps: int) -> dict[str, Any]:
    keras.utils.set_random_seed(SEED)
    model, opt = Decoder(spike), optimizer(kind)
    x, y = batches(steps)
    parts = M if microbatched else 1

    @tf.function(autograph=False)
    def gradients(xm: tf.Tensor, ym: tf.Tensor) -> Any:
        with tf.GradientTape() as tape:
            loss = opt.scale_loss(LOSS(ym, model.call(xm)))
        return tape.gradient(loss, model.trainable_variables)

    for step in range(steps):
        rows = slice(step * B, (step + 1) * B)
        total = None
        for xm, ym in zip(np.split(x[rows], parts), np.split(y[rows], parts), strict=True):
            grads = gradients(tf.constant(xm), tf.constant(ym))
            total = grads if total is None else [a + b for a, b in zip(total, grads, strict=True)]
        assert total is not None
        opt.apply([g / parts for g in total], model.trainable_variables)
    found = {"weights": {v.path: v.numpy() for v in model.trainable_variables}}
    found["keras_weights"] = model.get_weights()
    if kind == "scaled":
        found["scale"] = float(opt.dynamic_scale.numpy())
        found["applied"] = int(opt.iterations.numpy())
    return found


def difference(model: Any, ref: dict[str, Any]) -> float:
    """Largest relative difference of this rank's stage's weights from the reference's."""
    worst = 0.0
    for v in model.trainable_variables:
        want = ref["weights"][v.path]
        worst = max(worst, float(np.abs(v.numpy() - want).max() / (np.abs(want).max() + 1e-12)))
    return worst


def embedding_digest(model: Any) -> str | None:
    """sha256 of this stage's copy of the tied embedding, or None if it holds none."""
    held = [v for v in model.trainable_variables if v.path == "embed/embeddings"]
    return hashlib.sha256(held[0].numpy().tobytes()).hexdigest() if held else None


def loop(K: int, kind: str, spike: bool = False, steps: int = STEPS) -> dict[str, Any]:
    """The README's loop: step, allreduce, compiled_update; each replica its share."""
    init(K)
    keras.utils.set_random_seed(SEED)
    model, opt = Decoder(spike), optimizer(kind)
    update = tfsift.compiled_update(opt, model)

    @tfsift.step
    def train(x: tf.Tensor, y: tf.Tensor) -> Any:
        loss = LOSS(y, model(x, training=True))
        return tfsift.gradients(opt.scale_loss(loss), model.trainable_variables), loss

    x, y = batches(steps)
    R, r = tfsift.dp_size(), tfsift.dp_rank()
    overflowed = 0
    for step in range(steps):
        rows = slice(step * B + r * B // R, step * B + (r + 1) * B // R)
        grads, _ = train(x[rows], y[rows])
        grads = tfsift.allreduce(grads)
        overflowed += not all(bool(tf.reduce_all(tf.math.is_finite(g))) for g in grads)
        update(grads)
    found: dict[str, Any] = {"model": model, "optimizer": opt, "overflowed": overflowed}
    if kind == "scaled":
        found["scale"] = float(opt.dynamic_scale.numpy())
        found["applied"] = int(opt.iterations.numpy())
    return found


def init(K: int) -> None:
    tfsift.init({"partitions": K, "microbatches": M, "profile_repeats": 1, **SCHEDULE})


def fp32_loop(K: int, ckpt_dir: Path) -> dict[str, Any]:
    ref = reference("adamw", False, False, STEPS)
    run = loop(K, "adamw")
    model = run["model"]
    found: dict[str, Any] = {
        "loop_error": difference(model, ref),
        "embedding": embedding_digest(model),
        "stage": tfsift.mp_rank(),
        "schedule": [model.partitioned.pipeline, model.partitioned.deferred],
    }
    whole = model.get_weights()  # collective: the whole model, Keras' order, every rank
    found["get_weights_error"] = max(
        float(np.abs(a - b).max() / (np.abs(b).max() + 1e-12))
        for a, b in zip(whole, ref["keras_weights"], strict=True)
    )
    found["get_weights_count"] = [len(whole), len(ref["keras_weights"])]
    found["refused"] = refused(model)
    found["refused_whole"] = refused_whole(model)
    if K == 2 and tfsift.dp_size() == 1:
        tfsift.CheckpointManager(model, run["optimizer"], ckpt_dir).save(STEPS)
        found["saved"] = {v.path: v.numpy().tolist() for v in model.trainable_variables}
        model.set_weights(ref["keras_weights"])  # every rank the same list
        found["set_weights_error"] = difference(model, ref)
        found.update(exported(model, ckpt_dir))
    return found


def refused(model: Any) -> str:
    """What a pipeline says of an optimizer whose own clipping it cannot see into."""

    class OwnClipping(keras.optimizers.AdamW):  # type: ignore[misc]
        def _clip_gradients(self, grads: list[Any]) -> list[Any]:
            return grads

    update = tfsift.compiled_update(OwnClipping(global_clipnorm=1.0), model)
    try:
        update([tf.zeros_like(v) for v in model.trainable_variables])
    except ValueError as err:
        return str(err)
    return "not refused"


def refused_whole(model: Any) -> list[str]:
    """What a pipeline says of subclasses whose own update sees every gradient at once:
    one centring the gradients in apply_gradients, one clipping by their norm without
    global_clipnorm (neither is Keras' global_clipnorm, which spans the stages)."""

    class Centred(keras.optimizers.Adam):  # type: ignore[misc]
        def apply_gradients(self, grads_and_vars: Any) -> Any:
            pairs = list(grads_and_vars)
            mean = tf.add_n([tf.reduce_mean(g) for g, _ in pairs]) / len(pairs)
            return super().apply_gradients([(g - mean, v) for g, v in pairs])

    class NormClip(keras.optimizers.SGD):  # type: ignore[misc]
        def _clip_gradients(self, grads: list[Any]) -> list[Any]:
            return list(tf.clip_by_global_norm(grads, 1.0)[0])

    said = []
    for optimizer in (Centred(), keras.optimizers.LossScaleOptimizer(NormClip())):
        update = tfsift.compiled_update(optimizer, model)
        try:
            update([tf.zeros_like(v) for v in model.trainable_variables])
            said.append("not refused")
        except ValueError as err:
            said.append(str(err))
    return said


def exported(model: Any, where: Path) -> dict[str, Any]:
    """``tfsift.save_model`` (gathered as ``model.export``'s SavedModel is: one process's
    export is tested in tests/tfsift/training/test_loop.py): one tied embedding."""
    x, _ = batches(1)
    predicted = model.predict(x, batch_size=B, verbose=0)
    tfsift.save_model(model, where / "model.keras")
    if tfsift.rank() != 0:
        return {}
    loaded = keras.saving.load_model(where / "model.keras", compile=False)
    tied = [layer for layer in loaded.layers if isinstance(layer, keras.layers.Embedding)]
    return {
        "loaded_error": float(np.abs(loaded.predict(x, verbose=0) - predicted).max()),
        "tied_layers": [layer.name for layer in tied],
        "tied_calls": len(tied[0]._inbound_nodes),
    }


def fitted(K: int) -> dict[str, Any]:
    """``fit`` with the same optimizer: equal to the one-process loop."""
    ref = reference("adamw", False, False, STEPS)  # the loop's
    init(K)
    keras.utils.set_random_seed(SEED)
    model = Decoder()
    model.compile(optimizer=optimizer("adamw"), loss=LOSS)
    x, y = batches(STEPS)
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    return {"fit_error": difference(model, ref)}


def scaled_fp16(K: int) -> dict[str, Any]:
    """mixed_float16 and a LossScaleOptimizer; the last stage's gradients overflow alone."""
    with policy("mixed_float16"):
        ref = reference("scaled", True, True, 10)
        run = loop(K, "scaled", spike=True, steps=10)
        return {
            "fp16_error": difference(run["model"], ref),
            "fp16_scale": [run["scale"], ref["scale"]],
            "fp16_applied": [run["applied"], ref["applied"]],
            "fp16_overflowed_here": run["overflowed"],
        }


def fitted_fp16(K: int) -> dict[str, Any]:
    """mixed_float16 through fit: the LossScaleOptimizer's scale on the loss as Keras' fit
    puts it; the spiking layer's stage overflows alone, every stage skips those steps."""
    with policy("mixed_float16"):
        ref = reference("scaled", True, True, 10)
        init(K)
        keras.utils.set_random_seed(SEED)
        model, opt = Decoder(spike=True), optimizer("scaled")
        model.compile(optimizer=opt, loss=LOSS)
        x, y = batches(10)
        model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
        return {
            "fp16_fit_error": difference(model, ref),
            "fp16_fit_scale": [float(opt.dynamic_scale.numpy()), ref["scale"]],
        }


def fitted_bf16(K: int) -> dict[str, Any]:
    """mixed_bfloat16 through fit: activations cross the cut in bfloat16."""
    with policy("mixed_bfloat16"):
        ref = reference("adamw", False, True, 8)
        init(K)
        keras.utils.set_random_seed(SEED)
        model = Decoder()
        model.compile(optimizer=optimizer("adamw"), loss=LOSS)
        x, y = batches(8)
        model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
        part = model.partitioned
        return {
            "bf16_error": difference(model, ref),
            "bf16_received": [str(dtype) for _, dtype in part.in_specs],
        }


def main() -> None:
    K, ckpt_dir = int(sys.argv[1]), Path(sys.argv[2])
    which = sys.argv[3] if len(sys.argv) > 3 else "all"
    if len(sys.argv) > 4:
        from models import schedule  # here: the tests import this module from mpi_scripts

        SCHEDULE.update(schedule(sys.argv[4]))
    found = fp32_loop(K, ckpt_dir)
    if which == "all":
        found.update(fitted(K))
        found.update(scaled_fp16(K))
        found.update(fitted_fp16(K))
        found.update(fitted_bf16(K))
    report(rank=tfsift.rank(), onednn=onednn(), **found)


def onednn() -> bool:
    """Whether TensorFlow runs oneDNN's kernels here (by default on CPUs with AVX-512 VNNI
    or BF16; TF_ENABLE_ONEDNN_OPTS decides otherwise)."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


if __name__ == "__main__":
    main()
