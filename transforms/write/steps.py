"""The Beam step of writing: one trace shard per worker call."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np

from kvtrace.transforms.write.coarsen import Coarsening
from kvtrace.transforms.write.parents import link_occurrences, resolve_key, set_parents
from kvtrace.transforms.write.rows import RowBatch, shard_count
from kvtrace.transforms.write.shards import write_shard


class WriteShard(beam.DoFn):
    """(shard, row batches) in, (written path, sha256) out. `gate` is a side input that must be
    computed, and may fail the job, before any file is written."""

    def __init__(
        self,
        directory: str,
        coarsening: Coarsening = Coarsening(),
        hashes_directory: str | None = None,
        measured_directory: str | None = None,
    ):
        self._directory = directory
        self._coarsening = coarsening
        self._hashes_directory = hashes_directory
        self._measured_directory = measured_directory

    def process(
        self,
        element: tuple[int, Iterable[RowBatch | None]],
        plan: np.ndarray,
        origin: int,
        gate: object,
    ) -> Iterator[tuple[str, str]]:
        shard, batches = element
        # None marks shard 0, which always exists so that an empty trace still has its files.
        yield from write_shard(
            self._directory,
            shard,
            shard_count(plan),
            (b for b in batches if b),
            origin,
            self._coarsening,
            self._hashes_directory,
            self._measured_directory,
        )


class NumberParents(beam.PTransform):
    """write/parents.py on workers: (shard, rows) in, each shard's rows sorted whole with their
    parents set out. A shard's rows are ranked from the shards' row counts (a side input of one
    number per shard); each link goes to its key, where its children are resolved (never all
    links in one worker), and the parents go back to their shards."""

    def expand(self, rows: beam.PCollection) -> beam.PCollection:
        shards = (
            rows
            | "GroupRowsByShard" >> beam.GroupByKey()
            | "SortShard"
            >> beam.MapTuple(lambda s, parts: (s, RowBatch.concat(list(parts)).sorted()))
        )
        counts = beam.pvalue.AsDict(
            shards | "ShardRows" >> beam.MapTuple(lambda s, b: (s, len(b.rows)))
        )
        parents = (
            shards
            | "LinkOccurrences"
            >> beam.FlatMap(lambda shard, counts: link_occurrences(*shard, counts), counts)
            | "GroupByLink" >> beam.GroupByKey()
            | "ResolveLinks" >> beam.FlatMapTuple(resolve_key)
        )
        return (
            {"rows": shards, "parents": parents}
            | "JoinParents" >> beam.CoGroupByKey()
            | "SetParents"
            >> beam.MapTuple(
                lambda s, joined: (s, set_parents(_one(joined["rows"]), joined["parents"]))
            )
        )


def _one(batches: Iterable[RowBatch]) -> RowBatch:
    (batch,) = batches  # one sorted batch per shard
    return batch
