"""tfsift.sift.buffer: the sample buffer against a plain list used as a FIFO."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfsift.sift.buffer import SampleBuffer

# ("add", kept positions of a group of 6) or ("take", how many, as a share of the buffer)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.integers(0, 5), unique=True)),
        st.tuples(st.just("take"), st.floats(0.01, 1.0)),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_samples_leave_in_the_order_they_were_kept_with_their_probabilities(
    ops: list[tuple[str, object]],
) -> None:
    buffer, fifo, group = SampleBuffer(), [], 0
    for op, arg in ops:
        if op == "add":
            kept = np.asarray(arg, np.int64)
            rows = np.arange(6) + 10 * group  # sample ids: unique over groups
            leaves = [rows.astype(np.float32), np.stack([rows, -rows], axis=1)]
            buffer.add(leaves, kept, 1.0 / (1.0 + rows[kept]))
            fifo += [int(r) for r in rows[kept]]
            group += 1
        elif fifo:
            n = max(1, int(float(arg) * len(fifo)))  # type: ignore[arg-type]
            (ids, pairs), probs = buffer.take(n)
            expected, fifo = fifo[:n], fifo[n:]
            assert ids.tolist() == expected
            assert pairs.tolist() == [[r, -r] for r in expected]
            assert probs.tolist() == [1.0 / (1.0 + r) for r in expected]
        assert len(buffer) == len(fifo)


def test_taking_more_than_it_holds_is_refused() -> None:
    buffer = SampleBuffer()
    buffer.add([np.arange(4)], np.array([0, 2]), np.array([1.0, 1.0]))
    with pytest.raises(ValueError) as err:
        buffer.take(3)
    assert str(err.value) == "n must be in [1, 2]. Received: n=3"


def test_a_batch_within_one_kept_group_is_not_copied_out() -> None:
    """take joins only the groups a batch spans: a round keeps a few batches' worth, and
    joining the whole buffer at every take copied it once per batch."""
    buffer = SampleBuffer()
    buffer.add([np.arange(10.0)], np.arange(10), np.ones(10))
    buffer.add([np.arange(10.0, 14.0)], np.arange(4), np.ones(4))
    (first,), _ = buffer.take(4)
    (second,), _ = buffer.take(4)
    assert first.base is not None and first.base is second.base  # views of the group's copy
    (spanning,), _ = buffer.take(4)
    assert spanning.tolist() == [8.0, 9.0, 10.0, 11.0]
    assert spanning.base is None  # joined: its own memory
