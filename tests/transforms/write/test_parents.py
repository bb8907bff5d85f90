"""Each row's parent (write/parents.py): the latest earlier row named by the link it continues."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.encode.hashed_batch import NO_LINK
from kvtrace.transforms.trace_format import NO_PARENT
from kvtrace.transforms.write.parents import parent_ranks


def brute_force(rank, parent_key, named_rank, named_key) -> list[int]:
    return [
        max((r for r, k in zip(named_rank, named_key) if k == key and r < own), default=NO_PARENT)
        if key != NO_LINK
        else NO_PARENT
        for own, key in zip(rank, parent_key)
    ]


def test_children_branches_and_links_to_nothing():
    # rows in published order 0..4; row 0 named by key 5 (its response) and 6 (a call)
    rank = np.arange(5)
    parent_key = np.array([NO_LINK, 5, 5, 6, 9], np.uint64)
    named_rank, named_key = np.array([0, 0, 1]), np.array([5, 6, 7], np.uint64)
    # rows 1 and 2 both continue row 0 (a branch), row 3 answers its call, row 4 names nothing
    assert parent_ranks(rank, parent_key, named_rank, named_key).tolist() == [-1, 0, 0, 0, -1]


def test_a_parent_precedes_its_child_and_is_never_itself():
    rank = np.array([2, 0, 1])  # rows given out of published order
    parent_key = np.array([3, 3, NO_LINK], np.uint64)
    # the key names rows of ranks 2 and 1: rank 2's child may take rank 1, rank 0's none
    named_rank, named_key = np.array([2, 1]), np.array([3, 3], np.uint64)
    assert parent_ranks(rank, parent_key, named_rank, named_key).tolist() == [1, -1, -1]


@given(
    st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(1, 3), max_size=3)), max_size=12),
    st.randoms(use_true_random=False),
)
def test_the_latest_earlier_named_row_as_brute_force_finds_it(rows, random):
    rank = np.arange(len(rows))
    random.shuffle(order := list(range(len(rows))))
    rank = rank[order]  # rows in any order, each with its published rank
    parent_key = np.array([rows[i][0] for i in range(len(rows))], np.uint64)
    named_rank = np.array([r for r, (_, keys) in zip(rank, rows) for _ in keys], np.int64)
    named_key = np.array([k for _, keys in rows for k in keys], np.uint64)
    got = parent_ranks(rank, parent_key, named_rank, named_key).tolist()
    assert got == brute_force(rank.tolist(), parent_key.tolist(), named_rank, named_key)
