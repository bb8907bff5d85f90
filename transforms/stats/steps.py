"""The statistics stage's Beam steps: a trace's files read as tables, blocks through one function
per key shard, per-row partials joined with their rows, and the report of `analyze --engine beam`
(key_shards.py says how the statistics shard)."""

from __future__ import annotations

from collections.abc import Callable

import apache_beam as beam
import numpy as np

from kvtrace.transforms.combiners import BucketTotals
from kvtrace.transforms.ids.buckets import buckets_of
from kvtrace.transforms.stats.histograms import histogram, merge
from kvtrace.transforms.stats.key_shards import PARTIAL, id_shard, prefix_shard
from kvtrace.transforms.stats.shard_report import assemble, file_summary, shard_counts
from kvtrace.transforms.stats.trace_shards import (
    ROW,
    FileChunk,
    by_shard,
    read_chunk,
    row_shard,
    shard_blocks,
    warmup_key,
    warmup_plan,
)
from kvtrace.transforms.stats.trace_stats import minute_counts
from kvtrace.transforms.steps import CombineWith


class ReadTraceFiles(beam.PTransform):
    """Trace files in, one FileChunk per file out (files are the unit of parallelism: line
    numbers define file order). The files travel with the step (pickled), only their indexes
    between steps: Beam carries text as UTF-8, and a Linux name need not be."""

    def __init__(self, files: tuple[str, ...], block_size: int):
        super().__init__()
        self._files, self._block_size = files, block_size

    def expand(self, root: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            root
            | "Files" >> beam.Create(list(range(len(self._files))))
            | "Read" >> beam.FlatMap(read_chunk, self._files, self._block_size)
        )


class ShardStep(beam.PTransform):
    """Blocks to shards of one key; each shard's tables (one per file) through one shard
    function."""

    def __init__(
        self,
        key: Callable[[np.ndarray], np.ndarray],
        analyse: Callable[[list[np.ndarray]], object],
        shards: int,
    ):
        super().__init__()
        self._key, self._analyse, self._shards = key, analyse, shards

    def expand(self, chunks: beam.PCollection) -> beam.PCollection:
        key, analyse, shards = self._key, self._analyse, self._shards
        return (
            chunks
            | "Split" >> beam.FlatMap(lambda c: by_shard(c.blocks, key(c.blocks), shards))
            | "Group" >> beam.GroupByKey()
            | "Analyse" >> beam.MapTuple(lambda _, tables: analyse(list(tables)))
        )


class WarmupKey(beam.PTransform):
    """FileChunks in, one element out: the causal key (timestamp, rowkey) of the row at rank
    floor(fraction x rows), or None for an empty trace; found from row counts per time bucket,
    then the candidates of the one bucket holding that rank."""

    def __init__(self, fraction: float):
        super().__init__()
        self._fraction = fraction

    def expand(self, chunks: beam.PCollection) -> beam.PCollection:
        plan = chunks | "WarmupPlan" >> beam.CombineGlobally(
            CombineWith(
                BucketTotals(
                    lambda c: histogram(buckets_of(c.rows["ts"])).items(),
                    lambda sizes: warmup_plan(sizes, self._fraction),
                )
            )
        )
        return (
            chunks
            | "Candidates" >> beam.FlatMap(_warmup_candidates, beam.pvalue.AsSingleton(plan))
            | "AllCandidates" >> beam.combiners.ToList()
            | "WarmupKey" >> beam.Map(warmup_key, beam.pvalue.AsSingleton(plan))
        )


def _warmup_candidates(chunk: FileChunk, plan: tuple[int, int] | None) -> list[tuple[float, int]]:
    if plan is None:
        return []
    rows = chunk.rows[buckets_of(chunk.rows["ts"]) == plan[0]]
    return [(float(row["ts"]), int(row["rowkey"])) for row in rows]


