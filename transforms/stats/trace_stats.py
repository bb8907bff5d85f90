"""The report of `kvtrace analyze`: its definitions, what it is built from (Measures, however an
engine measured them), and the local engine's analysis (the whole trace as one shard of the
algorithm in key_shards.py).

Two families, each named for what it measures:
- compatible: the per-request metrics of Dynamo's `datagen analyze` and aiperf's analyze-trace,
  with their exact definitions (file order, id-seen sets, whole-file pair counts);
- hit_rates: infinite-cache hit rates over the longest cached prefix, causal in (timestamp, file
  order), token- and block-weighted, for cache sizing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.stats.heap import return_freed_heap
from kvtrace.transforms.stats.histograms import describe_histogram, histogram
from kvtrace.transforms.stats.key_shards import (
    Rows,
    chaining_problems,
    first_after_warmup,
    id_shard,
    prefix_shard,
    row_measures,
    row_sums,
)
from kvtrace.transforms.stats.trace_blocks import Blocks
from kvtrace.transforms.trace_format import DEFAULT_BLOCK_SIZE

MAX_EXAMPLES = 20  # example lines listed per problem kind

DEFINITIONS = {
    "cache_hit_rate": "aiperf/Dynamo theoretical hit rate: per row, (index of the first hash id "
    "not seen in any earlier row, file order) / len(hash_ids); mean over rows "
    "with hash_ids; a partial last block counts as a whole block",
    "context_length": "aiperf/Dynamo: (position, id) pairs counted over the whole file; "
    "input_length if all of a row's pairs repeat, else repeated pairs x block "
    "size (not causal)",
    "token_weighted": "infinite cache, causal in (timestamp, file order): tokens of each row's "
    "longest prefix seen in an earlier row / all input tokens; the partial last "
    "block weighs its real token count",
    "block_weighted": "as token_weighted, counting blocks",
    "per_request_mean": "as block_weighted, per row, then the unweighted mean over rows with blocks",
    "token_weighted_after_warmup": "as token_weighted, counting only rows after the first "
    "warmup fraction of rows (earlier rows still fill the cache)",
}


def describe(values: np.ndarray) -> dict[str, float]:
    """mean, population std, min, linear-interpolated quartiles, max (as aiperf), from the
    values' histogram: the Beam engine's shards merge theirs into the same one, so both engines
    sum the same numbers in the same order, to the same last digit."""
    return describe_histogram(histogram(np.asarray(values)))


def _ratio(part: float, whole: float) -> float:
    return float(part / whole) if whole else 0.0


def minute_counts(timestamps: np.ndarray, origin: float) -> Counter:
    """Requests per minute since origin (the trace's first timestamp)."""
    return histogram(((timestamps - origin) // 60_000).astype(np.int64))


def request_rate(per_minute: Counter) -> dict:
    """A trace's span and request rate, the one definition analyze, the report and synthesize's
    summary print: the span is the one-minute bins from the first request's to the last's
    (minutes; 17.0 minutes from first to last fill 18), the rate the mean of those bins (so
    requests / minutes, exactly), the peak the fullest bin. Bins, not the first-to-last time:
    one request, or a burst within a second, still has a rate."""
    if not per_minute:
        return {"mean_per_minute": 0.0, "peak_per_minute": 0, "minutes": 0}
    minutes = max(per_minute) + 1
    return {
        "mean_per_minute": float(sum(per_minute.values()) / minutes),
        "peak_per_minute": int(max(per_minute.values())),
        "minutes": int(minutes),
    }


def session_counts(trace: Trace) -> Counter:
    """Requests per session id, for the rows that have one."""
    if trace.session is None:
        return Counter()
    return Counter(str(s) for s in trace.session if s is not None)


def session_stats(counts: Counter) -> dict | None:
    if not counts:
        return None
    per_session = np.fromiter(counts.values(), dtype=np.int64, count=len(counts))
    return {
        "sessions": len(counts),
        "requests_with_session": int(per_session.sum()),
        "requests_per_session": describe(per_session),
    }


def row_problems(trace: Trace, block_size: int) -> dict:
    """Broken row invariants and malformed lines, with example lines (file order)."""

    def examples(rows: np.ndarray) -> list[dict]:
        return [
            {"file": trace.files[trace.file_index[r]], "line": int(trace.line[r])}
            for r in rows[:MAX_EXAMPLES]
        ]

    expected = -(-trace.input_length // block_size)
    wrong_length = np.flatnonzero(trace.lengths != expected)
    backwards = np.flatnonzero(np.diff(trace.timestamp) < 0) + 1
    return {
        "hash_ids_length_mismatch": {
            "count": int(len(wrong_length)),
            "examples": examples(wrong_length),
        },
        "timestamps_backwards": {"count": int(len(backwards)), "examples": examples(backwards)},
        "malformed_lines": {"count": trace.malformed_count, "examples": trace.malformed},
    }


def id_problems(
    ids_at_several_positions: np.ndarray, ids_behind_several_parents: np.ndarray
) -> dict:
    return {
        name: {"count": int(len(ids)), "examples": np.sort(ids)[:MAX_EXAMPLES].tolist()}
        for name, ids in (
            ("ids_at_several_positions", ids_at_several_positions),
            ("ids_behind_several_parents", ids_behind_several_parents),
        )
    }


def problems(trace: Trace, block_size: int, blocks: Blocks) -> dict:
    """What breaks the published traces' invariants: rows, and ids that are not chained (an id
    always at the same position behind the same parent as where it first was)."""
    return {**row_problems(trace, block_size), **id_problems(**chaining_problems(blocks))}


@dataclass(frozen=True)
class Measures:
    """What the report says, however an engine measured it (one shard of each kind here, many
    in shard_report.py); report() builds the report from it, once for both engines."""

    total_requests: int
    unique_prefixes: int
    num_prefix_groups: int
    prefix_occurrences: int
    reused_prefix_occurrences: int  # occurrences of prefixes that occur more than once
    stats: dict[str, dict[str, float]]  # described: isl, osl, context, unique_prompt, hit_rate
    isl_range: tuple[int, int]
    osl_range: tuple[int, int]
    tokens: int  # of prompts, as their blocks cover them
    miss_tokens: int  # of each prefix's first occurrence in causal order
    blocks: int
    misses: int
    tokens_after_warmup: int
    miss_tokens_after_warmup: int
    per_request_mean: float
    per_minute: Counter
    sessions: Counter
    problems: dict


def report(measures: Measures, block_size: int, warmup_fraction: float) -> dict:
    m = measures
    result = {
        "total_requests": m.total_requests,
        "unique_prefixes": m.unique_prefixes,
        "num_prefix_groups": m.num_prefix_groups,
        "cache_hit_rate": m.stats["hit_rate"]["mean"],
        "min_isl": m.isl_range[0],
        "max_isl": m.isl_range[1],
        "avg_isl": m.stats["isl"]["mean"],
        "min_osl": m.osl_range[0],
        "max_osl": m.osl_range[1],
        "avg_osl": m.stats["osl"]["mean"],
        "prefix_reuse_ratio": _ratio(m.reused_prefix_occurrences, m.prefix_occurrences),
        "isl_stats": m.stats["isl"],
        "osl_stats": m.stats["osl"],
        "context_length_stats": m.stats["context"],
        "unique_prompt_length_stats": m.stats["unique_prompt"],
        "hit_rate_stats": m.stats["hit_rate"],
        "hit_rates": {
            "token_weighted": _ratio(m.tokens - m.miss_tokens, m.tokens),
            "block_weighted": _ratio(m.blocks - m.misses, m.blocks),
            "per_request_mean": m.per_request_mean,
            "token_weighted_after_warmup": _ratio(
                m.tokens_after_warmup - m.miss_tokens_after_warmup, m.tokens_after_warmup
            ),
            "warmup_fraction": warmup_fraction,
            "working_set": {"unique_blocks": m.misses, "unique_tokens": m.miss_tokens},
        },
        "request_rate": request_rate(m.per_minute),
    }
    by_session = session_stats(m.sessions)
    if by_session:
        result["sessions"] = by_session
    result |= {"problems": m.problems, "block_size": block_size, "definitions": DEFINITIONS}
    return result


def analyze(
    trace: Trace, block_size: int = DEFAULT_BLOCK_SIZE, warmup_fraction: float = 0.5
) -> dict:
    """The report of `kvtrace analyze`, the whole trace as one key shard of each kind and one
    row shard (key_shards.py)."""
    blocks = Blocks.of(trace)
    return_freed_heap()
    by_id, by_prefix = id_shard(blocks), prefix_shard(blocks)
    del blocks
    rows = Rows(
        np.arange(len(trace), dtype=np.int64),
        trace.timestamp,
        trace.input_length,
        trace.output_length,
        trace.lengths,
    )
    measured = row_measures(
        rows,
        np.concatenate([by_id.partials, by_prefix.partials]),
        block_size,
        first_after_warmup(rows.timestamp, rows.keys, warmup_fraction),
    )
    sums, counts = row_sums(rows, measured), by_id.counts + by_prefix.counts
    isl, osl = trace.input_length, trace.output_length
    measures = Measures(
        total_requests=len(trace),
        unique_prefixes=counts["unique_prefixes"],
        num_prefix_groups=counts["num_prefix_groups"],
        prefix_occurrences=counts["occurrences"],
        reused_prefix_occurrences=counts["reused_occurrences"],
        stats={
            "isl": describe(isl),
            "osl": describe(osl),
            "context": describe(measured.context),
            "unique_prompt": describe(isl - measured.context),
            "hit_rate": describe(measured.hit_rate),
        },
        isl_range=(int(isl.min()) if len(isl) else 0, int(isl.max(initial=0))),
        osl_range=(int(osl.min()) if len(osl) else 0, int(osl.max(initial=0))),
        tokens=sums["tokens"],
        miss_tokens=sums["miss_tokens"],
        blocks=sums["blocks"],
        misses=sums["misses"],
        tokens_after_warmup=sums["tokens_after"],
        miss_tokens_after_warmup=sums["miss_tokens_after"],
        per_request_mean=describe(measured.per_request)["mean"],  # 0.0 for no row with blocks
        per_minute=minute_counts(
            trace.timestamp, float(trace.timestamp.min()) if len(trace) else 0.0
        ),
        sessions=session_counts(trace),
        problems={**row_problems(trace, block_size), **id_problems(**by_id.problem_ids)},
    )
    return report(measures, block_size, warmup_fraction)
