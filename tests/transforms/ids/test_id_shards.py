"""The stream's id map in hash-shard keys numbers every window as the one-key map does: the same
ids, the same new rows, whatever the shard count."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.ids.dense_ids import (
    NUMBERED,
    OCCURRENCE,
    dense_ids,
    earliest,
    number,
    shard_of,
    split_by,
)
from kvtrace.transforms.ids.id_shards import (
    InOrder,
    empty_shard,
    ids_of,
    in_order,
    merged,
    new_in_shard,
    number_window,
    shard_parts,
)

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


@given(st.integers(1, 6), st.integers(1, 3), st.randoms(use_true_random=False))
def test_a_step_takes_windows_in_order_each_once_complete(windows, needed, random):
    """Items of windows 0..W-1, needed of each, in any order: each window is taken once, in
    window order, with all its items, never before them."""
    arrivals = [(w, (w, k)) for w in range(windows) for k in range(needed)]
    random.shuffle(arrivals)
    state, taken, came = InOrder(0, {}), [], set()
    for window, item in arrivals:
        came.add(item)
        state, now = in_order(state, window, item, needed)
        for w, items in now:
            assert sorted(items) == [(w, k) for k in range(needed)] and set(items) <= came
        taken += [w for w, _ in now]
    assert taken == list(range(windows)) and state == InOrder(windows, {})


@settings(max_examples=60, deadline=None)
@given(
    st.lists(ROWS, min_size=1, max_size=4),
    st.sampled_from([1, 2, 5]),
    st.randoms(use_true_random=False),
)
def test_the_steps_number_as_one_process_whatever_order_a_runner_delivers(windows, shards, random):
    """The steps as a stream runs them, each a keyed step with in_order: seen sets, then the
    numbering step, then the stores fed by it and queried by the window, every message
    delivered in a random order. Each window's ids are number_window's."""
    tables = [occurrences(rows) for rows in windows]
    expected, parts = [], [empty_shard()] * shards
    for keys in tables:
        numbered, parts = number_window(keys, parts, sum(len(p.ids) for p in parts))
        expected.append(numbered.ids.tolist())
    inbox = []  # (step, shard, window, item)
    for window, keys in enumerate(tables):
        for shard, part in enumerate(shard_parts(keys, shards)):
            inbox.append(("seen", shard, window, earliest(part)))
        for shard, rows in split_by(np.arange(len(keys)), shard_of(keys, shards)):
            inbox.append(("store", shard, window, ("query", rows)))
        for shard in set(range(shards)) - set(shard_of(keys, shards).tolist()):
            inbox.append(("store", shard, window, ("query", np.empty(0, np.int64))))
    seen = [(empty_shard().seen, InOrder(0, {}))] * shards
    stores = [(empty_shard().ids, InOrder(0, {}))] * shards
    numbering, next_id = InOrder(0, {}), 0
    got = [np.full(len(keys), -1) for keys in tables]
    while inbox:
        step, shard, window, item = inbox.pop(random.randrange(len(inbox)))
        if step == "seen":
            hashes, state = seen[shard]
            state, taken = in_order(state, window, item, 1)
            for w, [firsts] in taken:
                new, hashes = new_in_shard(hashes, firsts)
                inbox.append(("number", 0, w, new))
            seen[shard] = hashes, state
        elif step == "number":
            numbering, taken = in_order(numbering, window, item, shards)
            for w, news in taken:
                new = number(np.concatenate(news), next_id)
                next_id += len(new)
                for s, part in enumerate(shard_parts(new, shards)):
                    inbox.append(("store", s, w, ("ids", part)))
        else:
            ids, state = stores[shard]
            state, taken = in_order(state, window, item, 2)
            for w, items in taken:
                ids = merged(ids, dict(items)["ids"])
                rows = dict(items)["query"]
                got[w][rows] = ids_of(ids, tables[w][rows])
            stores[shard] = ids, state
    assert [ids.tolist() for ids in got] == expected
