"""Map 16-byte keyed hashes to dense integer ids, numbered in first-seen order.

First-seen order is (timestamp, request fingerprint, position), then the hash itself, so the ids
do not depend on file split, record order, worker count or salt. Nothing here holds every hash
in one place:

1. each batch of requests becomes a table of occurrences, split by hash shard;
2. CombinePerKey keeps each hash's earliest occurrence, per shard;
3. the earliest occurrences are cut into time buckets; a side input of bucket sizes gives each
   bucket its first id; a stateful DoFn keyed by bucket sorts its bucket and numbers it;
4. the numbered hashes join the requests' lookups per shard (CoGroupByKey), and the ids go back
   to the request batch they came from.

Work is vectorised over numpy tables: one Beam element per batch and shard, never per block.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.coders import PickleCoder, VarIntCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.transforms.window import GlobalWindow

from kvtrace.transforms.buckets import buckets_of, first_offsets
from kvtrace.transforms.hashed_batch import HashedBatch

# Hash shards for the earliest-occurrence combine and the join: each shard holds 1/N of the
# unique hashes, so N = 64 keeps a shard of a 1e9-block export near 15M rows (~600 MB).
DEFAULT_HASH_SHARDS = 64
# Keep merging cheap: re-sort the combined table only once the unsorted part outgrows it.
_MIN_COMPACT_ROWS = 65_536

OCCURRENCE = np.dtype(
    [("hi", "<u8"), ("lo", "<u8"), ("ts", "<i8"), ("fp", "<u8"), ("pos", "<u4"),
     ("weight", "<u4"), ("req", "<u4")]
)
NUMBERED = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("id", "<i8")])
RESOLVED = np.dtype([("req", "<u4"), ("pos", "<u4"), ("id", "<i8")])

# What gets numbered in a batch (block hashes, or session keys), as an OCCURRENCE table.
KeyExtractor = Callable[[HashedBatch], np.ndarray]


class UniqueTotals(NamedTuple):
    """How many distinct hashes there are, and the summed weight of their first occurrences."""

    count: int
    weight: int


def block_keys(batch: HashedBatch, block_size: int) -> np.ndarray:
    """Every block of the batch, weighted by its real token count (the partial last block less)."""
    requests = batch.requests
    counts = requests["num_blocks"]
    table = np.empty(len(batch.block_hashes), dtype=OCCURRENCE)
    table["hi"], table["lo"] = batch.block_hashes[:, 0], batch.block_hashes[:, 1]
    table["ts"] = np.repeat(requests["timestamp_ms"], counts)
    table["fp"] = np.repeat(requests["fingerprint"], counts)
    table["pos"] = batch.block_positions()
    table["req"] = np.repeat(np.arange(len(requests)), counts)
    table["weight"] = block_size
    has_blocks = counts > 0
    last = np.cumsum(counts)[has_blocks] - 1
    lengths = requests["input_length"][has_blocks]
    table["weight"][last] = lengths - (counts[has_blocks] - 1) * block_size
    return table


def session_keys(batch: HashedBatch) -> np.ndarray:
    """The session key of every request that has one."""
    index = np.flatnonzero(batch.requests["has_session"])
    requests = batch.requests[index]
    table = np.empty(len(index), dtype=OCCURRENCE)
    table["hi"], table["lo"] = requests["session_hi"], requests["session_lo"]
    table["ts"], table["fp"] = requests["timestamp_ms"], requests["fingerprint"]
    table["pos"], table["weight"], table["req"] = 0, 1, index
    return table


def earliest(table: np.ndarray) -> np.ndarray:
    """Each distinct key once, at its earliest (ts, fp, pos) occurrence."""
    order = np.lexsort((table["pos"], table["fp"], table["ts"], table["lo"], table["hi"]))
    ordered = table[order]
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = (ordered["hi"][1:] != ordered["hi"][:-1]) | (ordered["lo"][1:] != ordered["lo"][:-1])
    return ordered[first]


def number(table: np.ndarray, first_id: int) -> np.ndarray:
    """Dense ids from first_id for distinct keys, in first-seen order (the hash breaks ties)."""
    order = np.lexsort((table["lo"], table["hi"], table["pos"], table["fp"], table["ts"]))
    numbered = np.empty(len(table), dtype=NUMBERED)
    numbered["hi"], numbered["lo"] = table["hi"][order], table["lo"][order]
    numbered["id"] = first_id + np.arange(len(table))
    return numbered


def resolve(numbered: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """The id of every query's key (a sort-merge join); every key must have been numbered."""
    keys_hi = np.concatenate([numbered["hi"], queries["hi"]])
    keys_lo = np.concatenate([numbered["lo"], queries["lo"]])
    is_query = np.repeat([False, True], [len(numbered), len(queries)])
    order = np.lexsort((is_query, keys_lo, keys_hi))
    # Within equal keys the numbered row sorts first; carry its sorted position forward.
    at_query = is_query[order]
    last_numbered = np.maximum.accumulate(np.where(at_query, -1, np.arange(len(order))))
    carried = last_numbered[at_query]
    if (carried < 0).any():
        raise AssertionError("a hash reached the join without an id")
    source = order[carried]
    query_index = order[at_query] - len(numbered)
    if (
        (numbered["hi"][source] != queries["hi"][query_index])
        | (numbered["lo"][source] != queries["lo"][query_index])
    ).any():
        raise AssertionError("a hash reached the join without an id")
    ids = np.empty(len(queries), dtype="<i8")
    ids[query_index] = numbered["id"][source]
    return ids


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


