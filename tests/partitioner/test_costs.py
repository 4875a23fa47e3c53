import doctest
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import partitioner.costs
from partitioner.costs import CostModel, LayerCost, format_bytes

layers = st.builds(
    LayerCost,
    name=st.text(min_size=1, max_size=5),
    forward_time=st.floats(0, 1e3),
    backward_time=st.floats(0, 1e3),
    param_bytes=st.integers(0, 2**40),
    activation_bytes=st.integers(0, 2**30),
    output_bytes=st.integers(0, 2**30),
)
cost_models = st.builds(
    CostModel,
    layers=st.lists(layers, min_size=1, max_size=6, unique_by=lambda x: x.name).map(tuple),
    batch_size=st.integers(1, 64),
    optimizer_multiplier=st.floats(0, 8),
    bandwidth=st.one_of(st.floats(1.0, 1e12), st.just(math.inf)),
    latency=st.floats(0, 1.0),
)


def layer(name: str = "l", **overrides: object) -> LayerCost:
    fields: dict[str, object] = dict(
        forward_time=1.0, backward_time=2.0, param_bytes=10, activation_bytes=5, output_bytes=100
    )
    fields.update(overrides)
    return LayerCost(name, **fields)  # type: ignore[arg-type]


def chain(*layers: LayerCost, **options: object) -> CostModel:
    return CostModel(layers, **options)  # type: ignore[arg-type]


def test_negative_time_names_field_layer_and_value() -> None:
    layers = [layer(f"l{i}") for i in range(3)] + [layer("dense_1", forward_time=-1.0)]
    with pytest.raises(ValueError) as info:
        chain(*layers)
    assert str(info.value) == (
        "forward_time must be a finite number >= 0. Received: layers[3] ('dense_1') "
        "forward_time=-1.0"
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("backward_time", math.nan),
        ("backward_time", math.inf),
        ("param_bytes", -1),
        ("activation_bytes", 1.5),
        ("output_bytes", True),
    ],
)
def test_bad_layer_field_is_rejected_with_its_value(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"Received: layers\\[0\\] \\('l'\\) {field}="):
        chain(layer("l", **{field: value}))


