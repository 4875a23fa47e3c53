"""Keras' save paths between a DistributedModel and plain Keras: a ``.keras`` file that
``keras.saving.load_model`` returns compiled, with the optimizer's state, and resumes; a
``.weights.h5`` file of either loaded into the other; ``set_weights`` before the first step.

Run as a script, this module is the 2-stage job of the MPI test (every rank runs ``job``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

import mpi
import tfsift
from tfsift.checkpoint import optimizer as optimizer_lib
from tfsift.checkpoint import weights as weights_lib

B, STEPS = 16, 4  # a batch of 16, 4 steps an epoch
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def layers() -> tuple[Any, ...]:
    """Three Dense layers named as the attributes that hold them, so that a loaded
    functional model's variable paths (``d1/kernel``) are tfsift's checkpoint keys."""
    init = keras.initializers.GlorotUniform
    return (
        keras.layers.Dense(8, activation="relu", kernel_initializer=init(1), name="d1"),
        keras.layers.Dense(8, activation="relu", kernel_initializer=init(2), name="d2"),
        keras.layers.Dense(3, kernel_initializer=init(3), name="d3"),
    )


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.d1, self.d2, self.d3 = layers()

    def call(self, x: Any) -> Any:
        return self.d3(self.d2(self.d1(x)))


class Plain(keras.Model):  # type: ignore[misc]
    """The same layers in a plain Keras subclass: its weights file holds them by attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.d1, self.d2, self.d3 = layers()

    def call(self, x: Any) -> Any:
        return self.d3(self.d2(self.d1(x)))


def data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B * STEPS, 4)).astype(np.float32)
    return x, rng.integers(0, 3, B * STEPS).astype(np.int32)


def compiled(model: Any) -> Any:
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=LOSS, metrics=["accuracy"])
    return model


def optimizer_state(model: Any) -> dict[str, np.ndarray]:
    """A DistributedModel's optimizer (this rank's stage) by tfsift's checkpoint keys."""
    part = model.partitioned
    return optimizer_lib.arrays(model.optimizer, weights_lib.trainable(model, part))


def loaded_optimizer_state(model: Any) -> dict[str, np.ndarray]:
    """A loaded functional model's optimizer by the same keys (its layers bear the names)."""
    return optimizer_lib.arrays(model.optimizer, [(v.path, v) for v in model.trainable_variables])


def check_resumes(path: Path, state: dict[str, np.ndarray], iterations: int) -> keras.Model:
    """Loads ``path`` with plain Keras: compiled, its optimizer ``state`` (within 1e-6) and
    ``iterations``; one more epoch of ``fit`` counts on from there."""
    restored = keras.saving.load_model(path)
    assert restored.compiled and type(restored.optimizer).__name__ == "Adam"
    assert int(restored.optimizer.iterations.numpy()) == iterations
    found = loaded_optimizer_state(restored)
    assert sorted(found) == sorted(state)
    assert any(k.startswith("momentum/") for k in found)
    for key, value in state.items():
        np.testing.assert_allclose(found[key], value, rtol=0, atol=1e-6, err_msg=key)
    x, y = data()
    restored.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    assert int(restored.optimizer.iterations.numpy()) == iterations + STEPS
    return restored


# ---- one process (partitions=1) --------------------------------------------------------------


def trained() -> Net:
    tfsift.init({"microbatches": 2})
    model = Net()
    compiled(model)
    x, y = data()
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    return model


def test_keras_file_is_compiled_with_the_optimizer_state_and_resumes(tmp_path: Path) -> None:
    model = trained()
    model.save(tmp_path / "model.keras")
    restored = check_resumes(tmp_path / "model.keras", optimizer_state(model), STEPS)
    x, y = data()
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)  # the same epoch on
    for mine, theirs in zip(model.get_weights(), restored.get_weights(), strict=True):
        np.testing.assert_allclose(theirs, mine, rtol=0, atol=1e-5)


def test_model_checkpoint_writes_a_compiled_keras_file(tmp_path: Path) -> None:
    tfsift.init({"microbatches": 2})
    model = compiled(Net())
    x, y = data()
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "m-{epoch}.keras"))
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0, callbacks=[checkpoint])
    check_resumes(tmp_path / "m-1.keras", optimizer_state(model), STEPS)


def test_an_unregistered_custom_loss_is_named_when_saving(tmp_path: Path) -> None:
    class Unregistered(keras.losses.Loss):  # type: ignore[misc]
        def call(self, y_true: Any, y_pred: Any) -> Any:
            return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)

    tfsift.init({"microbatches": 2})
    model = Net()
    model.compile(optimizer="sgd", loss=Unregistered())
    x, y = data()
    model.fit(x, y, batch_size=B, epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"register_keras_serializable.*Received: "):
        model.save(tmp_path / "model.keras")
    assert not (tmp_path / "model.keras").exists()


