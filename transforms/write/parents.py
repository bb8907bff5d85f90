"""Each row's parent (--emit-parents): the row number, in the trace's published order, of the
latest earlier request whose links name the one this request continues (read/links.py), so that
a row's parent always precedes it; NO_PARENT where no earlier row of the night is named (the
parent was in another night, was refused, or the logs linked nothing). Pure numpy: one sort of
the links, no Python object per row.

The local engine numbers a night's rows whole (with_parents). The Beam engine sorts each output
shard, ranks its rows from the shards' row counts (shard_offsets), sends each link to its key
(link_occurrences), resolves each key's children there (resolve_key: the same parent_ranks) and
sets them on their shards (set_parents)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from kvtrace.transforms.encode.hashed_batch import NO_LINK
from kvtrace.transforms.trace_format import NO_PARENT
from kvtrace.transforms.write.rows import RowBatch

# What link_occurrences sends to a key: a row it names (its rank), or a row that continues it
# (its shard, its place in the sorted shard, its rank).
NAMES, CONTINUES = "names", "continues"


def with_parents(rows: RowBatch) -> RowBatch:
    """rows (a night's, whole) with their parent set: ranks are places in published order."""
    rank = np.empty(len(rows.rows), dtype=np.int64)
    rank[rows.order()] = np.arange(len(rank))
    rows.rows["parent"] = 1 + parent_ranks(  # ROW holds parent + 1: 0 is none
        rank, rows.rows["parent_key"], np.repeat(rank, rows.rows["num_links"]), rows.links
    )
    return rows


def parent_ranks(
    rank: np.ndarray, parent_key: np.ndarray, named_rank: np.ndarray, named_key: np.ndarray
) -> np.ndarray:
    """For each row (its published rank, the key it continues or NO_LINK), the greatest rank
    below its own among the rows named by that key (named_rank[i] is named by named_key[i]);
    NO_PARENT where none.

    One sort of names and children together by (key, rank), a child before a name of its own
    rank (a row never continues itself); then the latest name so far within each key, by a
    running maximum of rank + 1 offset per key so that no key sees another's."""
    child = np.flatnonzero(parent_key != NO_LINK)
    keys = np.concatenate([named_key, parent_key[child]]).astype(np.uint64)
    ranks = np.concatenate([named_rank, rank[child]]).astype(np.int64)
    is_child = np.concatenate([np.zeros(len(named_key), bool), np.ones(len(child), bool)])
    order = np.lexsort((~is_child, ranks, keys))
    keys, ranks, is_child = keys[order], ranks[order], is_child[order]
    group = np.cumsum(np.concatenate([[0], keys[1:] != keys[:-1]])) if len(keys) else keys
    span = int(max(rank.max(initial=-1), ranks.max(initial=-1))) + 2
    base = group.astype(np.int64) * span
    latest = np.maximum.accumulate(np.where(is_child, base, base + ranks + 1)) - base - 1
    parents = np.full(len(rank), NO_PARENT, dtype=np.int64)
    found = np.empty(len(keys), dtype=np.int64)
    found[order] = latest
    parents[child] = found[len(named_key) :]
    return parents


def shard_offsets(counts: Mapping[int, int], shard: int) -> int:
    """The rank of a shard's first row: the rows of the shards before it."""
    return sum(n for s, n in counts.items() if s < shard)


def link_occurrences(
    shard: int, rows: RowBatch, counts: Mapping[int, int]
) -> Iterator[tuple[int, tuple]]:
    """(key, occurrence) for each link of a sorted shard's rows: each row named by a key, and
    each row continuing one."""
    rank = shard_offsets(counts, shard) + np.arange(len(rows.rows))
    for key, named in zip(rows.links.tolist(), np.repeat(rank, rows.rows["num_links"]).tolist()):
        yield key, (NAMES, named)
    child = np.flatnonzero(rows.rows["parent_key"] != NO_LINK)
    for index, key in zip(child.tolist(), rows.rows["parent_key"][child].tolist()):
        yield key, (CONTINUES, (shard, index, int(rank[index])))


def resolve_key(key: int, occurrences: Iterable[tuple]) -> Iterator[tuple[int, tuple[int, int]]]:
    """(shard, (place in it, parent rank)) for each row continuing this key that has a parent."""
    occurrences = list(occurrences)  # a grouped value may be iterable once
    named = [rank for kind, rank in occurrences if kind == NAMES]
    children = [where for kind, where in occurrences if kind == CONTINUES]
    if not named or not children:
        return
    parents = parent_ranks(
        np.array([rank for *_, rank in children], np.int64),
        np.full(len(children), key, np.uint64),
        np.array(named, np.int64),
        np.full(len(named), key, np.uint64),
    )
    for (shard, index, _), parent in zip(children, parents.tolist()):
        if parent != NO_PARENT:
            yield shard, (index, parent)


def set_parents(rows: RowBatch, parents: Iterable[tuple[int, int]]) -> RowBatch:
    """A sorted shard's rows with the parents resolve_key found for them."""
    found = list(parents)
    if found:
        index, parent = np.array(found, np.int64).T
        rows.rows["parent"][index] = parent + 1  # ROW holds parent + 1
    return rows
