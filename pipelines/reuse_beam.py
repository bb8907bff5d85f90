"""`kvtrace reuse --engine beam`: the reuse-interval CCDF and reuse times of traces beyond one
machine (transforms/cache/reuse_shards.py says how the clock and the prefixes shard).

Files are read in parallel (as analyze's Beam engine reads them); blocks cross two shuffles: to
their time bucket, where they are clocked, and to their prefix shard, where reuse events are
found. Exact LRU stack distances are not computed here: they need every use in one order.
"""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
import numpy as np
from pipelines.reuse_local import DEFINITIONS, ReuseConfig
from transforms.cache import plots
from transforms.cache.reuse_shards import (
    ReuseSummary,
    bucket_tokens,
    clock_blocks,
    clock_starts,
    summarize,
)
from transforms.ids.buckets import buckets_of
from transforms.storage import is_url
from transforms.ids.dense_ids import split_by
from transforms.stats.trace_shards import by_shard, read_chunk
from transforms.stats.trace_stats import MAX_EXAMPLES

# Prefix shards: each holds 1/N of the block occurrences in one worker.
PREFIX_SHARDS = 64


def build(pipeline: beam.Pipeline, config: ReuseConfig) -> beam.PCollection:
    """The pipeline; its output is the report dict (one element)."""
    chunks = (
        pipeline
        | "Files" >> beam.Create(list(enumerate(config.inputs)))
        | "Read" >> beam.FlatMap(read_chunk, config.inputs, config.block_size)
    )
    starts = (
        chunks
        | "BucketTokens" >> beam.FlatMap(
            lambda c: bucket_tokens(c.blocks, buckets_of(c.blocks["ts"])).items())
        | "SumBuckets" >> beam.CombinePerKey(sum)
        | "AllBuckets" >> beam.combiners.ToDict()
        | "ClockStarts" >> beam.Map(clock_starts)
    )
    summary = (
        chunks
        | "ByBucket" >> beam.FlatMap(lambda c: split_by(c.blocks, buckets_of(c.blocks["ts"])))
        | "GroupBuckets" >> beam.GroupByKey()
        | "Clock" >> beam.FlatMap(_clocked_by_prefix, beam.pvalue.AsSingleton(starts))
        | "GroupPrefixes" >> beam.GroupByKey()
        | "Summarize" >> beam.MapTuple(
            lambda _, tables: summarize(np.concatenate(list(tables)), config.gpu_kv_cache_size))
        | "MergeSummaries" >> beam.CombineGlobally(
            lambda parts: _merged(parts)).without_defaults()
    )
    problems = (
        chunks
        | "Problems" >> beam.Map(lambda c: (c.problems, len(c.rows)))
        | "AllProblems" >> beam.combiners.ToList()
    )
    return (
        pipeline
        | "Report" >> beam.Create([None])
        | "Assemble" >> beam.Map(lambda _, s, p: report(config, s, p),
                                 beam.pvalue.AsSingleton(summary, default_value=ReuseSummary()),
                                 beam.pvalue.AsSingleton(problems))
    )


def _clocked_by_prefix(element: tuple[int, list[np.ndarray]],
                       starts: dict[int, int]) -> Iterator[tuple[int, np.ndarray]]:
    bucket, tables = element
    clocked = clock_blocks(np.concatenate(list(tables)), starts[bucket])
    yield from by_shard(clocked, clocked["prefix_lo"], PREFIX_SHARDS)


def _merged(parts) -> ReuseSummary:
    total = ReuseSummary()
    for part in parts:
        total = total.merge(part)
    return total


def report(config: ReuseConfig, summary: ReuseSummary, chunk_problems: list) -> dict:
    x, y = summary.ccdf()
    problems: dict = {}
    for file_problems, _ in chunk_problems:
        for name, found in file_problems.items():
            entry = problems.setdefault(name, {"count": 0, "examples": []})
            entry["count"] += found["count"]
            entry["examples"] = (entry["examples"] + found["examples"])[:MAX_EXAMPLES]
    share = summary.reused_tokens / summary.total_tokens if summary.total_tokens else 0.0
    result = {
        "block_size": config.block_size,
        "rows": sum(rows for _, rows in chunk_problems),
        "prompt_tokens": summary.total_tokens,
        "definitions": {k: v for k, v in DEFINITIONS.items() if "lru" not in k},
        "infinite_cache": {"token_weighted": share},
        "reused_token_share": share,
        "ccdf": {"interval_tokens": x.tolist(), "share_above": y.tolist(),
                 "binned": "exact at each listed interval (32 bins per doubling)"},
        "reuse_time": summary.reuse_time(),
        "problems": problems,
    }
    if config.gpu_kv_cache_size:
        result["gpu_kv_cache_size"] = config.gpu_kv_cache_size
        result["ccdf_at_gpu_kv_cache_size"] = (summary.above_gpu_tokens / summary.total_tokens
                                               if summary.total_tokens else 0.0)
    return result


def run_reuse_beam(config: ReuseConfig, beam_flags: list[str]) -> dict:
    """Run on the embedded runner unless --runner says otherwise; the plot and report are
    written by the launcher from the one report element (remote runners need config.plot and
    the report on a filesystem the launcher reads: a local temporary folder is used locally)."""
    from apache_beam.io.filesystems import FileSystems

    from pipelines.runner import run_for_report

    remote_folder = config.plot.rsplit("/", 1)[0] if is_url(config.plot or "") else None
    result = run_for_report(lambda p: build(p, config), beam_flags, remote_folder, "reuse.json",
                            "--output on a filesystem its workers can write (gs://, s3://)")
    if config.plot:
        png = plots.reuse_figure(
            np.array(result["ccdf"]["interval_tokens"]), np.array(result["ccdf"]["share_above"]),
            config.gpu_kv_cache_size, result.get("ccdf_at_gpu_kv_cache_size"), None, None, None,
            result["reuse_time"])
        with FileSystems.create(config.plot) as handle:
            handle.write(png)
    return result
