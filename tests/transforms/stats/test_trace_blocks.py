"""stats.trace_blocks.prefix_ids: exactly a plain trie's breadth-first numbering, whatever the
rows' lengths, ids or order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import trace_of
from kvtrace.transforms.stats.trace_blocks import prefix_ids, rows_in_sequence_order


def trie_numbering(rows: list[list[int]]) -> list[int]:
    """The reference: every distinct prefix numbered by length, then as a sequence of ids."""
    by_length: dict[int, set[tuple[int, ...]]] = {}
    for row in rows:
        for end in range(1, len(row) + 1):
            by_length.setdefault(end, set()).add(tuple(row[:end]))
    number = {}
    for length in sorted(by_length):
        for prefix in sorted(by_length[length]):
            number[prefix] = len(number)
    return [number[tuple(row[:end])] for row in rows for end in range(1, len(row) + 1)]


# Few distinct ids, so rows share prefixes, repeat, and begin one another; and ids far apart
# (negative, past 2^32) for the byte order of wide ids.
ROW = st.lists(st.integers(0, 3), max_size=12) | st.lists(
    st.sampled_from([-(2**40), -1, 0, 2**32, 2**40]), max_size=6
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ROW, max_size=30))
def test_prefix_ids_number_prefixes_as_a_plain_trie_does(rows):
    trace = trace_of([(0, 0.0, row) for row in rows])
    assert prefix_ids(trace).tolist() == trie_numbering(rows)


@given(st.lists(ROW, max_size=30))
def test_rows_in_sequence_order_sort_rows_as_python_sorts_lists(rows):
    trace = trace_of([(0, 0.0, row) for row in rows])
    order = rows_in_sequence_order(trace.ids, trace.offsets)
    assert order.tolist() == sorted(range(len(rows)), key=rows.__getitem__)


def test_one_long_row_and_its_repeat_share_every_prefix():
    """Two equal rows of 300,000 ids (one loop per position would be 300,000 numpy rounds)."""
    row = [0] * 300_000
    prefix = prefix_ids(trace_of([(0, 0.0, row), (0, 1.0, row), (0, 2.0, [0, 1])]))
    position = np.arange(300_000)
    # [0, 1] ends the third prefix: (0,) then (0, 0) then (0, 1)
    assert np.array_equal(prefix[:300_000], position + (position >= 2))
    assert np.array_equal(prefix[300_000:600_000], prefix[:300_000])
    assert prefix[600_000:].tolist() == [0, 2]
