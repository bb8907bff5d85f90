"""The Beam steps of dense ids: numbering spread over workers, and the id map read and written.

Nothing here holds every hash in one place:

1. each batch of requests becomes a table of occurrences, split by hash shard;
2. CombinePerKey keeps each hash's earliest occurrence, per shard;
3. the earliest occurrences are cut into time buckets; a side input of bucket sizes gives each
   bucket its first id; a stateful DoFn keyed by bucket sorts its bucket and numbers it;
4. the numbered hashes join the requests' lookups per shard (CoGroupByKey), and the ids go back
   to the request batch they came from.

With ids from earlier runs (an id map, see id_map.py), step 2's output first meets the map per
shard: each shard's worker reads, of the shard's segment files, only the row groups that can
hold tonight's keys (segments.py); hashes the map knows keep their ids, only the others are
numbered, from the map's next id. A night that rewrites the map (compaction) streams it whole
instead, re-split by shard.

A stream numbers each window through three keyed steps instead (SeenShard, NumberNew,
ShardStore, below; id_shards.py): its map lives in (kind, shard) keys, never in one.

One Beam element per batch and shard, never per block.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.coders import PickleCoder, VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.transforms.window import GlobalWindow

from kvtrace.transforms.combiners import BucketTotals
from kvtrace.transforms.encode.hashed_batch import HashedBatch
from kvtrace.transforms.ids.buckets import buckets_of, first_offsets
from kvtrace.transforms.ids.dense_ids import (
    DEFAULT_HASH_SHARDS,
    FIRST,
    LOOKUP,
    NUMBERED,
    OCCURRENCE,
    RESOLVED,
    KeyExtractor,
    earliest,
    narrowed,
    number,
    resolve,
    shard_of,
    split_by,
    split_known,
    sum_unique,
    unique_totals,
)
from kvtrace.transforms.ids.id_map import write_segment_shard
from kvtrace.transforms.ids.id_shards import (
    InOrder,
    Query,
    empty_shard,
    ids_of,
    in_order,
    merged,
    new_in_shard,
    shard_parts,
)
from kvtrace.transforms.ids.segments import SegmentFile, read_matching_files, read_segment
from kvtrace.transforms.steps import CombineWith, metered

# Keep merging cheap: re-sort the combined table only once the unsorted part outgrows it.
_MIN_COMPACT_ROWS = 65_536


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


class LookUpShard(beam.DoFn):
    """Per hash shard: tonight's earliest occurrences against the shard's file of every map
    segment, reading only the row groups that can hold tonight's keys (segments.read_matching):
    no map row is shuffled, and what is read grows with the night, not with the map. Unseen keys
    go on to be numbered; known ones come out with their old ids ("known")."""

    def __init__(self):
        self._bytes_read = Metrics.counter("kvtrace", "map_bytes_read")
        self._groups_read = Metrics.counter("kvtrace", "map_row_groups_read")
        self._groups = Metrics.counter("kvtrace", "map_row_groups")

    def process(self, element: tuple[int, dict[str, list]]) -> Iterator[Any]:
        shard, groups = element
        for firsts in groups["firsts"]:  # at most one: the shard's combined table
            matched = read_matching_files(groups["files"], firsts)
            self._bytes_read.inc(matched.bytes_read)
            self._groups_read.inc(matched.row_groups_read)
            self._groups.inc(matched.row_groups)
            yield from _split_known(shard, firsts, matched.rows)


class SplitKnown(beam.DoFn):
    """Per hash shard, on a night that rewrites the map: tonight's earliest occurrences against
    all of the shard's map rows, which also come out ("carried") to be written again."""

    def process(self, element: tuple[int, dict[str, list]]) -> Iterator[Any]:
        shard, groups = element
        existing = (
            np.concatenate(groups["existing"]) if groups["existing"] else np.empty(0, NUMBERED)
        )
        if len(existing):
            yield beam.pvalue.TaggedOutput("carried", (shard, existing))
        for firsts in groups["firsts"]:  # at most one: the shard's combined table
            yield from _split_known(shard, firsts, existing)


def _split_known(shard: int, firsts: np.ndarray, existing: np.ndarray) -> Iterator[Any]:
    """Unseen first occurrences (main output) and the map rows of the seen ones ("known")."""
    unseen, known = split_known(firsts, existing)
    if len(unseen):
        yield shard, unseen
    if len(known):
        yield beam.pvalue.TaggedOutput("known", (shard, known))


