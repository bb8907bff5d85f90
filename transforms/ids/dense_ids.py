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

With ids from earlier runs (an id map, see id_map.py), step 2's output first meets the map's rows
per shard: hashes the map knows keep their ids, only the others are numbered, from the map's next
id. The map is read once, streamed per shard; no worker holds all of it.

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
from transforms.ids import bloom
from transforms.ids.buckets import buckets_of, first_offsets
from transforms.encode.hashed_batch import HashedBatch

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


class SplitKnown(beam.DoFn):
    """Per hash shard: tonight's earliest occurrences against the map's rows. Unseen ones go on
    to be numbered; seen ones come out with their old ids ("known"), only those that occur
    tonight, so later steps grow with the night and not with the map."""

    def __init__(self, compact: bool):
        self._compact = compact

    def process(self, element: tuple[int, dict[str, list]]) -> Iterator[Any]:
        shard, groups = element
        existing = (
            np.concatenate(groups["existing"]) if groups["existing"] else np.empty(0, NUMBERED)
        )
        if self._compact and len(existing):
            yield beam.pvalue.TaggedOutput("carried", (shard, existing))
        for firsts in groups["firsts"]:  # at most one: the shard's combined table
            rows = lookup(existing, firsts)
            seen = rows >= 0
            if not seen.all():
                yield shard, firsts[~seen]
            if seen.any():
                yield beam.pvalue.TaggedOutput("known", (shard, existing[rows[seen]]))


class AssignDenseIds(beam.PTransform):
    """(batch id, HashedBatch) in, or {"batches": those, "prior": (shard, NUMBERED) rows that
    earlier runs numbered}; out a dict:
    "ids": (batch id, RESOLVED table) pairs;
    "unique": one UniqueTotals of the distinct keys in the input;
    "added": (shard, NUMBERED) rows to persist: the newly numbered keys (and, when prior.compact,
    every earlier key too), and "added_count", one int: how many keys were new.

    keys picks what gets numbered (block hashes, or session keys): the transform is the same.
    With prior rows, only keys absent from them are numbered, from next_id; compact asks for the
    prior rows to come out in "added" too, so that they can be rewritten together.
    """

    def __init__(
        self, keys: KeyExtractor, shards: int = DEFAULT_HASH_SHARDS, next_id: int = 0,
        compact: bool = False,
    ):
        super().__init__()
        self._keys = keys
        self._shards = shards
        self._next_id = next_id
        self._compact = compact

    def expand(self, inputs: beam.PCollection | dict) -> dict[str, beam.PCollection]:
        batches, prior = (
            (inputs["batches"], inputs.get("prior")) if isinstance(inputs, dict) else (inputs, None)
        )
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
        unique = (
            firsts
            | "UniqueTotals" >> beam.Map(lambda kv: UniqueTotals(len(kv[1]), int(kv[1]["weight"].sum())))
            | "SumUnique" >> beam.CombineGlobally(_sum_totals)
        )
        unseen, known, carried = self._against_prior(firsts, prior, unique)
        # Int keys (split_by yields Python ints): the hint gives NumberBucket, a stateful DoFn,
        # a deterministic key coder, where Beam would otherwise warn and guess.
        by_bucket = unseen | "ByBucket" >> beam.FlatMap(
            lambda kv: split_by(kv[1], buckets_of(kv[1]["ts"]))
        ).with_output_types(tuple[int, Any])
        first_ids = (
            by_bucket
            | "BucketSizes" >> beam.Map(lambda kv: (kv[0], len(kv[1])))
            | "SumPerBucket" >> beam.CombinePerKey(sum)
            | "AllSizes" >> beam.combiners.ToDict()
            | "FirstIds" >> beam.Map(first_offsets, self._next_id)
        )
        numbered = (
            by_bucket
            | "NumberBuckets" >> beam.ParDo(NumberBucket(), beam.pvalue.AsSingleton(first_ids))
            | "NumberedByShard" >> beam.FlatMap(lambda t: split_by(t, shard_of(t, shards)))
        )
        added_count = (
            unseen
            | "CountUnseen" >> beam.Map(lambda kv: len(kv[1]))
            | "SumUnseen" >> beam.CombineGlobally(sum)
        )
        ids = (
            {"numbered": (numbered, known) | "WithKnown" >> beam.Flatten(),
             "lookups": split.lookups}
            | "JoinPerShard" >> beam.CoGroupByKey()
            | "Resolve" >> beam.ParDo(ResolveShard())
        )
        added = (numbered, carried) | "ToPersist" >> beam.Flatten()
        return {"ids": ids, "unique": unique, "added": added, "added_count": added_count}

    def _against_prior(
        self, firsts: beam.PCollection, prior: beam.PCollection | None, unique: beam.PCollection
    ) -> tuple[beam.PCollection, ...]:
        """(unseen, known, carried): see SplitKnown. Without prior rows everything is unseen.

        Unless compacting (which rewrites every prior row), prior rows pass a Bloom filter of
        tonight's keys before the shuffle: the join then grows with the night, not the map."""
        if prior is None:
            nothing = firsts.pipeline | "NoPriorIds" >> beam.Create([])
            return firsts, nothing, nothing
        if not self._compact:
            tonight = (
                firsts
                | "TonightsFilters" >> beam.Map(
                    lambda kv, totals: bloom.build(
                        kv[1]["hi"], kv[1]["lo"], bloom.bloom_bits(totals.count)
                    ),
                    beam.pvalue.AsSingleton(unique),
                )
                | "TonightsFilter" >> beam.CombineGlobally(_union_filters)
            )
            prior = prior | "OnlyTonightsKeys" >> beam.FlatMap(
                _possible_rows, beam.pvalue.AsSingleton(tonight)
            )
        split = (
            {"firsts": firsts, "existing": prior}
            | "MeetPrior" >> beam.CoGroupByKey()
            | "SplitKnown" >> beam.ParDo(SplitKnown(self._compact)).with_outputs(
                "known", "carried", main="unseen"
            )
        )
        return split.unseen, split.known, split.carried


def _union_filters(filters: Iterable[np.ndarray]) -> np.ndarray:
    merged = None
    for packed in filters:
        merged = packed if merged is None else bloom.union(merged, packed)
    return merged if merged is not None else np.zeros(bloom.bloom_bits(0) // 8, dtype=np.uint8)


def _possible_rows(
    element: tuple[int, np.ndarray], tonight: np.ndarray
) -> Iterator[tuple[int, np.ndarray]]:
    shard, rows = element
    kept = rows[bloom.may_contain(tonight, rows["hi"], rows["lo"])]
    if len(kept):
        yield shard, kept


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
