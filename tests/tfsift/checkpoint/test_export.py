"""save_model writes a plain .keras file; load_weights reads it (or a checkpoint) back."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import tree

import mpi
import tfsift
from tfsift.checkpoint import CheckpointError

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
X = np.random.default_rng(1).normal(size=(8, 6)).astype(np.float32)


class OpsNet(tfsift.DistributedModel):
    """Layers, ``keras.ops`` between them, a skip connection, dropout and BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(8, activation="tanh")
        self.gate = keras.layers.Dense(8)
        self.drop = keras.layers.Dropout(0.5)
        self.norm = keras.layers.BatchNormalization()
        self.out = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        h = self.a(x)
        g = keras.ops.multiply(h, keras.ops.sigmoid(self.gate(h)))
        return self.out(self.norm(self.drop(keras.ops.add(g, h))))


def trained() -> tuple[OpsNet, Any]:
    """A model after two training steps, and its forward-only predict step."""
    tfsift.init({"microbatches": 2})
    keras.utils.set_random_seed(4)
    model, optimizer = OpsNet(), keras.optimizers.SGD(0.1)

    @tfsift.step
    def train(x: tf.Tensor, y: tf.Tensor) -> Any:
        return tfsift.gradients(LOSS(y, model(x, training=True)), model.trainable_variables)

    for _ in range(2):
        grads = [g.accumulate() for g in train(X, np.arange(8) % 3)]
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return model, predictor(model)


def predictor(model: OpsNet) -> Any:
    @tfsift.step
    def predict(x: tf.Tensor) -> Any:
        return model(x, training=False)

    return lambda x: np.asarray(predict(tf.constant(x)).concat())


