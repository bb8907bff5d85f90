"""`kvtrace analyze --engine beam`: the statistics of trace_stats as a Beam pipeline.

Files are the unit of parallelism (line numbers define file order); blocks go to shards of hash
id, (position, id) pair and prefix, whose small per-row partials meet their rows in row shards
(transforms/stats/trace_shards.py). The numbers equal analyze_local's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import apache_beam as beam
import numpy as np
from pipelines.analyze_local import AnalyzeConfig
from transforms.ids.buckets import buckets_of
from transforms.stats.histograms import describe_histogram, histogram, merge
from transforms.stats.steps import ShardStep
from transforms.stats.trace_shards import (
    PARTIAL,
    ROW,
    FileChunk,
    ShardResult,
    by_shard,
    id_shard,
    pair_key,
    pair_shard,
    prefix_shard,
    read_chunk,
    row_shard,
    warmup_key,
    warmup_plan,
)
from transforms.stats.trace_stats import (
    DEFINITIONS,
    MAX_EXAMPLES,
    id_problems,
    minute_counts,
    request_rate,
    session_stats,
)


def build(pipeline: beam.Pipeline, config: AnalyzeConfig) -> beam.PCollection:
    """The pipeline; its output is the report dict (one element)."""
    block_size, shards = config.block_size, config.shards
    chunks = (
        pipeline
        | "Files" >> beam.Create(list(enumerate(config.inputs)))
        | "Read" >> beam.FlatMap(read_chunk, config.inputs, block_size)
    )
    ids = chunks | "ByIds" >> ShardStep(lambda b: b["id"], id_shard, shards)
    pairs = chunks | "ByPairs" >> ShardStep(pair_key, pair_shard, shards)
    prefixes = chunks | "ByPrefixes" >> ShardStep(lambda b: b["prefix_lo"], prefix_shard, shards)
    shard_results = (ids, pairs, prefixes) | "AllShards" >> beam.Flatten()

    # The warm-up cut: the causal key of the row at rank floor(fraction x rows).
    bucket_sizes = (
        chunks
        | "RowBuckets" >> beam.FlatMap(lambda c: histogram(buckets_of(c.rows["ts"])).items())
        | "SumBuckets" >> beam.CombinePerKey(sum)
        | "AllBuckets" >> beam.combiners.ToDict()
    )
    plan = bucket_sizes | "WarmupPlan" >> beam.Map(warmup_plan, config.warmup_fraction)
    first_after_warmup = (
        chunks
        | "Candidates" >> beam.FlatMap(
            lambda c, plan: [] if plan is None else [
                (float(r["ts"]), int(r["rowkey"]))
                for r in c.rows[buckets_of(c.rows["ts"]) == plan[0]]
            ],
            beam.pvalue.AsSingleton(plan),
        )
        | "AllCandidates" >> beam.combiners.ToList()
        | "WarmupKey" >> beam.Map(warmup_key, beam.pvalue.AsSingleton(plan))
    )

    partials = shard_results | "Partials" >> beam.FlatMap(
        lambda r: by_shard(r.partials, r.partials["rowkey"], shards)
    )
    rows = chunks | "Rows" >> beam.FlatMap(lambda c: by_shard(c.rows, c.rows["rowkey"], shards))
    row_results = (
        {"rows": rows, "partials": partials}
        | "JoinRows" >> beam.CoGroupByKey()
        | "PerRow" >> beam.Map(
            lambda kv, key: row_shard(_cat(kv[1]["rows"], ROW), _cat(kv[1]["partials"], PARTIAL),
                                      block_size, key),
            beam.pvalue.AsSingleton(first_after_warmup),
        )
    )
    origin = (
        chunks
        | "FirstTimes" >> beam.Map(lambda c: float(c.rows["ts"].min()) if len(c.rows) else None)
        | "Origin" >> beam.CombineGlobally(lambda ts: min((t for t in ts if t is not None),
                                                         default=0.0))
    )
    minutes = (
        chunks
        | "Minutes" >> beam.Map(lambda c, o: minute_counts(c.rows["ts"], o),
                                beam.pvalue.AsSingleton(origin))
        | "AllMinutes" >> beam.CombineGlobally(merge)
    )
    return (
        pipeline
        | "Report" >> beam.Create([None])
        | "Assemble" >> beam.Map(
            lambda _, chunks, shard_results, row_results, minutes: assemble(
                config, chunks, shard_results, row_results, minutes
            ),
            beam.pvalue.AsList(chunks | "ChunkSummaries" >> beam.Map(_summary)),
            beam.pvalue.AsList(shard_results | "ShardCounts" >> beam.Map(
                lambda r: ShardResult(r.partials[:0], r.counts, r.problem_ids))),
            beam.pvalue.AsList(row_results),
            beam.pvalue.AsSingleton(minutes),
        )
    )


def _cat(tables: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    tables = list(tables)
    return np.concatenate(tables) if tables else np.empty(0, dtype=dtype)


def _summary(chunk: FileChunk) -> FileChunk:
    """The chunk without its tables: what the report needs of each file."""
    return FileChunk(chunk.index, chunk.rows[:0], chunk.blocks[:0], chunk.problems,
                     chunk.sessions, chunk.first_ts, chunk.last_ts, chunk.first_line)


def assemble(config: AnalyzeConfig, chunks: list[FileChunk], shard_results: list[ShardResult],
             row_results: list, minutes: Counter) -> dict:
    """The report, from every shard's and file's partial results, as trace_stats.analyze."""
    chunks = sorted(chunks, key=lambda c: c.index)
    hist = {name: merge(r.histograms[name] for r in row_results) for name in
            ("isl", "osl", "context", "unique_prompt", "hit_rate", "per_request")}
    sums: Counter = merge(r.sums for r in row_results)
    counts: Counter = merge(r.counts for r in shard_results)
    isl, osl = hist["isl"], hist["osl"]
    total = sums["rows"]
    report: dict[str, Any] = {
        "total_requests": total,
        "unique_prefixes": counts["unique_prefixes"],
        "num_prefix_groups": counts["num_prefix_groups"],
        "cache_hit_rate": describe_histogram(hist["hit_rate"])["mean"],
        "min_isl": int(min(isl, default=0)), "max_isl": int(max(isl, default=0)),
        "avg_isl": describe_histogram(isl)["mean"],
        "min_osl": int(min(osl, default=0)), "max_osl": int(max(osl, default=0)),
        "avg_osl": describe_histogram(osl)["mean"],
        "prefix_reuse_ratio": (counts["reused_occurrences"] / counts["occurrences"]
                               if counts["occurrences"] else 0.0),
        "isl_stats": describe_histogram(isl),
        "osl_stats": describe_histogram(osl),
        "context_length_stats": describe_histogram(hist["context"]),
        "unique_prompt_length_stats": describe_histogram(hist["unique_prompt"]),
        "hit_rate_stats": describe_histogram(hist["hit_rate"]),
    }
    tokens, blocks = sums["tokens"], sums["blocks"]
    report["hit_rates"] = {
        "token_weighted": (tokens - sums["miss_tokens"]) / tokens if tokens else 0.0,
        "block_weighted": (blocks - sums["misses"]) / blocks if blocks else 0.0,
        "per_request_mean": describe_histogram(hist["per_request"])["mean"],
        "token_weighted_after_warmup": (
            (sums["tokens_after"] - sums["miss_tokens_after"]) / sums["tokens_after"]
            if sums["tokens_after"] else 0.0),
        "warmup_fraction": config.warmup_fraction,
        "working_set": {"unique_blocks": sums["misses"], "unique_tokens": sums["miss_tokens"]},
    }
    report["request_rate"] = request_rate(minutes)
    by_session = session_stats(merge(c.sessions for c in chunks))
    if by_session:
        report["sessions"] = by_session
    report["problems"] = _problems(config.inputs, chunks, shard_results)
    report["block_size"] = config.block_size
    report["definitions"] = DEFINITIONS
    return report


def _problems(files: tuple[str, ...], chunks: list[FileChunk],
              shard_results: list[ShardResult]) -> dict:
    """Per-file problems merged in file order, plus timestamps going back across files and the
    ids that are not chained."""
    merged: dict[str, dict] = {}
    for name in ("hash_ids_length_mismatch", "timestamps_backwards", "malformed_lines"):
        merged[name] = {"count": sum(c.problems[name]["count"] for c in chunks),
                        "examples": [e for c in chunks for e in c.problems[name]["examples"]]}
    previous_end = None
    for chunk in chunks:  # a file starting earlier than the previous one ended
        if chunk.first_ts is None:
            continue
        if previous_end is not None and chunk.first_ts < previous_end:
            merged["timestamps_backwards"]["count"] += 1
            merged["timestamps_backwards"]["examples"].append(
                {"file": files[chunk.index], "line": chunk.first_line})
        previous_end = chunk.last_ts
    for name in ("hash_ids_length_mismatch", "timestamps_backwards"):
        examples = merged[name]["examples"]
        examples.sort(key=lambda e: (files.index(e["file"]), e["line"]))
        merged[name]["examples"] = examples[:MAX_EXAMPLES]
    ids = {name: np.array(sorted({i for r in shard_results for i in r.problem_ids.get(name, [])}),
                          dtype=np.int64)
           for name in ("ids_at_several_positions", "ids_behind_several_parents")}
    return {**merged, **id_problems(ids["ids_at_several_positions"],
                                    ids["ids_behind_several_parents"])}


def analyze_beam(config: AnalyzeConfig, beam_flags: list[str], output: str | None = None) -> dict:
    """Run the Beam engine (embedded runner unless --runner says otherwise) and return the
    report, which the pipeline writes to OUTPUT/analysis.json on any Beam filesystem; without
    an output folder, to a temporary local one (local runners only)."""
    from pipelines.runner import run_for_report

    return run_for_report(lambda p: build(p, config), beam_flags, output, "analysis.json",
                          "--output DIR (a folder its workers can write: gs://, s3://) for the "
                          "report")