class RowShards(beam.PTransform):
    """{"chunks": FileChunks, "shard_results": key shards' ShardResults} in, one RowShardResult
    per row shard out: each row meets every partial about it (trace_shards.row_shard)."""

    def __init__(self, block_size: int, shards: int, warmup: beam.PCollection):
        super().__init__()
        self._block_size, self._shards, self._warmup = block_size, shards, warmup

    def expand(self, inputs: dict[str, beam.PCollection]) -> beam.PCollection:
        block_size, shards = self._block_size, self._shards
        partials = inputs["shard_results"] | "Partials" >> beam.FlatMap(
            lambda r: by_shard(r.partials, r.partials["rowkey"], shards)
        )
        rows = inputs["chunks"] | "Rows" >> beam.FlatMap(
            lambda c: by_shard(c.rows, c.rows["rowkey"], shards)
        )
        return (
            {"rows": rows, "partials": partials}
            | "JoinRows" >> beam.CoGroupByKey()
            | "PerRow"
            >> beam.Map(
                lambda kv, key: row_shard(
                    _concat(kv[1]["rows"], ROW),
                    _concat(kv[1]["partials"], PARTIAL),
                    block_size,
                    key,
                ),
                beam.pvalue.AsSingleton(self._warmup),
            )
        )


def _concat(tables: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    tables = list(tables)
    return np.concatenate(tables) if tables else np.empty(0, dtype=dtype)


class MinuteCounts(beam.PTransform):
    """FileChunks in, one Counter out: requests per minute since the earliest request."""

    def expand(self, chunks: beam.PCollection) -> beam.PCollection:
        origin = (
            chunks
            | "FirstTimes"
            >> beam.FlatMap(lambda c: [float(c.rows["ts"].min())] if len(c.rows) else [])
            | "Origin" >> beam.CombineGlobally(lambda ts: min(ts, default=0.0))
        )
        return (
            chunks
            | "Minutes"
            >> beam.Map(
                lambda c, o: minute_counts(c.rows["ts"], o), beam.pvalue.AsSingleton(origin)
            )
            | "AllMinutes" >> beam.CombineGlobally(merge)
        )


class AnalyzeTrace(beam.PTransform):
    """Trace files in, the report of `kvtrace analyze` out (one dict): blocks go to shards of
    hash id and of prefix (key_shards.py); their per-row partials meet their rows in row
    shards."""

    def __init__(
        self, files: tuple[str, ...], block_size: int, warmup_fraction: float, shards: int
    ):
        super().__init__()
        self._files, self._block_size = files, block_size
        self._warmup_fraction, self._shards = warmup_fraction, shards

    def expand(self, root: beam.pvalue.PBegin) -> beam.PCollection:
        shards = self._shards
        chunks = root | "ReadFiles" >> ReadTraceFiles(self._files, self._block_size)
        shard_results = (
            chunks
            | "ByIds"
            >> ShardStep(
                lambda b: b["id"], lambda t: id_shard(shard_blocks(t, id_divisor=shards)), shards
            ),
            chunks
            | "ByPrefixes"
            >> ShardStep(
                lambda b: b["prefix_lo"],
                lambda t: prefix_shard(shard_blocks(t, with_prefix=True)),
                shards,
            ),
        ) | "AllShards" >> beam.Flatten()
        warmup = chunks | "FirstAfterWarmup" >> WarmupKey(self._warmup_fraction)
        row_results = {"chunks": chunks, "shard_results": shard_results} | "RowShards" >> RowShards(
            self._block_size, shards, warmup
        )
        minutes = chunks | "RequestRate" >> MinuteCounts()
        return (
            root.pipeline
            | "Report" >> beam.Create([None])
            | "Assemble"
            >> beam.Map(
                lambda _, *parts: assemble(
                    self._files, self._block_size, self._warmup_fraction, *parts
                ),
                beam.pvalue.AsList(chunks | "FileSummaries" >> beam.Map(file_summary)),
                beam.pvalue.AsList(shard_results | "ShardCounts" >> beam.Map(shard_counts)),
                beam.pvalue.AsList(row_results),
                beam.pvalue.AsSingleton(minutes),
            )
        )