class AssignDenseIds(beam.PTransform):
    """(batch id, HashedBatch) in, alone or as {"batches": those, and an id map to extend:
    "map_files": (shard, segment file path) of its segments, whose keys keep their ids, or
    "map_rows": every (shard, NUMBERED) row of it, on a night that rewrites it (compaction)};
    out a dict:
    "ids": (batch id, RESOLVED table) pairs;
    "unique": one UniqueTotals of the distinct keys in the input;
    "added": (shard, NUMBERED) rows to persist: the newly numbered keys (and, with map_rows,
    every earlier key too), and "added_count", one int: how many keys were new.

    keys picks what gets numbered (block hashes, or session keys): the transform is the same.
    With a map, only keys absent from it are numbered, from next_id.
    """

    def __init__(self, keys: KeyExtractor, shards: int = DEFAULT_HASH_SHARDS, next_id: int = 0):
        super().__init__()
        self._keys = keys
        self._shards = shards
        self._next_id = next_id

    def expand(self, inputs: beam.PCollection | dict) -> dict[str, beam.PCollection]:
        batches, prior = (inputs["batches"], inputs) if isinstance(inputs, dict) else (inputs, {})
        keys, shards = self._keys, self._shards

        def tables(batch: tuple[int, HashedBatch]) -> Iterator[tuple[str, Any]]:
            batch_id, hashed = batch
            table = keys(hashed)
            for shard, part in split_by(table, shard_of(table, shards)):
                yield beam.pvalue.TaggedOutput("occurrences", (shard, part))
                yield beam.pvalue.TaggedOutput(
                    "lookups", (shard, (batch_id, narrowed(part, LOOKUP)))
                )

        split = batches | "SplitByShard" >> beam.FlatMap(tables).with_outputs(
            "occurrences", "lookups"
        )
        firsts = metered(
            split.occurrences, "occurrences"
        ) | "EarliestPerShard" >> beam.CombinePerKey(EarliestOccurrence())
        unique = (
            firsts
            | "UniqueTotals" >> beam.Map(lambda kv: unique_totals(kv[1]))
            | "SumUnique" >> beam.CombineGlobally(sum_unique)
        )
        unseen, known, carried = self._against_prior(firsts, prior)
        # Int keys (split_by yields Python ints): the hint gives NumberBucket, a stateful DoFn,
        # a deterministic key coder, where Beam would otherwise warn and guess.
        by_bucket = unseen | "ByBucket" >> beam.FlatMap(
            lambda kv: split_by(narrowed(kv[1], FIRST), buckets_of(kv[1]["ts"]))
        ).with_output_types(tuple[int, Any])
        first_ids = by_bucket | "FirstIds" >> beam.CombineGlobally(
            CombineWith(
                BucketTotals(
                    lambda kv: [(kv[0], len(kv[1]))],
                    functools.partial(first_offsets, start=self._next_id),
                )
            )
        )
        numbered = (
            metered(by_bucket, "buckets")
            | "NumberBuckets" >> beam.ParDo(NumberBucket(), beam.pvalue.AsSingleton(first_ids))
            | "NumberedByShard" >> beam.FlatMap(lambda t: split_by(t, shard_of(t, shards)))
        )
        added_count = (
            unseen
            | "CountUnseen" >> beam.Map(lambda kv: len(kv[1]))
            | "SumUnseen" >> beam.CombineGlobally(sum)
        )
        ids = (
            {
                "numbered": metered((numbered, known) | "WithKnown" >> beam.Flatten(), "numbered"),
                "lookups": metered(split.lookups, "lookups"),
            }
            | "JoinPerShard" >> beam.CoGroupByKey()
            | "Resolve" >> beam.ParDo(ResolveShard())
        )
        added = (numbered, carried) | "ToPersist" >> beam.Flatten()
        return {"ids": ids, "unique": unique, "added": added, "added_count": added_count}

    @staticmethod
    def _against_prior(
        firsts: beam.PCollection, prior: dict[str, beam.PCollection]
    ) -> tuple[beam.PCollection, ...]:
        """(unseen, known, carried): see LookUpShard and SplitKnown. Without a map everything is
        unseen."""
        nothing = firsts.pipeline | "NoCarriedIds" >> beam.Create([])
        if "map_files" in prior or "map_rows" in prior:  # numbering needs FIRST's 44 of 52 bytes
            firsts = firsts | "OnlyFirstFields" >> beam.MapTuple(
                lambda shard, table: (shard, narrowed(table, FIRST))
            ).with_output_types(tuple[int, Any])
        if "map_files" in prior:
            split = (
                {"firsts": metered(firsts, "firsts"), "files": prior["map_files"]}
                | "MeetMap" >> beam.CoGroupByKey()
                | "LookUpShard" >> beam.ParDo(LookUpShard()).with_outputs("known", main="unseen")
            )
            return split.unseen, split.known, nothing
        if "map_rows" in prior:
            split = (
                {
                    "firsts": metered(firsts, "firsts"),
                    "existing": metered(prior["map_rows"], "mapRows"),
                }
                | "MeetMap" >> beam.CoGroupByKey()
                | "SplitKnown"
                >> beam.ParDo(SplitKnown()).with_outputs("known", "carried", main="unseen")
            )
            return split.unseen, split.known, split.carried
        return firsts, nothing, nothing


class ReadIdMap(beam.PTransform):
    """A version's segment files in, (hash shard, NUMBERED rows) out, split into `shards`: one
    streaming pass over the whole map, for a night that rewrites it."""

    def __init__(self, segments: list[SegmentFile], shards: int):
        super().__init__()
        self._segments = sorted(segments)
        self._shards = shards

    def expand(self, root: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            root
            | "SegmentFiles" >> beam.Create(self._segments)
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadSegments" >> beam.FlatMap(read_segment, self._shards)
        )