class EarliestOccurrence(beam.CombineFn):
    """Per shard: each hash at its earliest occurrence. Accumulator: [sorted base, *pending]."""

    def create_accumulator(self) -> list[np.ndarray]:
        return [np.empty(0, dtype=OCCURRENCE)]

    def add_input(self, acc: list[np.ndarray], table: np.ndarray) -> list[np.ndarray]:
        acc.append(table)
        return self._compact_if_large(acc)

    def merge_accumulators(self, accs: Iterable[list[np.ndarray]]) -> list[np.ndarray]:
        merged = [np.empty(0, dtype=OCCURRENCE)]
        for acc in accs:
            merged.extend(acc)
        return self._compact_if_large(merged)

    def extract_output(self, acc: list[np.ndarray]) -> np.ndarray:
        return earliest(np.concatenate(acc))

    @staticmethod
    def _compact_if_large(acc: list[np.ndarray]) -> list[np.ndarray]:
        pending = sum(len(t) for t in acc[1:])
        if pending < max(len(acc[0]), _MIN_COMPACT_ROWS):
            return acc
        return [earliest(np.concatenate(acc))]


class NumberBucket(beam.DoFn):
    """Keyed by time bucket: gathers the bucket's earliest occurrences, then numbers them.

    The bucket's first id comes from the side input; the timer fires once every element of the
    bucket has arrived (end of the global window in a batch job).
    """

    TABLES = BagStateSpec("tables", PickleCoder())
    FIRST_ID = ReadModifyWriteStateSpec("first_id", VarIntCoder())
    FLUSH = TimerSpec("flush", TimeDomain.WATERMARK)

    def process(
        self,
        element: tuple[int, np.ndarray],
        first_ids: dict[int, int],
        tables=beam.DoFn.StateParam(TABLES),
        first_id=beam.DoFn.StateParam(FIRST_ID),
        flush=beam.DoFn.TimerParam(FLUSH),
    ) -> None:
        bucket, table = element
        tables.add(table)
        first_id.write(first_ids[bucket])
        flush.set(GlobalWindow().max_timestamp())

    @on_timer(FLUSH)
    def on_flush(
        self, tables=beam.DoFn.StateParam(TABLES), first_id=beam.DoFn.StateParam(FIRST_ID)
    ) -> Iterator[np.ndarray]:
        yield number(np.concatenate(list(tables.read())), first_id.read())
        tables.clear()
        first_id.clear()