def test_a_plain_keras_weights_file_loads_and_tfsifts_loads_into_plain_keras(
    tmp_path: Path,
) -> None:
    x, y = data()
    plain = compiled(Plain())
    plain.fit(*data(seed=5), batch_size=B, epochs=1, verbose=0)  # the file holds its optimizer
    plain.save_weights(tmp_path / "plain.weights.h5")
    model = trained()
    assert not np.allclose(model.get_weights()[0], plain.get_weights()[0])
    iterations = int(model.optimizer.iterations.numpy())
    model.load_weights(tmp_path / "plain.weights.h5")
    for mine, theirs in zip(model.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    assert int(model.optimizer.iterations.numpy()) == iterations  # the file's is left out
    # Plain's .keras file, its class not registered: Keras' load_weights reads it by
    # attribute, without the class (tfsift's load_model of it could not locate Plain)
    plain.fit(*data(seed=6), batch_size=B, epochs=1, verbose=0)
    plain.save(tmp_path / "plain.keras")
    model.load_weights(tmp_path / "plain.keras")
    for mine, theirs in zip(model.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)

    model.fit(x, y, batch_size=B, epochs=1, verbose=0)
    model.save_weights(tmp_path / "tfsift.weights.h5")
    other = Plain()
    other(x[:2])
    other.load_weights(tmp_path / "tfsift.weights.h5")
    for mine, theirs in zip(model.get_weights(), other.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_a_weights_file_of_other_layers_is_refused_naming_both_layouts(tmp_path: Path) -> None:
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5)])
    other.save_weights(tmp_path / "other.weights.h5")
    model = trained()
    before = model.get_weights()
    with pytest.raises(ValueError, match="nor those of the functional model") as raised:
        model.load_weights(tmp_path / "other.weights.h5")
    assert "expected a weights file of a model with the same layers. Received, by attribute:" in (
        str(raised.value)
    )
    for mine, then in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(mine, then)


def test_set_weights_before_the_first_step_says_to_run_one() -> None:
    tfsift.init({"microbatches": 2})
    plain = Plain()
    plain(data()[0][:2])
    model = compiled(Net())
    with pytest.raises(
        ValueError,
        match=r"needs DistributedModel 'net\w*' partitioned, which happens at its first step.*"
        + re.escape("Received: 6 arrays for the 0 weights its layers have made so far"),
    ):
        model.set_weights(plain.get_weights())
    x, y = data()
    model.fit(x, y, batch_size=B, epochs=1, verbose=0)
    model.set_weights(plain.get_weights())  # after a step, as the message says
    np.testing.assert_array_equal(model.get_weights()[0], plain.get_weights()[0])


# ---- two stages (mpirun -np 2) ----------------------------------------------------------------


@pytest.mark.mpi
@pytest.mark.slow
def test_two_stages_keras_file_resumes_and_weights_files_load_both_ways(tmp_path: Path) -> None:
    reports = mpi.reports(mpi.run(2, __file__, str(tmp_path), timeout=240))
    assert sorted(reports) == [0, 1]
    assert {r["stage"] for r in reports.values()} == {0, 1}
    state: dict[str, np.ndarray] = {}
    for rep in reports.values():
        state.update({k: np.asarray(v) for k, v in rep["state"].items()})
        assert rep["plain_loaded_diff"] == 0.0
    assert any(k.endswith("d1/kernel") for k in state) and any(k.endswith("d3/bias") for k in state)
    restored = check_resumes(tmp_path / "m-1.keras", state, STEPS)
    # the tfsift run's second epoch, and plain Keras' from the file: the same weights
    for mine, theirs in zip(reports[0]["final"], restored.get_weights(), strict=True):
        np.testing.assert_allclose(theirs, np.asarray(mine), rtol=0, atol=1e-5)
    plain = Plain()
    plain(data()[0][:2])
    plain.load_weights(tmp_path / "tfsift.weights.h5")
    for mine, theirs in zip(reports[0]["final"], plain.get_weights(), strict=True):
        np.testing.assert_array_equal(theirs, np.asarray(mine))


class _Record(keras.callbacks.Callback):  # type: ignore[misc]
    """Keeps this rank's optimizer state at the end of the first epoch (``m-1.keras``'s)."""

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if epoch == 0:
            self.state = optimizer_state(self.model)


def job(folder: Path) -> None:
    tfsift.init({"partitions": 2, "microbatches": 2})
    x, y = data()
    model = compiled(Net())
    record = _Record()
    checkpoint = keras.callbacks.ModelCheckpoint(str(folder / "m-{epoch}.keras"))
    model.fit(
        x, y, batch_size=B, epochs=2, shuffle=False, verbose=0, callbacks=[checkpoint, record]
    )
    final = model.get_weights()
    model.save_weights(folder / "tfsift.weights.h5")
    if tfsift.rank() == 0:
        plain = Plain()
        plain(x[:2])
        plain.save_weights(folder / "plain.weights.h5")
        plain.save(folder / "plain.keras")  # Plain not registered: loaded by attribute
    model.load_weights(folder / "tfsift.weights.h5")  # the collective waits for rank 0's file
    model.load_weights(folder / "plain.keras")
    model.load_weights(folder / "plain.weights.h5")
    plain = Plain()
    plain(x[:2])
    plain.load_weights(folder / "plain.weights.h5")
    diff = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(model.get_weights(), plain.get_weights(), strict=True)
    )
    mpi.report(
        rank=tfsift.rank(),
        stage=model.partitioned.stage.index,
        state={k: v.tolist() for k, v in record.state.items()},
        final=[w.tolist() for w in final],
        plain_loaded_diff=diff,
    )


if __name__ == "__main__":
    job(Path(sys.argv[1]))
