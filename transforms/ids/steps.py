"""The Beam steps of dense ids: numbering spread over workers, and the id map read and written.

Nothing here holds every hash in one place:

1. each batch of requests becomes a table of occurrences, split by hash shard;
2. CombinePerKey keeps each hash's earliest occurrence, per shard;
3. the earliest occurrences are cut into time buckets; a side input of bucket sizes gives each
   bucket its first id; a stateful DoFn keyed by bucket sorts its bucket and numbers it;
4. the numbered hashes join the requests' lookups per shard (CoGroupByKey), and the ids go back
   to the request batch they came from.

With ids from earlier runs (an id map, see id_map.py), step 2's output first meets the map's rows
per shard: hashes the map knows keep their ids, only the others are numbered, from the map's next
id. The map is read once, streamed per shard; no worker holds all of it.

One Beam element per batch and shard, never per block.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

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

from transforms import storage
from transforms.encode.hashed_batch import HashedBatch
from transforms.ids import bloom
from transforms.ids.buckets import buckets_of, first_offsets
from transforms.ids.dense_ids import (
    DEFAULT_HASH_SHARDS,
    FIRST,
    LOOKUP,
    NUMBERED,
    OCCURRENCE,
    RESOLVED,
    KeyExtractor,
    UniqueTotals,
    earliest,
    lookup,
    narrowed,
    number,
    resolve,
    shard_of,
    split_by,
    sum_unique,
)
from transforms.ids.id_map import read_segment, relative, segment_path, write_segment
from transforms.steps import metered

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
                yield beam.pvalue.TaggedOutput("lookups", (shard, (batch_id, narrowed(part, LOOKUP))))

        split = batches | "SplitByShard" >> beam.FlatMap(tables).with_outputs(
            "occurrences", "lookups"
        )
        firsts = metered(split.occurrences, "occurrences") | "EarliestPerShard" >> beam.CombinePerKey(
            EarliestOccurrence())
        unique = (
            firsts
            | "UniqueTotals" >> beam.Map(lambda kv: UniqueTotals(len(kv[1]), int(kv[1]["weight"].sum())))
            | "SumUnique" >> beam.CombineGlobally(sum_unique)
        )
        unseen, known, carried = self._against_prior(firsts, prior)
        # Int keys (split_by yields Python ints): the hint gives NumberBucket, a stateful DoFn,
        # a deterministic key coder, where Beam would otherwise warn and guess.
        by_bucket = unseen | "ByBucket" >> beam.FlatMap(
            lambda kv: split_by(narrowed(kv[1], FIRST), buckets_of(kv[1]["ts"]))
        ).with_output_types(tuple[int, Any])
        first_ids = (
            by_bucket
            | "BucketSizes" >> beam.Map(lambda kv: (kv[0], len(kv[1])))
            | "SumPerBucket" >> beam.CombinePerKey(sum)
            | "AllSizes" >> beam.combiners.ToDict()
            | "FirstIds" >> beam.Map(first_offsets, self._next_id)
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
            {"numbered": metered((numbered, known) | "WithKnown" >> beam.Flatten(), "numbered"),
             "lookups": metered(split.lookups, "lookups")}
            | "JoinPerShard" >> beam.CoGroupByKey()
            | "Resolve" >> beam.ParDo(ResolveShard())
        )
        added = (numbered, carried) | "ToPersist" >> beam.Flatten()
        return {"ids": ids, "unique": unique, "added": added, "added_count": added_count}

    def _against_prior(
        self, firsts: beam.PCollection, prior: beam.PCollection | None
    ) -> tuple[beam.PCollection, ...]:
        """(unseen, known, carried): see SplitKnown. Without prior rows everything is unseen.

        Unless compacting (which rewrites every prior row), prior rows pass a Bloom filter of
        tonight's keys before the shuffle: the join then grows with the night, not the map."""
        if prior is None:
            nothing = firsts.pipeline | "NoPriorIds" >> beam.Create([])
            return firsts, nothing, nothing
        if not self._compact:
            tonight = firsts | "TonightsFilters" >> beam.MapTuple(
                lambda shard, table: (
                    shard, bloom.build(table["hi"], table["lo"], bloom.bloom_bits(len(table))))
            )
            prior = prior | "OnlyTonightsKeys" >> beam.FlatMap(
                _possible_rows, beam.pvalue.AsDict(tonight)
            )
        split = (
            {"firsts": metered(firsts, "firsts"), "existing": metered(prior, "mapRows")}
            | "MeetPrior" >> beam.CoGroupByKey()
            | "SplitKnown" >> beam.ParDo(SplitKnown(self._compact)).with_outputs(
                "known", "carried", main="unseen"
            )
        )
        return split.unseen, split.known, split.carried


def _possible_rows(
    element: tuple[int, np.ndarray], tonight: dict[int, np.ndarray]
) -> Iterator[tuple[int, np.ndarray]]:
    """The map rows of a shard that tonight's keys of that shard may hold (none when tonight
    has no key in the shard)."""
    shard, rows = element
    if shard in tonight:
        kept = rows[bloom.may_contain(tonight[shard], rows["hi"], rows["lo"])]
        if len(kept):
            yield shard, kept





class ReadIdMap(beam.PTransform):
    """A version's segment files in, (hash shard, NUMBERED rows) out: one streaming pass."""

    def __init__(self, directory: str, files: list[str], shards: int):
        super().__init__()
        self._paths = [storage.join(directory, name) for name in sorted(files)]
        self._shards = shards

    def expand(self, root: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            root
            | "SegmentFiles" >> beam.Create(self._paths)
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadSegments" >> beam.FlatMap(read_segment, self._shards)
        )


class WriteSegmentShard(beam.DoFn):
    """(hash shard, NUMBERED tables) in; the written file's path, relative to the map, out."""

    def __init__(self, directory: str, version: int, run_id: str, kind: str):
        self._directory, self._version, self._kind = directory, version, kind
        self._run_id = run_id

    def process(self, element: tuple[int, list[np.ndarray]]) -> Iterator[str]:
        shard, tables = element
        path = segment_path(self._directory, self._version, self._run_id, self._kind, shard)
        write_segment(path, list(tables))
        yield relative(self._directory, path)