class ResolveShard(beam.DoFn):
    """Per hash shard: join the numbered hashes with the lookups of every request batch, in one
    sort-merge (per batch it would re-sort the shard's whole table each time)."""

    def process(self, element: tuple[int, dict[str, list]]) -> Iterator[tuple[int, np.ndarray]]:
        _, groups = element
        if not groups["lookups"]:
            return
        batch_ids = np.concatenate(
            [np.full(len(part), batch_id, dtype="<u8") for batch_id, part in groups["lookups"]]
        )
        lookups = np.concatenate([part for _, part in groups["lookups"]])
        resolved = np.empty(len(lookups), dtype=RESOLVED)
        resolved["req"], resolved["pos"] = lookups["req"], lookups["pos"]
        resolved["id"] = resolve(np.concatenate(groups["numbered"]), lookups)
        yield from split_by(resolved, batch_ids)


def new_batch_id() -> int:
    """Names a batch only inside one run, to route its ids back to it; never published."""
    return int.from_bytes(os.urandom(8), "little")


class AssignDenseIds(beam.PTransform):
    """(batch id, HashedBatch) in; out a dict: "ids", (batch id, RESOLVED table) pairs, and
    "unique", one UniqueTotals.

    keys picks what gets numbered (block hashes, or session keys): the transform is the same.
    """

    def __init__(self, keys: KeyExtractor, shards: int = DEFAULT_HASH_SHARDS):
        super().__init__()
        self._keys = keys
        self._shards = shards

    def expand(self, batches: beam.PCollection) -> dict[str, beam.PCollection]:
        keys, shards = self._keys, self._shards

        def tables(batch: tuple[int, HashedBatch]) -> Iterator[tuple[str, Any]]:
            batch_id, hashed = batch
            table = keys(hashed)
            for shard, part in split_by(table, shard_of(table, shards)):
                yield beam.pvalue.TaggedOutput("occurrences", (shard, part))
                yield beam.pvalue.TaggedOutput("lookups", (shard, (batch_id, part)))

        split = batches | "SplitByShard" >> beam.FlatMap(tables).with_outputs(
            "occurrences", "lookups"
        )
        firsts = split.occurrences | "EarliestPerShard" >> beam.CombinePerKey(EarliestOccurrence())
        by_bucket = firsts | "ByBucket" >> beam.FlatMap(
            lambda kv: split_by(kv[1], buckets_of(kv[1]["ts"]))
        )
        first_ids = (
            by_bucket
            | "BucketSizes" >> beam.Map(lambda kv: (kv[0], len(kv[1])))
            | "SumPerBucket" >> beam.CombinePerKey(sum)
            | "AllSizes" >> beam.combiners.ToDict()
            | "FirstIds" >> beam.Map(first_offsets)
        )
        numbered = (
            by_bucket
            | "NumberBuckets" >> beam.ParDo(NumberBucket(), beam.pvalue.AsSingleton(first_ids))
            | "NumberedByShard" >> beam.FlatMap(lambda t: split_by(t, shard_of(t, shards)))
        )
        unique = (
            firsts
            | "UniqueTotals" >> beam.Map(lambda kv: UniqueTotals(len(kv[1]), int(kv[1]["weight"].sum())))
            | "SumUnique" >> beam.CombineGlobally(_sum_totals)
        )
        ids = (
            {"numbered": numbered, "lookups": split.lookups}
            | "JoinPerShard" >> beam.CoGroupByKey()
            | "Resolve" >> beam.ParDo(ResolveShard())
        )
        return {"ids": ids, "unique": unique}


def _sum_totals(totals: Iterable[UniqueTotals]) -> UniqueTotals:
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
