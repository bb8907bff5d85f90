"""Map 16-byte keyed hashes to dense integer ids, numbered in first-seen order: the pure part.

First-seen order is the order rows are published in (row_order.py: published timestamp, the
row's tie key, request fingerprint), then position, then the hash itself, so the ids do not
depend on file split, record order, worker count or salt. Work is vectorised over numpy
tables of occurrences; ids/steps.py spreads it over Beam workers, pipelines/anonymize_local.py
runs it in one process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import numpy as np

from kvtrace.transforms.encode.hashed_batch import HashedBatch
from kvtrace.transforms.ids.row_order import tie_key

# Hash shards for the earliest-occurrence combine and the join: each shard holds 1/N of the
# unique hashes, so N = 64 keeps a shard of a 1e9-block export near 15M rows (~600 MB).
DEFAULT_HASH_SHARDS = 64
# With an id map, a shard's map rows meet tonight's in one worker: 256 MiB of map rows per shard
# (~11M ids) keeps that far below a worker's memory whatever the map's size (1e10 ids: 895).
TARGET_SHARD_BYTES = 256 << 20
MAX_HASH_SHARDS = 4096

OCCURRENCE = np.dtype(
    [
        ("hi", "<u8"),
        ("lo", "<u8"),
        ("ts", "<i8"),
        ("key", "<u8"),
        ("fp", "<u8"),
        ("pos", "<u4"),
        ("weight", "<u4"),
        ("req", "<u4"),
    ]
)
NUMBERED = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("id", "<i8")])
# What numbering needs of a first occurrence (44 bytes of the occurrence's 52).
FIRST = np.dtype(
    [("hi", "<u8"), ("lo", "<u8"), ("ts", "<i8"), ("key", "<u8"), ("fp", "<u8"), ("pos", "<u4")]
)
# What a batch sends to the join to get its ids back: the key and where it goes (24 bytes; the
# whole occurrence is 52).
LOOKUP = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("req", "<u4"), ("pos", "<u4")])
RESOLVED = np.dtype([("req", "<u4"), ("pos", "<u4"), ("id", "<i8")])

# What gets numbered in a batch (block hashes, or session keys), as an OCCURRENCE table.
KeyExtractor = Callable[[HashedBatch], np.ndarray]


class UniqueTotals(NamedTuple):
    """How many distinct hashes there are, and the summed weight of their first occurrences."""

    count: int
    weight: int


def block_keys(batch: HashedBatch, block_size: int) -> np.ndarray:
    """Every block of the batch, weighted by its real token count (the partial last block
    less). Output blocks (--emit-output-hashes) are seen at their own request's time, after its
    prompt blocks (their positions follow), so a request's ids depend on the requests before it
    and never on those after: a night or a window numbers them as one run over all does. They
    weigh 0: earliest() keeps a key's largest weight, so a key any prompt has counts its prompt
    tokens in the unique totals wherever it is first seen, and a key only outputs have none."""
    requests = batch.requests
    counts = batch.blocks_per_request()
    table = np.empty(len(batch.block_hashes), dtype=OCCURRENCE)
    table["hi"], table["lo"] = batch.block_hashes[:, 0], batch.block_hashes[:, 1]
    table["ts"] = np.repeat(requests["timestamp_ms"], counts)
    table["key"] = np.repeat(tie_key(requests["input_length"], requests["output_length"]), counts)
    table["fp"] = np.repeat(requests["fingerprint"], counts)
    table["pos"] = batch.block_positions()
    table["req"] = np.repeat(np.arange(len(requests)), counts)
    prompt = requests["num_blocks"]
    is_output = table["pos"] >= np.repeat(prompt, counts)
    table["weight"] = np.where(is_output, 0, block_size)
    has_blocks = prompt > 0
    last = (np.cumsum(counts) - counts)[has_blocks] + prompt[has_blocks] - 1
    lengths = requests["input_length"][has_blocks]
    table["weight"][last] = lengths - (prompt[has_blocks] - 1) * block_size
    return table


def session_keys(batch: HashedBatch) -> np.ndarray:
    """The session key of every request that has one."""
    index = np.flatnonzero(batch.requests["has_session"])
    requests = batch.requests[index]
    table = np.empty(len(index), dtype=OCCURRENCE)
    table["hi"], table["lo"] = requests["session_hi"], requests["session_lo"]
    table["ts"], table["fp"] = requests["timestamp_ms"], requests["fingerprint"]
    table["key"] = tie_key(requests["input_length"], requests["output_length"])
    table["pos"], table["weight"], table["req"] = 0, 1, index
    return table


def earliest(table: np.ndarray) -> np.ndarray:
    """Each distinct key once, at its earliest (ts, key, fp, pos) occurrence, weighing the
    largest weight of its occurrences (a prompt's tokens, where an output saw it first). Both
    are kept whatever the tables are cut into, so a combine may call it on its parts."""
    order = np.lexsort(
        (table["pos"], table["fp"], table["key"], table["ts"], table["lo"], table["hi"])
    )
    ordered = table[order]
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = (ordered["hi"][1:] != ordered["hi"][:-1]) | (
        ordered["lo"][1:] != ordered["lo"][:-1]
    )
    firsts = ordered[first]
    if len(firsts):
        firsts["weight"] = np.maximum.reduceat(ordered["weight"], np.flatnonzero(first))
    return firsts


def number(table: np.ndarray, first_id: int) -> np.ndarray:
    """Dense ids from first_id for distinct keys, in first-seen order: the rows' order
    (RowBatch.sorted) as far as their ids differ, since requests of one fingerprint hold the same
    keys (encode_requests.hash_request); the hash breaks only that fingerprint's 2^-64 ties."""
    order = np.lexsort(
        (table["lo"], table["hi"], table["pos"], table["fp"], table["key"], table["ts"])
    )
    numbered = np.empty(len(table), dtype=NUMBERED)
    numbered["hi"], numbered["lo"] = table["hi"][order], table["lo"][order]
    numbered["id"] = first_id + np.arange(len(table))
    return numbered


def lookup(numbered: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For every query, the row of numbered holding its key, or -1 (a sort-merge join); the
    keys of numbered must be distinct."""
    keys_hi = np.concatenate([numbered["hi"], queries["hi"]])
    keys_lo = np.concatenate([numbered["lo"], queries["lo"]])
    is_query = np.repeat([False, True], [len(numbered), len(queries)])
    order = np.lexsort((is_query, keys_lo, keys_hi))
    # Within equal keys the numbered row sorts first; carry its sorted position forward.
    at_query = is_query[order]
    last_numbered = np.maximum.accumulate(np.where(at_query, -1, np.arange(len(order))))
    carried = last_numbered[at_query]
    source = np.where(carried < 0, -1, order[np.maximum(carried, 0)])
    query_index = order[at_query] - len(numbered)
    found = source >= 0
    found[found] = (numbered["hi"][source[found]] == queries["hi"][query_index[found]]) & (
        numbered["lo"][source[found]] == queries["lo"][query_index[found]]
    )
    rows = np.full(len(queries), -1, dtype=np.int64)
    rows[query_index[found]] = source[found]
    return rows


def resolve(numbered: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """The id of every query's key; every key must have been numbered."""
    rows = lookup(numbered, queries)
    if (rows < 0).any():
        raise AssertionError("a hash reached the join without an id")
    return numbered["id"][rows]


def split_known(firsts: np.ndarray, existing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the first occurrences an id map does not hold, the map rows of those it does)."""
    rows = lookup(existing, firsts)
    seen = rows >= 0
    return firsts[~seen], existing[rows[seen]]


class KindIds(NamedTuple):
    """Dense ids of one kind of key (blocks or sessions) for a run."""

    ids: np.ndarray  # each key's id, aligned with the keys
    unique: UniqueTotals
    added: np.ndarray  # NUMBERED rows for the map: the new ids (all ids when compacting)
    added_count: int


def dense_ids(
    keys: np.ndarray, map_rows: Callable[[np.ndarray], np.ndarray] | None = None, next_id: int = 0
) -> KindIds:
    """Each key's id in first-seen order, in one process (the local engine): the same numbering
    as ids/steps.py's buckets, whose order is by timestamp first. Keys an id map already holds keep their ids (map_rows
    gives, for the distinct keys, NUMBERED map rows that include every one it holds); the
    others are numbered from next_id."""
    firsts = earliest(keys)
    unique = unique_totals(firsts)
    unseen, known = split_known(firsts, map_rows(firsts) if map_rows else np.empty(0, NUMBERED))
    new = number(unseen, next_id)
    ids = resolve(np.concatenate([new, known]), keys)
    return KindIds(ids, unique, new, len(new))


def hash_shards_for(map_ids: int) -> int:
    """Hash shards for a run extending a map of map_ids ids."""
    needed = -(-map_ids * NUMBERED.itemsize // TARGET_SHARD_BYTES)
    return min(MAX_HASH_SHARDS, max(DEFAULT_HASH_SHARDS, needed))


def narrowed(occurrences: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The occurrences with only dtype's fields, packed (LOOKUP or FIRST): fewer bytes to ship."""
    out = np.empty(len(occurrences), dtype=dtype)
    for name in dtype.names:
        out[name] = occurrences[name]
    return out


def shard_of(table: np.ndarray, shards: int) -> np.ndarray:
    return (table["lo"] % shards).astype(np.int64)


def split_by(table: np.ndarray, labels: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(label, rows with that label) for each label present, in label order."""
    order = np.argsort(labels, kind="stable")
    ordered, sorted_labels = table[order], labels[order]
    cuts = np.flatnonzero(sorted_labels[1:] != sorted_labels[:-1]) + 1
    for part, labels_part in zip(np.split(ordered, cuts), np.split(sorted_labels, cuts)):
        if len(part):
            yield labels_part[0].item(), part


def new_batch_id() -> int:
    """Names a batch only inside one run, to route its ids back to it; never published."""
    return int.from_bytes(os.urandom(8), "little")


def unique_totals(firsts: np.ndarray) -> UniqueTotals:
    """Of earliest occurrences: the keys a request's prompt has (weight > 0: output blocks weigh
    0, and earliest() keeps a key's largest weight, see block_keys), and their tokens."""
    return UniqueTotals(int(np.count_nonzero(firsts["weight"])), int(firsts["weight"].sum()))


def sum_unique(totals: Iterable[UniqueTotals]) -> UniqueTotals:
    count = weight = 0
    for total in totals:
        count += total.count
        weight += total.weight
    return UniqueTotals(count, weight)


def ids_in_request_order(resolved: Iterable[np.ndarray], counts: np.ndarray) -> np.ndarray:
    """A batch's resolved ids, concatenated by request and then position; counts[i] ids are
    expected for request i. A scatter by (request, position), so no sort is needed."""
    parts = list(resolved)
    table = np.concatenate(parts) if parts else np.empty(0, dtype=RESOLVED)
    if not np.array_equal(np.bincount(table["req"], minlength=len(counts)), counts):
        raise AssertionError("a request lost or gained ids on the way back from the join")
    starts = np.cumsum(counts) - counts
    ids = np.full(len(table), -1, dtype=np.int64)
    ids[starts[table["req"]] + table["pos"]] = table["id"]
    if (ids < 0).any():  # a position came twice, so another never came
        raise AssertionError("a request's ids came back with a position missing")
    return ids
