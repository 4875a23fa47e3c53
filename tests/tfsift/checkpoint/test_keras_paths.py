"""Keras' own save paths on a partitioned DistributedModel: whole-model files, counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfsift


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(8, activation="relu")
        self.norm = keras.layers.BatchNormalization()
        self.b = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        h = self.a(x)
        return self.b(self.norm(keras.ops.add(h, h)))


def partitioned() -> Net:
    tfsift.init({})
    model = Net()
    model.partition_model([tf.zeros((4, 5))])
    return model


def test_keras_save_paths_write_whole_model_files_that_load_back(tmp_path: Path) -> None:
    model = partitioned()
    model.save(tmp_path / "m.keras")  # collective: tfsift.save_model
    model.save_weights(tmp_path / "m.weights.h5")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.keras", "m.weights.h5"]
    assert keras.saving.load_model(tmp_path / "m.keras").count_params() == model.count_params()
    for name in ("m.keras", "m.weights.h5"):
        other = partitioned()  # other initial weights
        other.load_weights(tmp_path / name)
        for a, b in zip(other.variables, model.variables, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(FileExistsError, match=r"exists and overwrite=False"):
        model.save(tmp_path / "m.keras", overwrite=False)


def test_count_params_counts_every_stage_like_keras() -> None:
    model = partitioned()
    inputs = keras.Input((5,))
    reference = keras.Model(inputs, Net().call(inputs))
    assert (
        model.count_params() == reference.count_params() == 48 + 32 + 27
    )  # BatchNorm: gamma, beta and the two statistics


def test_summary_lists_each_stages_layers_and_marks_this_ranks() -> None:
    model = partitioned()
    lines: list[str] = []
    model.summary(print_fn=lines.append)
    assert lines[0] == f'Model "{model.name}": partitions=1; this rank holds stage 0'
    assert lines[1].split() == ["stage", "node", "layer", "output", "shape", "params"]
    part = model.partitioned
    assert part is not None
    names = [node.name for node in part.graph.nodes]
    assert names[0] == model.a.name and names[-1] == model.b.name
    assert [line.split()[:3] for line in lines[2:6]] == [
        ["0", names[0], "Dense"],
        ["0", names[1], "Add"],
        ["0", names[2], "BatchNormalization"],
        ["0", names[3], "Dense"],
    ]
    assert "(None, 8)" in lines[2] and lines[2].split()[-1] == "48"
    assert lines[6] == f"stage 0: {', '.join(names)} (107 params)  <- this rank"
    assert lines[7] == "Total params: 107 (all stages)"


def test_an_unpartitioned_model_keeps_keras_behaviour() -> None:
    tfsift.init({})
    model = Net()
    lines: list[str] = []
    model.summary(print_fn=lines.append)
    assert "(unbuilt)" in "".join(lines)  # Keras' own table
