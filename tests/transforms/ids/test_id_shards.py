"""The stream's id map in hash-shard keys numbers every window as the one-key map does: the same
ids, the same new rows, whatever the shard count."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.ids.dense_ids import NUMBERED, OCCURRENCE, dense_ids, shard_of
from kvtrace.transforms.ids.id_shards import empty_shard, new_in_shard, number_window

# (key, ts, fp, pos, weight) rows: few keys and times, so windows share hashes and tie often.
ROWS = st.lists(
    st.tuples(
        st.integers(0, 40),
        st.integers(0, 5),
        st.integers(0, 3),
        st.integers(0, 4),
        st.integers(0, 4),
    ),
    max_size=30,
)


def occurrences(rows: list[tuple[int, int, int, int, int]]) -> np.ndarray:
    out = np.zeros(len(rows), dtype=OCCURRENCE)
    for i, (key, ts, fp, pos, weight) in enumerate(rows):
        # lo spreads the keys over the shards as a keyed hash's bits do; keys share high halves
        # four by four, so a store's search meets ties there too.
        out[i]["hi"], out[i]["lo"] = key // 4, (key * 0x9E3779B97F4A7C15) % 2**64
        out[i]["ts"], out[i]["fp"], out[i]["pos"], out[i]["weight"] = ts, fp, pos, weight
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(ROWS, min_size=1, max_size=5), st.sampled_from([1, 2, 3, 7, 64]))
def test_sharded_windows_are_numbered_as_against_the_whole_map(windows, shards):
    """Window after window, ids, new map rows and unique totals are the one-key map's (every
    earlier window's rows, dense_ids from the next id), for any shard count."""
    whole, next_id = np.empty(0, NUMBERED), 0
    parts = [empty_shard()] * shards
    for rows in windows:
        keys = occurrences(rows)
        one_key = dense_ids(keys, lambda _, whole=whole: whole, next_id)
        sharded, parts = number_window(keys, parts, next_id)
        assert sharded.ids.tolist() == one_key.ids.tolist()
        assert sharded.added.tobytes() == one_key.added.tobytes()
        assert (sharded.unique, sharded.added_count) == (one_key.unique, one_key.added_count)
        whole = np.concatenate([whole, one_key.added])
        next_id += one_key.added_count
    # Each id lives in one shard, its hash's own, and nowhere else; nothing is held twice.
    held = np.concatenate([part.ids for part in parts])
    assert sorted(held["id"].tolist()) == list(range(next_id))
    for shard, part in enumerate(parts):
        assert (shard_of(part.ids, shards) == shard).all()
        assert part.seen[["hi", "lo"]].tolist() == part.ids[["hi", "lo"]].tolist()


def test_a_shard_passes_on_only_hashes_it_has_never_seen():
    """The numbering step sees a window's new hashes only, each once: what a shard saw in an
    earlier window (numbered or not yet) stays with the shard."""
    seen = empty_shard().seen
    first = occurrences([(1, 0, 0, 0, 1), (2, 0, 0, 1, 1)])
    new, seen = new_in_shard(seen, first)
    assert len(new) == 2
    new, seen = new_in_shard(seen, occurrences([(2, 1, 0, 0, 1), (5, 1, 0, 1, 1)]))
    assert new[["hi", "lo"]].tolist() == occurrences([(5, 1, 0, 1, 1)])[["hi", "lo"]].tolist()
    assert len(seen) == 3


def test_hashes_sharing_their_high_half_are_told_apart():
    """A store is searched by the hash's high half first: two hashes equal there (2^-64 a pair,
    but possible) are still two keys, each with its own id."""
    keys = occurrences([(1, 0, 0, 0, 1), (2, 0, 0, 1, 1), (3, 1, 0, 0, 1), (1, 2, 0, 0, 1)])
    keys["hi"] = 7  # every key's high half the same; the low halves differ
    first, parts = number_window(keys, [empty_shard()], 0)
    assert first.ids.tolist() == dense_ids(keys).ids.tolist() == [0, 1, 2, 0]
    again = occurrences([(3, 5, 0, 0, 1), (9, 5, 0, 1, 1), (2, 6, 0, 0, 1)])
    again["hi"] = 7
    second, _ = number_window(again, parts, 3)
    assert second.ids.tolist() == [2, 3, 1] and second.added_count == 1
