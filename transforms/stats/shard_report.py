"""The report of `kvtrace analyze --engine beam`, from the shards' partial results: the same
keys and numbers as trace_stats.analyze gives from a whole trace."""

from __future__ import annotations

from collections import Counter

import numpy as np

from kvtrace.transforms.stats.histograms import describe_histogram, merge
from kvtrace.transforms.stats.key_shards import CHAINING_PROBLEMS, ShardResult
from kvtrace.transforms.stats.trace_shards import FileChunk, RowShardResult
from kvtrace.transforms.stats.trace_stats import MAX_EXAMPLES, Measures, id_problems, report


def file_summary(chunk: FileChunk) -> FileChunk:
    """The chunk without its tables: what the report needs of each file."""
    return FileChunk(
        chunk.index,
        chunk.rows[:0],
        chunk.blocks[:0],
        chunk.problems,
        chunk.sessions,
        chunk.first_ts,
        chunk.last_ts,
        chunk.first_line,
    )


def shard_counts(result: ShardResult) -> ShardResult:
    """A key shard's result without its per-row partials (those went to the row shards)."""
    return ShardResult(result.partials[:0], result.counts, result.problem_ids)


def assemble(
    files: tuple[str, ...],
    block_size: int,
    warmup_fraction: float,
    chunks: list[FileChunk],
    shard_results: list[ShardResult],
    row_results: list[RowShardResult],
    minutes: Counter,
) -> dict:
    """The report, from every shard's and file's partial results, as trace_stats.analyze."""
    chunks = sorted(chunks, key=lambda c: c.index)
    hist = {
        name: merge(r.histograms[name] for r in row_results)
        for name in ("isl", "osl", "context", "unique_prompt", "hit_rate", "per_request")
    }
    sums: Counter = merge(r.sums for r in row_results)
    counts: Counter = merge(r.counts for r in shard_results)
    isl, osl = hist["isl"], hist["osl"]
    measures = Measures(
        total_requests=sums["rows"],
        unique_prefixes=counts["unique_prefixes"],
        num_prefix_groups=counts["num_prefix_groups"],
        prefix_occurrences=counts["occurrences"],
        reused_prefix_occurrences=counts["reused_occurrences"],
        stats={
            "isl": describe_histogram(isl),
            "osl": describe_histogram(osl),
            "context": describe_histogram(hist["context"]),
            "unique_prompt": describe_histogram(hist["unique_prompt"]),
            "hit_rate": describe_histogram(hist["hit_rate"]),
        },
        isl_range=(int(min(isl, default=0)), int(max(isl, default=0))),
        osl_range=(int(min(osl, default=0)), int(max(osl, default=0))),
        tokens=sums["tokens"],
        miss_tokens=sums["miss_tokens"],
        blocks=sums["blocks"],
        misses=sums["misses"],
        tokens_after_warmup=sums["tokens_after"],
        miss_tokens_after_warmup=sums["miss_tokens_after"],
        per_request_mean=describe_histogram(hist["per_request"])["mean"],
        per_minute=minutes,
        sessions=merge(c.sessions for c in chunks),
        problems=_problems(files, chunks, shard_results),
    )
    return report(measures, block_size, warmup_fraction)


def _problems(
    files: tuple[str, ...], chunks: list[FileChunk], shard_results: list[ShardResult]
) -> dict:
    """Per-file problems merged in file order, plus timestamps going back across files and the
    ids that are not chained."""
    merged: dict[str, dict] = {}
    for name in ("hash_ids_length_mismatch", "timestamps_backwards", "malformed_lines"):
        merged[name] = {
            "count": sum(c.problems[name]["count"] for c in chunks),
            "examples": [e for c in chunks for e in c.problems[name]["examples"]],
        }
    previous_end = None
    for chunk in chunks:  # a file starting earlier than the previous one ended
        if chunk.first_ts is None:
            continue
        if previous_end is not None and chunk.first_ts < previous_end:
            merged["timestamps_backwards"]["count"] += 1
            merged["timestamps_backwards"]["examples"].append(
                {"file": files[chunk.index], "line": chunk.first_line}
            )
        previous_end = chunk.last_ts
    for name in ("hash_ids_length_mismatch", "timestamps_backwards"):
        examples = merged[name]["examples"]
        examples.sort(key=lambda e: (files.index(e["file"]), e["line"]))
        merged[name]["examples"] = examples[:MAX_EXAMPLES]
    ids = {
        name: np.unique(
            np.concatenate(
                [np.zeros(0, np.int64)]
                + [r.problem_ids[name] for r in shard_results if name in r.problem_ids]
            )
        )
        for name in CHAINING_PROBLEMS
    }
    return {**merged, **id_problems(**ids)}