class WriteSegmentShard(beam.DoFn):
    """(hash shard, {"added": NUMBERED tables, "runs": SegmentFiles}) in, the written
    SegmentFile out (id_map.write_segment_shard)."""

    def __init__(self, directory: str, version: int, run_id: str, kind: str):
        self._directory, self._version, self._kind = directory, version, kind
        self._run_id = run_id

    def process(self, element: tuple[int, dict[str, list]]) -> Iterator[SegmentFile]:
        shard, groups = element
        yield write_segment_shard(
            self._directory,
            self._version,
            self._run_id,
            self._kind,
            shard,
            list(groups["runs"]),
            list(groups["added"]),
        )


# A stream's id map in hash-shard keys (id_shards.py): seen sets, then the numbering step, then
# the stores it feeds, each keyed so that no key holds the map, each taking windows in their
# published order (in_order) whatever order the runner delivers them in. Windows are numbered
# 0, 1, ... by their place among the published ones.
IDS, QUERY = "ids", "query"


def _ordered(order: Any, window: int, item: object, needed: int) -> list[tuple[int, list]]:
    """The windows now complete at a step, its order state advanced."""
    state, taken = in_order(order.read() or InOrder(0, {}), window, item, needed)
    order.write(state)
    return taken


class SeenShard(beam.DoFn):
    """Keyed by (kind, shard): the shard's seen set. In: ((kind, shard), (window, its first
    occurrences in the window: FIRST)); out: (kind, (window, those it had never seen)), one a
    window for every shard, so the numbering step knows when it has the window."""

    ORDER = ReadModifyWriteStateSpec("order", PickleCoder())
    SEEN = ReadModifyWriteStateSpec("seen", PickleCoder())

    def process(
        self,
        element: tuple[tuple[str, int], tuple[int, np.ndarray]],
        order=beam.DoFn.StateParam(ORDER),
        seen=beam.DoFn.StateParam(SEEN),
    ) -> Iterator[tuple[str, tuple[int, np.ndarray]]]:
        (kind, _), (window, firsts) = element
        taken = _ordered(order, window, firsts, 1)
        if taken:
            hashes = seen.read()
            hashes = empty_shard().seen if hashes is None else hashes
            for taken_window, [part] in taken:
                new, hashes = new_in_shard(hashes, part)
                yield kind, (taken_window, new)
            seen.write(hashes)


class NumberNew(beam.DoFn):
    """Keyed by kind: numbers a window's new first occurrences from every shard (the batch
    job's order of first use) from the kind's next id. Out: each shard's new ids,
    ((kind, shard), (window, IDS, NUMBERED)), and, tagged ADDED, (window, kind, every new id)."""

    ADDED = "added"
    ORDER = ReadModifyWriteStateSpec("order", PickleCoder())
    NEXT_ID = ReadModifyWriteStateSpec("next_id", VarIntCoder())

    def __init__(self, shards: int):
        self._shards = shards

    def process(
        self,
        element: tuple[str, tuple[int, np.ndarray]],
        order=beam.DoFn.StateParam(ORDER),
        next_id=beam.DoFn.StateParam(NEXT_ID),
    ) -> Iterator[Any]:
        kind, (window, new) = element
        taken = _ordered(order, window, new, self._shards)
        if taken:
            first = next_id.read() or 0
            for taken_window, parts in taken:
                numbered = number(np.concatenate(parts), first)
                first += len(numbered)
                for shard, part in enumerate(shard_parts(numbered, self._shards)):
                    yield (kind, shard), (taken_window, IDS, part)
                yield beam.pvalue.TaggedOutput(self.ADDED, (taken_window, kind, numbered))
            next_id.write(first)


class ShardStore(beam.DoFn):
    """Keyed by (kind, shard): the shard's id store. In: ((kind, shard), (window, IDS, its new
    ids)) from NumberNew and ((kind, shard), (window, QUERY, Query)) from the window; out:
    (window, (kind, the query's rows, their ids)) once it has both."""

    ORDER = ReadModifyWriteStateSpec("order", PickleCoder())
    STORE = ReadModifyWriteStateSpec("store", PickleCoder())

    def process(
        self,
        element: tuple[tuple[str, int], tuple[int, str, Any]],
        order=beam.DoFn.StateParam(ORDER),
        store=beam.DoFn.StateParam(STORE),
    ) -> Iterator[tuple[int, tuple[str, np.ndarray, np.ndarray]]]:
        (kind, _), (window, tag, payload) = element
        taken = _ordered(order, window, (tag, payload), 2)
        if taken:
            ids = store.read()
            ids = empty_shard().ids if ids is None else ids
            for taken_window, items in taken:
                parts = dict(items)
                ids = merged(ids, parts[IDS])
                query: Query = parts[QUERY]
                yield taken_window, (kind, query.rows, ids_of(ids, query.hashes))
            store.write(ids)
