"""tfsift.sift.stale: the score table against a dictionary that does the same by hand."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tfsift.sift.stale import ScoreCache, find_sorted

# rounds of (keys, losses) from a small pool of keys, so that keys repeat within a round
# and across rounds
ROUNDS = st.lists(
    st.lists(
        st.tuples(st.sampled_from([-2.5, 0.0, 1.0, 3.0, 7.5, 9.0]), st.floats(0, 10)),
        max_size=8,
    ),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(ROUNDS)
def test_the_table_holds_each_keys_latest_round_first_loss_sorted_by_key(
    rounds: list[list[tuple[float, float]]],
) -> None:
    cache, reference = ScoreCache(epochs=100), {}
    for epoch, pairs in enumerate(rounds, start=1):
        if not pairs:
            continue
        keys, losses = (np.array(column) for column in zip(*pairs, strict=True))
        cache.store(keys, losses, epoch)
        firsts: dict[float, tuple[float, int]] = {}
        for key, loss in pairs:
            firsts.setdefault(key, (loss, epoch))  # a key given twice keeps its first loss
        reference.update(firsts)
    state = cache.state()
    assert state["keys"].tolist() == sorted(reference)
    assert state["losses"].tolist() == [reference[k][0] for k in sorted(reference)]
    assert state["epochs"].tolist() == [reference[k][1] for k in sorted(reference)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0, 3.0, 8.0]), max_size=10),
    st.sets(st.sampled_from([0.0, 0.5, 2.0, 8.0, 9.0])),
)
def test_a_sorted_search_finds_what_numpys_isin_finds_and_where(
    keys: list[float], table: set[float]
) -> None:
    """The table's lookups and InfoBatch's plan search their sorted keys: the same answer
    as np.isin, for keys below, between, equal to and past the table's, and for an empty
    table, at the key's position."""
    sorted_table = np.array(sorted(table), np.float64)
    at, found = find_sorted(sorted_table, np.array(keys, np.float64))
    assert found.tolist() == np.isin(keys, sorted_table).tolist()
    assert (sorted_table[at[found]] == np.array(keys)[found]).all()
