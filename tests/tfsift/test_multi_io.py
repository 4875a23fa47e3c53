"""Models with a dict or list input and several outputs, pipelined like Keras calls them;
``fit`` and ``evaluate`` of a model of two outputs with a list or dict of losses, as Keras'."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
from mpi_scripts.multi_io_check import (
    FIT_CASES,
    KerasHeads,
    TwoHeads,
    check,
    fit_check,
    fit_data,
    placed,
    sifted,
    sifted_tokens,
)

import mpi


@pytest.mark.parametrize("name", ["dict", "pair"])
def test_nested_inputs_and_two_outputs_in_one_process(name: str) -> None:
    result = check(name, 1, 2)
    assert result["grad_error"] < 1e-5
    assert result["loss"] == pytest.approx(result["ref_loss"], rel=1e-5)


LOGS = {
    # Keras names each loss of a subclassed model's list of outputs by the loss, and by
    # the output's key in a dict (its logs: History's, validation's, evaluate's)
    "list": ["accuracy", "loss", "mae", "mse_loss", "sparse_categorical_crossentropy_loss"],
    "dict": ["classes_accuracy", "classes_loss", "loss", "value_loss"],
}
KEYS = {case: sorted(keys + [f"val_{k}" for k in keys]) for case, keys in LOGS.items()}


def assert_as_keras(fits: dict[str, Any]) -> None:
    for case, keys in KEYS.items():
        got = fits[case]
        assert got["keys"] == keys and got["same_keys"], got
        for what in ("history", "evaluate", "weights"):
            assert got[what] < 1e-6, (case, what, got)


def test_fit_of_two_outputs_in_one_process_is_keras() -> None:
    assert_as_keras({case: fit_check(case, 1, 2) for case in KEYS})


def test_a_padded_batch_with_weights_per_output_trains_and_evaluates_as_keras() -> None:
    # 37 samples in batches of 16 on 2 microbatches: the last, of 5, padded with a copy
    # weighed 0 in each output's weights (refused at the last batch before this change)
    placed(1, 2)
    x, y, v, _ = fit_data()
    rng = np.random.default_rng(5)
    targets = {"classes": y[:37], "value": v[:37]}
    weights = {"classes": rng.uniform(size=37), "value": rng.uniform(size=37)}
    runs = []
    for model in (KerasHeads(True), TwoHeads(True)):
        model.compile(optimizer=keras.optimizers.SGD(0.1), **FIT_CASES["dict"])
        history = model.fit(
            x[:37], targets, sample_weight=weights, batch_size=16, epochs=2, shuffle=False,
            verbose=0,
        ).history  # fmt: skip
        # the same batches: the last, of 5, in Keras' plain mean of each output's loss
        evaluated = model.evaluate(x[:37], targets, sample_weight=weights, batch_size=16)
        runs.append((history["loss"], evaluated, model.get_weights()))
    (loss, evaluated, weights_keras), (got_loss, got_evaluated, got_weights) = runs
    np.testing.assert_allclose(got_loss, loss, rtol=1e-6)
    np.testing.assert_allclose(got_evaluated, evaluated, rtol=1e-6)
    for a, b in zip(got_weights, weights_keras, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def assert_partial_as_keras(partial: dict[str, Any]) -> None:
    # fit on arrays whose epochs end with a partial batch (each replica's rest): Keras'
    assert partial["keys"], partial
    assert partial["history"] < 1e-6 and partial["weights"] < 1e-6, partial


ON_TWO_STAGES = mpi.TWO_STAGES.scenario("multi_io_check.py", "2", "2", timeout=240)


@pytest.mark.mpi
@pytest.mark.slow
@mpi.TWO_STAGES.mark
def test_nested_inputs_and_two_outputs_on_two_stages() -> None:
    reports = ON_TWO_STAGES()
    assert len(reports) == 2
    for rank, rep in reports.items():
        for name, result in rep["results"].items():
            assert result["grad_error"] < 1e-5, (rank, name, result)
            assert result["loss"] == pytest.approx(result["ref_loss"], rel=1e-5)
    assert sum(rep["results"]["dict"]["num_grads"] for rep in reports.values()) == 10
    for rep in reports.values():
        assert_as_keras(rep["fits"])
        assert_partial_as_keras(rep["partial"])


@pytest.mark.mpi
@pytest.mark.slow
@mpi.TWO_STAGES.mark
@pytest.mark.parametrize("case", ["heads", "tokens"])
def test_infobatch_in_fit_on_two_stages_trains_as_one_process(case: str) -> None:
    # heads: one head on each stage, a sample scored by the weighted sum of both losses;
    # tokens: per-token logits, a sample scored by the mean of its tokens' losses
    reports = ON_TWO_STAGES()
    one = (sifted if case == "heads" else sifted_tokens)(1, 2)
    # InfoBatch prunes half of the samples below the mean score in every epoch but the first
    assert (
        one["history"]["sift_kept"] == {"heads": [1.0, 0.5, 0.5], "tokens": [1.0, 0.75, 0.75]}[case]
    )
    on_stage = {
        "heads": {
            0: ["classes/bias", "classes/kernel", "hidden/bias", "hidden/kernel"],
            1: ["value/bias", "value/kernel"],
        },
        "tokens": {
            0: ["block/bias", "block/kernel", "embed/embeddings"],
            1: ["head/bias", "head/kernel"],
        },
    }[case]
    assert {r: sorted(rep["sifted"][case]["weights"]) for r, rep in reports.items()} == on_stage
    weights: dict[str, Any] = {}
    for rep in reports.values():
        history = rep["sifted"][case]["history"]
        assert sorted(history) == sorted(one["history"])
        for key, values in one["history"].items():
            np.testing.assert_allclose(history[key], values, rtol=1e-5, err_msg=key)
        weights.update(rep["sifted"][case]["weights"])
    assert sorted(weights) == sorted(one["weights"])
    for key, value in one["weights"].items():
        np.testing.assert_allclose(weights[key], value, atol=1e-6, err_msg=key)


ON_TWO_BY_TWO = mpi.CLUSTER_2X2.scenario("multi_io_check.py", "2", "2", "fits", timeout=240)


@pytest.mark.mpi
@pytest.mark.slow
@mpi.CLUSTER_2X2.mark
def test_fit_of_two_outputs_on_two_stages_and_two_replicas_is_keras() -> None:
    # each output's loss averaged over the replicas as the loss is: Keras' of both batches
    reports = ON_TWO_BY_TWO()
    assert len(reports) == 4
    for rep in reports.values():
        assert_as_keras(rep["fits"])
        assert_partial_as_keras(rep["partial"])
