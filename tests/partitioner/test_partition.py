import doctest

import pytest

import partitioner.partition
from partitioner.partition import Partition


def test_stages_hold_the_layers_between_their_bounds() -> None:
    p = Partition((0, 2, 3, 7))
    assert (p.num_stages, p.num_layers, p.sizes()) == (3, 7, (2, 1, 4))
    assert p.stage_layers(2) == range(3, 7)
    assert [p.stage_of(i) for i in range(7)] == [0, 0, 1, 2, 2, 2, 2]
    assert str(p) == "0..1|2..2|3..6"


def test_from_sizes_inverts_sizes() -> None:
    assert Partition.from_sizes([2, 1, 4]) == Partition((0, 2, 3, 7))


def test_list_bounds_become_a_tuple() -> None:
    assert Partition([0, 1]).bounds == (0, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bounds, message",
    [
        ((0,), "at least two integers"),
        ((1, 2), "must start at 0"),
        ((0, 2, 2), r"strictly increasing \(no empty stage\). Received: bounds=\(0, 2, 2\)"),
        ((0, 1.5), "at least two integers"),
    ],
)
def test_bad_bounds_are_rejected(bounds: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Partition(bounds)


def test_out_of_range_queries_name_the_value() -> None:
    p = Partition((0, 2, 5))
    with pytest.raises(ValueError, match="Received: s=2"):
        p.stage_layers(2)
    with pytest.raises(ValueError, match="Received: layer=5"):
        p.stage_of(5)


def test_validated_checks_the_layer_count() -> None:
    p = Partition((0, 2, 5))
    assert p.validated(5) is p
    with pytest.raises(ValueError, match="cover all 6 layers"):
        p.validated(6)


def test_docstring_examples_run() -> None:
    assert doctest.testmod(partitioner.partition).failed == 0
