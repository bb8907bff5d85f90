"""Each row's parent (--emit-parents): the row number, in the trace's published order, of the
latest earlier request whose links name the one this request continues (read/links.py), so that
a row's parent always precedes it; NO_PARENT where no earlier row of the night is named (the
parent was in another night, was refused, or the logs linked nothing). Pure numpy over the
whole night's rows: one sort of the links, no Python object per row."""

from __future__ import annotations

import numpy as np

from kvtrace.transforms.encode.hashed_batch import NO_LINK
from kvtrace.transforms.trace_format import NO_PARENT
from kvtrace.transforms.write.rows import RowBatch


def with_parents(rows: RowBatch, requests: np.ndarray, links: np.ndarray) -> RowBatch:
    """rows (one per request, in request order: rows.row_batch) with their parent set, given
    the requests' REQUEST columns (parent_key, num_links) and their link keys in request order."""
    rank = np.empty(len(rows.rows), dtype=np.int64)
    rank[rows.order()] = np.arange(len(rank))
    rows.rows["parent"] = parent_ranks(
        rank, requests["parent_key"], np.repeat(rank, requests["num_links"]), links
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
    ranks = np.concatenate([named_rank, rank[child]])
    is_child = np.concatenate([np.zeros(len(named_key), bool), np.ones(len(child), bool)])
    order = np.lexsort((~is_child, ranks, keys))
    keys, ranks, is_child = keys[order], ranks[order], is_child[order]
    group = np.cumsum(np.concatenate([[0], keys[1:] != keys[:-1]])) if len(keys) else keys
    span = len(rank) + 1
    base = group.astype(np.int64) * span
    latest = np.maximum.accumulate(np.where(is_child, base, base + ranks + 1)) - base - 1
    parents = np.full(len(rank), NO_PARENT, dtype=np.int64)
    found = np.empty(len(keys), dtype=np.int64)
    found[order] = latest
    parents[child] = found[len(named_key) :]
    return parents