def test_empty_chain_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least one layer"):
        CostModel(())


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"layers\[2\] \('a'\) duplicates layers\[0\]"):
        chain(layer("a"), layer("b"), layer("a"))


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("batch_size", 0, "batch_size must be an integer >= 1. Received: batch_size=0"),
        ("bandwidth", 0.0, "bandwidth must be a number > 0. Received: bandwidth=0.0"),
        ("bandwidth", math.nan, "bandwidth must be a number > 0"),
        ("latency", -1.0, "latency must be a finite number >= 0. Received: latency=-1.0"),
        ("optimizer_multiplier", math.inf, "optimizer_multiplier must be a finite number"),
    ],
)
def test_bad_option_is_rejected(option: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        chain(layer(), **{option: value})


def test_cut_time_is_latency_plus_bytes_over_bandwidth() -> None:
    costs = chain(
        layer("a", output_bytes=300), layer("b"), batch_size=2, bandwidth=100.0, latency=0.5
    )
    assert costs.cut_time(0) == 0.5 + 300 * 2 / 100.0
    assert costs.prefix.cut.tolist() == [0.0, 6.5, 0.0]
    with pytest.raises(ValueError, match="Received: i=2"):
        costs.cut_time(2)


def test_infinite_bandwidth_makes_cuts_free() -> None:
    costs = chain(layer("a"), layer("b"), bandwidth=math.inf)
    assert costs.cut_time(0) == 0.0


def test_prefix_sums_cover_times_state_and_activations_per_microbatch() -> None:
    costs = chain(layer("a"), layer("b", param_bytes=3), batch_size=4, optimizer_multiplier=2.5)
    p = costs.prefix
    assert p.compute.tolist() == [0.0, 3.0, 6.0]
    assert p.state_bytes.tolist() == [0, 25, 33]  # rint(10 * 2.5), rint(3 * 2.5) = 8
    assert p.activation_bytes.tolist() == [0, 20, 40]
    assert p.input_bytes.tolist() == [0, 400, 0]


@settings(max_examples=50, deadline=None)
@given(cost_models)
def test_json_round_trips_and_keeps_the_fingerprint(costs: CostModel) -> None:
    again = CostModel.from_json(costs.to_json())
    assert again == costs
    assert again.fingerprint() == costs.fingerprint()


def test_fingerprint_changes_with_any_cost() -> None:
    base = chain(layer("a"), layer("b"))
    assert base.fingerprint() == chain(layer("a"), layer("b")).fingerprint()
    assert base.fingerprint() != chain(layer("a"), layer("b", output_bytes=101)).fingerprint()
    assert base.fingerprint() != chain(layer("a"), layer("b"), batch_size=2).fingerprint()


def test_save_and_load_round_trip(tmp_path: object) -> None:
    path = f"{tmp_path}/costs.json"
    costs = chain(layer("a"), layer("b"), bandwidth=2e9)
    costs.save(path)
    assert CostModel.load(path) == costs


def test_from_dict_rejects_unknown_and_missing_keys() -> None:
    data = chain(layer("a")).to_dict()
    data["bandwith"] = 1.0
    with pytest.raises(ValueError, match=r"unknown=\['bandwith'\]"):
        CostModel.from_dict(data)
    data = chain(layer("a")).to_dict()
    del data["layers"][0]["output_bytes"]
    with pytest.raises(ValueError, match=r"layers\[0\] keys .* missing=\['output_bytes'\]"):
        CostModel.from_dict(data)


def test_from_dict_rejects_another_format() -> None:
    data = json.loads(chain(layer("a")).to_json())
    data["format"] = "other/2"
    with pytest.raises(ValueError, match="Received: format='other/2'"):
        CostModel.from_dict(data)


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (3 * 2**30, "3.00 GiB"),
        (2**60, "1024.00 PiB"),
    ],
)
def test_format_bytes_uses_binary_units(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_docstring_examples_run() -> None:
    assert doctest.testmod(partitioner.costs).failed == 0


def test_shared_weights_are_held_as_copies_where_their_first_call_is_not() -> None:
    # l0 and l3 call the same weights (a tied embedding): counted once, at l0
    costs = chain(*(layer(f"l{i}", param_bytes=100 * (i + 1)) for i in range(4)),
                  optimizer_multiplier=2.0, shared=((0, 3),))  # fmt: skip
    assert costs.copy_bytes(0, 4) == 0  # one stage holds both calls: no copy
    assert costs.copy_bytes(0, 2) == 0  # the owner
    assert costs.copy_bytes(2, 4) == 200  # l0's state: 100 bytes x 2
    assert costs.copy_bytes(1, 3) == 0  # calls none of them
    assert costs.exchange_time((0, 4)) == 0.0


def test_holders_of_shared_weights_exchange_their_gradients_once() -> None:
    costs = chain(*(layer(f"l{i}", param_bytes=1000) for i in range(4)), bandwidth=1e3,
                  latency=0.5, shared=((0, 3), (1, 2)))  # fmt: skip
    assert costs.exchange_time((0, 1, 4)) == 0.5 + 1000 / 1e3  # only (0, 3) is split
    assert costs.exchange_time((0, 2, 4)) == 2 * (0.5 + 1000 / 1e3)  # both are
    three = chain(*(layer(f"l{i}", param_bytes=1000) for i in range(4)), bandwidth=1e3,
                  latency=0.5, shared=((0, 1, 3),))  # fmt: skip
    assert three.exchange_time((0, 1, 2, 4)) == 0.5 + 2 * 1000 / 1e3  # three holders
    assert three.exchange_time((0, 2, 4)) == 0.5 + 1000 / 1e3


def test_a_rank_of_several_chunks_holds_one_copy_and_exchanges_as_one_holder() -> None:
    costs = chain(*(layer(f"l{i}", param_bytes=1000) for i in range(4)), bandwidth=1e3,
                  latency=0.5, optimizer_multiplier=1.0, shared=((0, 2), (1, 3)))  # fmt: skip
    # chunks 0..3 of one layer each on 2 ranks: rank 0 runs 0 and 2, rank 1 runs 1 and 3
    assert costs.copy_bytes(0, 1, (2, 3)) == 0 and costs.copy_bytes(1, 2, (3, 4)) == 0
    assert costs.exchange_time((0, 1, 2, 3, 4), ranks=2) == 0.0
    assert costs.exchange_time((0, 1, 2, 3, 4)) == 2 * (0.5 + 1000 / 1e3)  # as 4 stages
    # (0, 3) across ranks: rank 1 holds one copy of l0 however many of its chunks call it
    across = chain(*(layer(f"l{i}", param_bytes=1000) for i in range(4)), bandwidth=1e3,
                   latency=0.5, optimizer_multiplier=1.0, shared=((0, 1, 3),))  # fmt: skip
    assert across.copy_bytes(1, 2, (3, 4)) == 1000
    assert across.exchange_time((0, 1, 2, 3, 4), ranks=2) == 0.5 + 1000 / 1e3


def test_shared_round_trips_and_only_changes_the_fingerprint_when_present() -> None:
    plain = chain(layer("a"), layer("b"))
    tied = chain(layer("a"), layer("b"), shared=((0, 1),))
    assert "shared" not in plain.to_dict()  # older fingerprints stay valid
    assert CostModel.from_dict(json.loads(json.dumps(tied.to_dict()))) == tied
    assert tied.fingerprint() != plain.fingerprint()


@pytest.mark.parametrize("shared", [((0,),), ((1, 0),), ((0, 2),), ((0, 0),)])
def test_bad_shared_groups_are_refused(shared: tuple[tuple[int, ...], ...]) -> None:
    with pytest.raises(ValueError) as err:
        chain(layer("a"), layer("b"), shared=shared)
    assert str(err.value) == (
        "shared must hold groups of two or more ascending layer indices in [0, 2). "
        f"Received: shared={shared!r}"
    )


def test_a_file_that_is_no_cost_file_is_named_as_such(tmp_path: Path) -> None:
    # `tfsift plan model.py` said only "error: Expecting value: line 1 column 1 (char 0)"
    script = tmp_path / "model.py"
    script.write_text("import keras\n")
    with pytest.raises(ValueError) as err:
        CostModel.load(script)
    assert str(err.value) == (
        f"{script} is not a cost file: expected the JSON that `tfsift profile -o` (or "
        "CostModel.save) writes; reading it failed at line 1, column 1: Expecting value"
    )
