"""Layer paths: the attribute chain from the model, public first, the deepest layer owning."""

from __future__ import annotations

from typing import Any

import keras

from tfsift.checkpoint.paths import layer_paths, variable_keys


class Block(keras.layers.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.inner = keras.layers.Dense(2)
        self.scale = self.add_weight(shape=(), initializer="ones", name="scale")

    def call(self, x: Any) -> Any:
        return self.inner(x) * self.scale


class Net(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = [Block(), keras.layers.Dense(3)]
        self.heads = {"main": keras.layers.Dense(4)}
        self._hidden = keras.layers.Dense(5)
        self.drop = keras.layers.Dropout(0.1)
        self.alias = self.blocks[1]  # the same layer twice: its first path wins

    def call(self, x: Any) -> Any:
        h = self.blocks[1](self.blocks[0](x))
        return self.drop(self._hidden(self.heads["main"](h)))


def built() -> Net:
    net = Net()
    net(keras.ops.zeros((1, 3)))
    return net


def test_paths_follow_attributes_lists_and_dicts_and_prefer_public_ones() -> None:
    paths = sorted(path for path, _ in layer_paths(built()).values())
    assert paths == ["_hidden", "blocks/0", "blocks/0/inner", "blocks/1", "drop", "heads/main"]


def test_a_variable_belongs_to_the_deepest_layer_holding_it() -> None:
    net = built()
    keys = variable_keys(net)
    assert [keys[id(v)] for v in net.variables] == [
        "blocks/0/scale",
        "blocks/0/inner/kernel",
        "blocks/0/inner/bias",
        "blocks/1/kernel",
        "blocks/1/bias",
        "heads/main/kernel",
        "heads/main/bias",
        "_hidden/kernel",
        "_hidden/bias",
        "drop/seed_generator_state",
    ]


def test_keys_do_not_depend_on_layer_names_or_on_other_models_made_first() -> None:
    first = built()
    keras.layers.Dense(7)  # shifts every automatic layer name of the next model
    second = built()
    assert [b.name for b in first.blocks] != [b.name for b in second.blocks]
    keys_a, keys_b = variable_keys(first), variable_keys(second)
    assert [keys_a[id(v)] for v in first.variables] == [keys_b[id(v)] for v in second.variables]


def test_a_layer_reached_by_no_attribute_is_named_after_the_layer() -> None:
    net = built()
    orphan = keras.layers.Dense(2, name="orphan")
    orphan.build((None, 2))
    keys = variable_keys(net, [orphan])
    assert [keys[id(v)] for v in orphan.variables] == ["orphan/kernel", "orphan/bias"]
