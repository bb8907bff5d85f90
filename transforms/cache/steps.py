"""The cache stage's Beam steps: `kvtrace reuse --engine beam` as one composite (reuse_shards.py
says how the token clock and the prefixes shard)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np

from kvtrace.transforms.cache.reuse_report import merged_problems, reuse_report
from kvtrace.transforms.cache.reuse_shards import (
    ReuseSummary,
    bucket_tokens,
    clock_blocks,
    clock_starts,
    summarize,
)
from kvtrace.transforms.combiners import BucketTotals
from kvtrace.transforms.ids.buckets import buckets_of
from kvtrace.transforms.ids.dense_ids import split_by
from kvtrace.transforms.stats.steps import ReadTraceFiles
from kvtrace.transforms.stats.trace_shards import by_shard
from kvtrace.transforms.steps import CombineWith

# Prefix shards: each holds 1/N of the block occurrences in one worker.
PREFIX_SHARDS = 64


class SummarizeReuse(beam.PTransform):
    """FileChunks in, one ReuseSummary out. Blocks cross two shuffles: to their time bucket,
    where they are clocked from the tokens of every earlier bucket, and to their prefix shard,
    where reuse events are found."""

    def __init__(self, gpu_kv_cache_size: int | None):
        super().__init__()
        self._gpu_kv_cache_size = gpu_kv_cache_size

    def expand(self, chunks: beam.PCollection) -> beam.PCollection:
        gpu = self._gpu_kv_cache_size
        starts = chunks | "ClockStarts" >> beam.CombineGlobally(
            CombineWith(
                BucketTotals(
                    lambda c: bucket_tokens(c.blocks, buckets_of(c.blocks["ts"])).items(),
                    clock_starts,
                )
            )
        )
        return (
            chunks
            | "ByBucket" >> beam.FlatMap(lambda c: split_by(c.blocks, buckets_of(c.blocks["ts"])))
            | "GroupBuckets" >> beam.GroupByKey()
            | "Clock" >> beam.FlatMap(_clocked_by_prefix, beam.pvalue.AsSingleton(starts))
            | "GroupPrefixes" >> beam.GroupByKey()
            | "Summarize"
            >> beam.MapTuple(lambda _, tables: summarize(np.concatenate(list(tables)), gpu))
            | "MergeSummaries" >> beam.CombineGlobally(_merged).without_defaults()
        )


def _clocked_by_prefix(
    element: tuple[int, Iterable[np.ndarray]], starts: dict[int, int]
) -> Iterator[tuple[int, np.ndarray]]:
    bucket, tables = element
    clocked = clock_blocks(np.concatenate(list(tables)), starts[bucket])
    yield from by_shard(clocked, clocked["prefix_lo"], PREFIX_SHARDS)


def _merged(parts: Iterable[ReuseSummary]) -> ReuseSummary:
    total = ReuseSummary()
    for part in parts:
        total = total.merge(part)
    return total


class ReuseTrace(beam.PTransform):
    """Trace files in, the report of `kvtrace reuse` out (one dict; binned CCDF, no LRU)."""

    def __init__(self, files: tuple[str, ...], block_size: int, gpu_kv_cache_size: int | None):
        super().__init__()
        self._files, self._block_size, self._gpu = files, block_size, gpu_kv_cache_size

    def expand(self, root: beam.pvalue.PBegin) -> beam.PCollection:
        chunks = root | "ReadFiles" >> ReadTraceFiles(self._files, self._block_size)
        summary = chunks | "Reuse" >> SummarizeReuse(self._gpu)
        files = chunks | "FileProblems" >> beam.Map(lambda c: (c.index, c.problems, len(c.rows)))
        return (
            root.pipeline
            | "Report" >> beam.Create([None])
            | "Assemble"
            >> beam.Map(
                lambda _, summary, files: self._report(summary, files),
                beam.pvalue.AsSingleton(summary, default_value=ReuseSummary()),
                beam.pvalue.AsList(files),
            )
        )

    def _report(self, summary: ReuseSummary, files: list[tuple[int, dict, int]]) -> dict:
        files = sorted(files, key=lambda f: f[0])
        at_gpu = (
            (summary.above_gpu_tokens / summary.total_tokens if summary.total_tokens else 0.0)
            if self._gpu
            else None
        )
        return reuse_report(
            self._block_size,
            sum(rows for _, _, rows in files),
            summary.total_tokens,
            summary.reused_tokens,
            summary.ccdf(),
            summary.reuse_time(),
            merged_problems(p for _, p, _ in files),
            self._gpu,
            at_gpu,
        )
