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
from collections.abc import Callable, Iterable, Iterator, Sequence
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

from kvtrace.transforms.blocks import DIGEST_SIZE, last_block_tokens
from kvtrace.transforms.buckets import buckets_of, first_offsets
from kvtrace.transforms.encode import HashedRequest

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

KeyExtractor = Callable[[HashedRequest], "tuple[bytes, np.ndarray]"]


class UniqueTotals(NamedTuple):
    """How many distinct hashes there are, and the summed weight of their first occurrences."""

    count: int
    weight: int


def block_keys(request: HashedRequest, block_size: int) -> tuple[bytes, np.ndarray]:
    """A request's block hashes, each weighted by its real token count (partial last block)."""
    n = len(request.block_hashes) // DIGEST_SIZE
    weights = np.full(n, block_size, dtype="<u4")
    if n:
        weights[-1] = last_block_tokens(request.input_length, block_size)
    return request.block_hashes, weights


def session_keys(request: HashedRequest) -> tuple[bytes, np.ndarray]:
    if request.session_key is None:
        return b"", np.zeros(0, dtype="<u4")
    return request.session_key, np.ones(1, dtype="<u4")


def occurrence_table(requests: Sequence[HashedRequest], keys: KeyExtractor) -> np.ndarray:
    """One row per key occurrence: the key, where it was seen, and which request of the batch."""
    parts = []
    for index, request in enumerate(requests):
        blob, weights = keys(request)
        if not blob:
            continue
        digests = np.frombuffer(blob, dtype="<u8").reshape(-1, 2)
        part = np.empty(len(digests), dtype=OCCURRENCE)
        part["hi"], part["lo"] = digests[:, 0], digests[:, 1]
        part["ts"], part["fp"] = request.timestamp_ms, request.fingerprint
        part["pos"] = np.arange(len(digests))
        part["weight"], part["req"] = weights, index
        parts.append(part)
    return np.concatenate(parts) if parts else np.empty(0, dtype=OCCURRENCE)


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
            yield int(labels_part[0]), part


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
    """Per hash shard: join the numbered hashes with the lookups of every request batch."""

    def process(self, element: tuple[int, dict[str, list]]) -> Iterator[tuple[int, np.ndarray]]:
        _, groups = element
        if not groups["lookups"]:
            return
        numbered = np.concatenate(groups["numbered"])
        for batch_id, lookups in groups["lookups"]:
            resolved = np.empty(len(lookups), dtype=RESOLVED)
            resolved["req"], resolved["pos"] = lookups["req"], lookups["pos"]
            resolved["id"] = resolve(numbered, lookups)
            yield batch_id, resolved


def new_batch_id() -> int:
    """Names a batch only inside one run, to route its ids back to it; never published."""
    return int.from_bytes(os.urandom(8), "little")


class AssignDenseIds(beam.PTransform):
    """(batch id, [HashedRequest]) in; out a dict: "ids", (batch id, RESOLVED table) pairs, and
    "unique", one UniqueTotals.

    keys picks what gets numbered (block hashes, or session keys): the transform is the same.
    """

    def __init__(self, keys: KeyExtractor, shards: int = DEFAULT_HASH_SHARDS):
        super().__init__()
        self._keys = keys
        self._shards = shards

    def expand(self, batches: beam.PCollection) -> dict[str, beam.PCollection]:
        keys, shards = self._keys, self._shards

        def tables(batch: tuple[int, list[HashedRequest]]) -> Iterator[tuple[str, Any]]:
            batch_id, requests = batch
            table = occurrence_table(requests, keys)
            for shard, part in split_by(table, shard_of(table, shards)):
                yield beam.pvalue.TaggedOutput("occurrences", (shard, earliest(part)))
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


def ids_per_request(resolved: Iterable[np.ndarray], sizes: Sequence[int]) -> list[np.ndarray]:
    """Split a batch's resolved ids into each request's ids, in block order."""
    parts = list(resolved)
    table = np.concatenate(parts) if parts else np.empty(0, dtype=RESOLVED)
    table = table[np.lexsort((table["pos"], table["req"]))]
    counts = np.bincount(table["req"], minlength=len(sizes))
    if counts.tolist() != list(sizes):
        raise AssertionError("a request lost or gained ids on the way back from the join")
    return np.split(table["id"], np.cumsum(counts)[:-1])
