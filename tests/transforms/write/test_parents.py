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


def test_shards_resolved_key_by_key_give_the_whole_nights_parents():
    """The Beam engine's way (each shard ranked from the counts before it, each key's links
    resolved alone) numbers the same parents as the local engine's over the whole night."""
    import numpy as np

    from kvtrace.transforms.write.parents import (
        link_occurrences,
        resolve_key,
        set_parents,
        with_parents,
    )
    from kvtrace.transforms.write.rows import ROW, RowBatch

    # six rows in time order; keys 11 and 12 name rows 0 and 3; rows 1, 2 continue 11, row 4
    # continues 12, row 5 continues 13 (nothing)
    rows = np.zeros(6, dtype=ROW)
    rows["timestamp_ms"] = np.arange(6) * 1000
    rows["fingerprint"] = np.arange(6)
    rows["parent_key"] = [NO_LINK, 11, 11, NO_LINK, 12, 13]
    rows["num_links"] = [1, 0, 0, 1, 0, 0]
    whole = RowBatch(rows, np.zeros(0, np.int64), links=np.array([11, 12], np.uint64))
    expected = (with_parents(RowBatch.concat([whole])).sorted().rows["parent"] - 1).tolist()
    assert expected == [-1, 0, 0, -1, 3, -1]

    shards = {0: whole.select(np.arange(0, 2)), 1: whole.select(np.arange(2, 6))}
    shards = {s: b.sorted() for s, b in shards.items()}
    counts = {s: len(b.rows) for s, b in shards.items()}
    by_key: dict = {}
    for shard, batch in shards.items():
        for key, occurrence in link_occurrences(shard, batch, counts):
            by_key.setdefault(key, []).append(occurrence)
    found: dict = {}
    for key, occurrences in by_key.items():
        for shard, parent in resolve_key(key, occurrences):
            found.setdefault(shard, []).append(parent)
    got = [
        p
        for shard in sorted(shards)
        for p in (set_parents(shards[shard], found.get(shard, [])).rows["parent"] - 1).tolist()
    ]
    assert got == expected
