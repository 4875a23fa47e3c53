"""Optimizer slots keyed by their variable's layer path: saved and loaded in any order."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tfsift.checkpoint import optimizer as optimizer_lib


def dense(name: str, units: int = 3) -> keras.layers.Dense:
    layer = keras.layers.Dense(units, name=name)
    layer.build((None, 2))
    return layer


def trained(optimizer: keras.optimizers.Optimizer, keyed: list[tuple[str, object]]) -> None:
    variables = [v for _, v in keyed]
    optimizer.apply_gradients(
        [(keras.ops.ones(v.shape) * (i + 1), v) for i, v in enumerate(variables)]
    )


@pytest.mark.parametrize(
    ("make", "kinds"),
    [
        (lambda: keras.optimizers.Adam(0.1), ["momentum", "velocity"]),
        (lambda: keras.optimizers.SGD(0.1, momentum=0.9), ["momentum"]),
    ],
)
def test_slots_are_keyed_by_kind_and_layer_path(make: object, kinds: list[str]) -> None:
    a, b = dense("a"), dense("b")
    keyed = [("enc/kernel", a.kernel), ("enc/bias", a.bias), ("dec/kernel", b.kernel)]
    opt = make()  # type: ignore[operator]
    trained(opt, keyed)
    stored = optimizer_lib.arrays(opt, keyed)
    want = {f"{kind}/{key}" for kind in kinds for key, _ in keyed}
    assert set(stored) == want | {"iteration", "learning_rate"}


def test_slots_load_into_an_optimizer_built_for_another_order() -> None:
    a, b = dense("a"), dense("b", 4)
    keyed = [("x/kernel", a.kernel), ("y/kernel", b.kernel)]
    opt = keras.optimizers.Adam(0.1)
    trained(opt, keyed)
    stored = optimizer_lib.arrays(opt, keyed)
    again = keras.optimizers.Adam(0.1)
    reversed_keys = list(reversed(keyed))
    again.build([v for _, v in reversed_keys])
    slots = {k: v for k, v in stored.items() if "/" in k}
    others = {k: v for k, v in stored.items() if "/" not in k}
    optimizer_lib.load(again, reversed_keys, slots, others)
    got = optimizer_lib.arrays(again, reversed_keys)
    assert sorted(got) == sorted(stored)
    for key, value in stored.items():
        np.testing.assert_array_equal(got[key], value)
    assert int(again.iterations.numpy()) == 1


def test_two_variables_with_one_path_are_told_apart_by_their_order() -> None:
    a, b = dense("same"), dense("same")
    keyed = [("first/kernel", a.kernel), ("second/kernel", b.kernel)]
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    trained(opt, keyed)
    stored = optimizer_lib.arrays(opt, keyed)
    assert stored["momentum/first/kernel"][0, 0] != stored["momentum/second/kernel"][0, 0]


def test_a_missing_slot_is_an_error_naming_it() -> None:
    a = dense("a")
    opt = keras.optimizers.Adam(0.1)
    opt.build([a.kernel])
    with pytest.raises(ValueError, match="no optimizer value for 'momentum/a/kernel'"):
        optimizer_lib.load(opt, [("a/kernel", a.kernel)], {}, {})
