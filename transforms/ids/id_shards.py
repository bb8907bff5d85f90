"""A stream's id map in hash-shard keys: the pure part.

A window is numbered exactly as dense_ids numbers it against the whole map (first use in the
window, new ids from the stream's next id), in steps none of which holds the whole map:
1. the window's first occurrences split by hash shard (a hash's shard from its own bits,
   dense_ids.shard_of); each shard's seen set passes on only the hashes it has never seen
   (new_in_shard), and now counts them seen;
2. one numbering step over the window's NEW first occurrences of every shard, nothing else
   (dense_ids.number: the order of first use, the batch job's);
3. each shard's id store takes the new ids of its own hashes (merged), and maps the window's
   occurrences of its hashes to ids (ids_of).
The seen set runs ahead of the id store: a shard can judge the next window's hashes before this
window's ids come back from the numbering step, which is what lets a Beam graph without cycles
carry it (seen sets, then numbering, then stores fed by it). A runner may deliver a step's
inputs in any order: each step takes windows in their published order, each once complete
(in_order), so the ids never depend on delivery. Each shard holds 1/N of the map
(HASH: 16 bytes an id seen; NUMBERED: 24 bytes an id stored); the numbering step holds only a
window's new hashes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from kvtrace.transforms.ids.dense_ids import (
    FIRST,
    NUMBERED,
    KindIds,
    earliest,
    narrowed,
    number,
    shard_of,
    split_by,
    sum_unique,
    unique_totals,
)

HASH = np.dtype([("hi", "<u8"), ("lo", "<u8")])
# A stream's shard keys unless --id-shards says: the cheapest count in one process
# (benchmarks/bench_id_shards.py); a runner spreads more over more workers.
DEFAULT_ID_SHARDS = 4


class Shard(NamedTuple):
    """One hash shard's part of the map (a key's state in the stream)."""

    seen: np.ndarray  # HASH, sorted: every hash of the shard passed on to numbering
    ids: np.ndarray  # NUMBERED, sorted by hash: the ids numbered for them so far


def empty_shard() -> Shard:
    return Shard(np.empty(0, HASH), np.empty(0, NUMBERED))


def by_hash(table: np.ndarray) -> np.ndarray:
    return table[np.lexsort((table["lo"], table["hi"]))]


def positions(table: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Where each query's hash sorts among table's (sorted by hash): the first row not below it.
    A binary search, not dense_ids.lookup's sort-merge: a shard's store is kept sorted, so a
    window costs its own hashes' searches, never a sort of the store."""
    left = np.searchsorted(table["hi"], queries["hi"], "left")
    right = np.searchsorted(table["hi"], queries["hi"], "right")
    at = left.copy()
    one = right - left == 1
    at[one] += table["lo"][left[one]] < queries["lo"][one]
    for k in np.flatnonzero(right - left > 1):  # hashes sharing their high half: 2^-64 a pair
        at[k] += np.searchsorted(table["lo"][left[k] : right[k]], queries["lo"][k])
    return at


def found(table: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Each query's row of table (sorted by hash, distinct), or -1."""
    at = positions(table, queries)
    rows = np.full(len(queries), -1, np.int64)
    inside = at < len(table)
    hit = (table["hi"][at[inside]] == queries["hi"][inside]) & (
        table["lo"][at[inside]] == queries["lo"][inside]
    )
    rows[np.flatnonzero(inside)[hit]] = at[inside][hit]
    return rows


def merged(table: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """table (sorted by hash) with rows of hashes it lacks, still sorted: a seen set with a
    window's new hashes, a store with their ids."""
    rows = by_hash(rows)
    return np.insert(table, positions(table, rows), rows)


def shard_parts(table: np.ndarray, shards: int) -> list[np.ndarray]:
    """Every shard's rows of table, an empty part for a shard with none: each shard answers
    every window, so whoever waits for all shards knows when it has them."""
    parts = [table[:0]] * shards
    for shard, part in split_by(table, shard_of(table, shards)):
        parts[shard] = part
    return parts


def new_in_shard(seen: np.ndarray, firsts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the first occurrences, FIRST, whose hash the shard has never seen; the seen set with
    them). The first occurrences are one window's of the shard (earliest: one row a hash)."""
    new = narrowed(firsts[found(seen, firsts) < 0], FIRST)
    return new, merged(seen, narrowed(new, HASH))


def ids_of(ids: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The id of each key from a shard's store; every key must have one."""
    rows = found(ids, keys)
    if (rows < 0).any():
        raise AssertionError("a hash reached its shard's store without an id")
    return ids["id"][rows]


class Query(NamedTuple):
    """A window's occurrences of one shard, sent to its store: where they sit among the
    window's keys, and their hashes (HASH)."""

    rows: np.ndarray
    hashes: np.ndarray


def window_parts(keys: np.ndarray, shards: int) -> tuple[list[np.ndarray], list[Query]]:
    """A window's keys (OCCURRENCE) as its shards receive them: each shard's first occurrences
    (its seen set's input) and each shard's query (its store's), one of each for every shard,
    empty for a shard with none, so every step knows when it has all of a window."""
    labels = shard_of(keys, shards)
    rows = [np.flatnonzero(labels == shard) for shard in range(shards)]
    firsts = [earliest(keys[part]) for part in rows]
    return firsts, [Query(part, narrowed(keys[part], HASH)) for part in rows]


def placed(length: int, answers: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """A window's ids in the order of its keys, from every shard's (rows, ids)."""
    ids = np.full(length, -1, np.int64)
    for rows, part in answers:
        ids[rows] = part
    if (ids < 0).any():
        raise AssertionError("a key of the window came back from no shard")
    return ids


def number_window(
    keys: np.ndarray, shards: Sequence[Shard], next_id: int
) -> tuple[KindIds, list[Shard]]:
    """A window's keys (OCCURRENCE) numbered through the shards, in one process: each key's id,
    as dense_ids gives it against the union of the shards' stores, and the shards after the
    window. The steps a stream spreads over its shard keys, in their order."""
    count = len(shards)
    firsts, queries = window_parts(keys, count)
    judged = [new_in_shard(shard.seen, part) for shard, part in zip(shards, firsts)]
    new = number(np.concatenate([fresh for fresh, _ in judged]), next_id)
    fed = [
        Shard(seen, merged(shard.ids, numbered))
        for shard, (_, seen), numbered in zip(shards, judged, shard_parts(new, count))
    ]
    ids = placed(
        len(keys),
        [(query.rows, ids_of(shard.ids, query.hashes)) for shard, query in zip(fed, queries)],
    )
    unique = sum_unique(unique_totals(part) for part in firsts)
    return KindIds(ids, unique, new, len(new)), fed


class InOrder(NamedTuple):
    """A keyed step's windows in waiting (its state): it takes window `next` once `needed`
    items of it have come in, then the next window, whatever order they come in."""

    next: int
    waiting: dict[int, list]


def in_order(
    state: InOrder, window: int, item: object, needed: int
) -> tuple[InOrder, list[tuple[int, list]]]:
    """The state with an item of a window; the windows now complete, in order, with their
    items in the order they came (a seen set takes 1 a window, the numbering step one from
    each shard, a store the window's ids and its queries)."""
    if window < state.next:
        raise AssertionError(f"window {window} came in again after it was taken")
    waiting = dict(state.waiting)
    waiting[window] = [*waiting.get(window, []), item]
    taken, next_window = [], state.next
    while len(waiting.get(next_window, [])) >= needed:
        taken.append((next_window, waiting.pop(next_window)))
        next_window += 1
    return InOrder(next_window, waiting), taken