def load_plainly(path: Path, x: np.ndarray, tmp_path: Path) -> dict[str, Any]:
    """Loads ``path`` in a new Python process that imports only Keras."""
    np.save(tmp_path / "x.npy", x)
    script = str(mpi.SCRIPTS / "checkpoint_plain_load.py")
    proc = subprocess.run(
        [sys.executable, script, str(path), str(tmp_path / "x.npy")],
        env={**mpi.environment(), "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_save_model_writes_a_file_plain_keras_loads_with_equal_predictions(tmp_path: Path) -> None:
    model, predict = trained()
    path = tfsift.save_model(model, tmp_path / "out" / "model.keras")
    assert path.is_file() and sorted(p.name for p in path.parent.iterdir()) == ["model.keras"]
    got = load_plainly(path, X, tmp_path)
    assert got["imported"] == [] and got["class"] == "Functional"
    np.testing.assert_allclose(got["predictions"], predict(X), rtol=1e-6, atol=1e-6)


def test_load_weights_from_a_keras_file_into_a_model_that_has_not_run(tmp_path: Path) -> None:
    model, predict = trained()
    path = tfsift.save_model(model, tmp_path / "model.keras")
    keras.utils.set_random_seed(9)
    fresh = OpsNet()
    assert tfsift.load_weights(fresh, path, example=X) is None
    np.testing.assert_array_equal(predictor(fresh)(X), predict(X))


def test_load_weights_from_a_checkpoint_directory_returns_its_step(tmp_path: Path) -> None:
    model, predict = trained()
    tfsift.CheckpointManager(model, None, tmp_path).save(7)
    fresh = OpsNet()
    assert tfsift.load_weights(fresh, tmp_path) == 7  # the newest in the manager's directory
    np.testing.assert_array_equal(predictor(fresh)(X), predict(X))
    assert tfsift.load_weights(fresh, tmp_path / "ckpt-7") == 7


def test_a_file_of_another_model_is_refused_with_both_structures(tmp_path: Path) -> None:
    inputs = keras.Input((6,))
    keras.Model(inputs, keras.layers.Dense(3)(inputs)).save(tmp_path / "other.keras")
    tfsift.init({})
    with pytest.raises(ValueError, match=r"another structure than this one. Received: \['Dense'\]"):
        tfsift.load_weights(OpsNet(), tmp_path / "other.keras", example=X)


def test_wrong_paths_and_unpartitioned_models_are_explained(tmp_path: Path) -> None:
    model, _ = trained()
    with pytest.raises(
        ValueError, match=re.escape("writes a .keras file. Received: filepath='m.h5'")
    ):
        tfsift.save_model(model, "m.h5")
    with pytest.raises(ValueError, match="pass example=<a batch of model inputs>"):
        tfsift.load_weights(OpsNet(), tmp_path / "m.keras")
    with pytest.raises(CheckpointError, match="no complete checkpoint at"):
        tfsift.load_weights(model, tmp_path / "nothing")


class Texts(tfsift.DistributedModel):
    """A dict input: sentences through an adapted TextVectorization, and numbers; a Lambda."""

    def __init__(self, sentences: list[str]) -> None:
        super().__init__()
        self.vectorize = keras.layers.TextVectorization(max_tokens=12, output_sequence_length=4)
        self.vectorize.adapt(sentences)
        self.embed = keras.layers.Embedding(12, 4)
        self.pool = keras.layers.GlobalAveragePooling1D()
        self.double = keras.layers.Lambda(lambda t: 2.0 * t)
        self.head = keras.layers.Dense(2)

    def call(self, inputs: dict[str, Any]) -> Any:
        words = self.pool(self.embed(self.vectorize(inputs["text"])))
        return self.head(keras.ops.concatenate([self.double(words), inputs["extra"]], axis=-1))


def test_a_saved_model_keeps_its_dict_input_its_vocabulary_and_its_lambda(tmp_path: Path) -> None:
    # the file's inputs were a list named input_layer_N (the dict's keys lost), the
    # vectorizer's clone had no vocabulary ("keys and values cannot be empty tensors"; with
    # tf_idf no IDF weights), and the clone of a Lambda failed in Keras' safe mode
    sentences = ["the cat sat", "a dog ran far", "the dog sat", "cats and dogs ran"]
    tfsift.init({"microbatches": 2})
    model = Texts(sentences)
    inputs = {"text": np.array(sentences, dtype=object), "extra": np.ones((4, 3), np.float32)}
    predicted = model.predict(inputs, batch_size=4, verbose=0)
    path = tfsift.save_model(model, tmp_path / "texts.keras")
    loaded = keras.saving.load_model(path, safe_mode=False)  # Keras asks it of a Lambda
    assert [t.name for t in tree.flatten(loaded.input)] == ["extra", "text"]
    np.testing.assert_allclose(loaded.predict(inputs, verbose=0), predicted, atol=1e-6)


@pytest.mark.parametrize("export", [False, True], ids=["keras file", "export"])
def test_two_jobs_writing_one_path_each_replace_it_whole(tmp_path: Path, export: bool) -> None:
    # both wrote through one partial name and deleted each other's: "No such file or
    # directory: '.partial-m.keras' -> 'm.keras'", or TensorFlow's errors inside an export
    path = tmp_path / ("m" if export else "m.keras")
    command = [sys.executable, str(mpi.SCRIPTS / "export_race.py"), str(path), "12"]
    command += ["--export"] if export else []
    jobs = [
        subprocess.Popen(
            command,
            env=mpi.environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for job in jobs:
        out, err = job.communicate(timeout=240)
        assert job.returncode == 0 and "SAVED" in out, err[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # nothing partial left
    if not export:
        keras.saving.load_model(path)  # whole


def test_an_exports_serving_input_is_named_as_keras_names_it(tmp_path: Path) -> None:
    # it was the traced tensor's name, keras_tensor_N, N the tensors the process made before
    model, _ = trained()
    keras.Input((3,))  # another tensor made in between
    for path in (tmp_path / "first", tmp_path / "second"):
        model.export(path, verbose=False)
        serving = tf.saved_model.load(str(path)).signatures["serving_default"]
        assert list(serving.structured_input_signature[1]) == ["args_0"]


def test_an_onnx_export_fails_or_succeeds_as_plain_keras_does(tmp_path: Path) -> None:
    # Keras' ONNX export refused the never-called clone ("The model provided has never
    # called"), where plain Keras named the missing onnx package (or, with it, exported:
    # the same model on 2 stages then serves in onnxruntime as predict does, checked by hand)
    model, _ = trained()
    plain = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    plain(X)  # Keras exports to ONNX only a model that was called, as a trained one was
    outcomes: list[Any] = []
    for exported, name in ((plain, "plain.onnx"), (model, "tfsift.onnx")):
        try:
            exported.export(tmp_path / name, format="onnx", verbose=False)
            outcomes.append((tmp_path / name).is_file())
        except ImportError as err:
            outcomes.append((type(err), str(err).removeprefix("rank 0: ")))
    assert outcomes[0] == outcomes[1]
