"""Trace statistics, vectorised over a whole trace held as columns (the fast local path).

Two families, each named for what it measures:
- compatible: the per-request metrics of Dynamo's `datagen analyze` and aiperf's analyze-trace,
  with their exact definitions (file order, id-seen sets, whole-file pair counts);
- hit_rates: infinite-cache hit rates over the longest cached prefix, causal in (timestamp, file
  order), token- and block-weighted, for cache sizing.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from transforms.stats.heap import return_freed_heap
from transforms.stats.histograms import STAT_NAMES, histogram
from transforms.read.trace_io import Trace

MAX_EXAMPLES = 20  # example lines listed per problem kind
# Per-block temporaries (gathers, comparisons) are made this many blocks at a time: 16M blocks is
# 64 MB per int32 temporary, small beside the trace's own 4-byte-per-block columns, so memory
# stays near those columns (10M rows, 305M blocks: under 6 GB) instead of doubling at each step.
CHUNK_BLOCKS = 1 << 24

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
    """numpy's mean, population std, min, linear-interpolated quartiles, max (as aiperf)."""
    if len(values) == 0:
        return dict.fromkeys(STAT_NAMES, 0.0)
    values = np.asarray(values, dtype=np.float64)
    p25, median, p75 = np.percentile(values, [25, 50, 75])
    return {"mean": float(values.mean()), "std_dev": float(values.std()),
            "min": float(values.min()), "p25": float(p25), "median": float(median),
            "p75": float(p75), "max": float(values.max())}


@dataclass(frozen=True)
class Blocks:
    """Per-block views of a trace, computed once and shared by every metric."""

    offsets: np.ndarray  # the trace's: row r's blocks are [offsets[r], offsets[r + 1])
    position: np.ndarray  # int16 where rows are shorter than 2^15 blocks, else int32
    prefix: np.ndarray  # int32: dense id of hash_ids[:position + 1], equal exactly for equal prefixes
    id_group: np.ndarray  # dense index of the block's hash id among the distinct ids
    id_first: np.ndarray  # per distinct id, the index of its first block (file order)

    @staticmethod
    def of(trace: Trace) -> Blocks:
        lengths = trace.lengths
        narrow = np.int16 if lengths.max(initial=0) < 2**15 else np.int32
        position = np.empty(len(trace.ids), dtype=narrow)
        blocks = Blocks(trace.offsets, position, prefix_ids(trace), *dense_groups(trace.ids))
        for start, end in chunks(len(position)):  # traces hold < 2^31 blocks
            position[start:end] = np.arange(start, end) - trace.offsets[blocks.rows(start, end)]
        return blocks

    def rows(self, start: int, end: int) -> np.ndarray:
        """The row of each block in [start, end). Computed, not stored: a row per block would
        be the largest array of a big trace's analysis after the ids."""
        first, last = np.searchsorted(self.offsets, [start, end - 1], "right") - 1
        spans = np.diff(np.clip(self.offsets[first:last + 2], start, end))
        return np.repeat(np.arange(first, last + 1, dtype=np.int32), spans)

    def rows_at(self, index: np.ndarray) -> np.ndarray:
        """The row of each block in index."""
        return (np.searchsorted(self.offsets, index, "right") - 1).astype(np.int32)


def chunks(size: int) -> list[tuple[int, int]]:
    return [(start, min(size, start + CHUNK_BLOCKS)) for start in range(0, size, CHUNK_BLOCKS)]


def first_index(groups: np.ndarray, size: int) -> np.ndarray:
    """Per group value in [0, size), the index of its first occurrence (-1 where absent)."""
    first = np.full(size, -1, dtype=np.int32)  # traces hold < 2^31 blocks
    # Written backwards, so the earliest occurrence is the last write and wins.
    for start, end in reversed(chunks(len(groups))):
        first[groups[start:end][::-1]] = np.arange(end - 1, start - 1, -1, dtype=np.int32)
    return first


def last_index(groups: np.ndarray, size: int) -> np.ndarray:
    """Per group value in [0, size), the index of its last occurrence (-1 where absent)."""
    last = np.full(size, -1, dtype=np.int32)
    for start, end in chunks(len(groups)):  # forwards: the latest write wins
        last[groups[start:end]] = np.arange(start, end, dtype=np.int32)
    return last


def gathered(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """table[index], gathered chunk by chunk (numpy widens a whole int32 index to int64 first)."""
    out = np.empty(len(index), dtype=table.dtype)
    for start, end in chunks(len(index)):
        out[start:end] = table[index[start:end]]
    return out


def gathered_compare(table: np.ndarray, index: np.ndarray, other: np.ndarray, compare) -> np.ndarray:
    """compare(table[index], other) as a bool array, built chunk by chunk."""
    out = np.empty(len(index), dtype=bool)
    for start, end in chunks(len(index)):
        out[start:end] = compare(table[index[start:end]], other[start:end])
    return out


def dense_groups(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group of each value, first index of each group). Trace ids are usually dense from 0, so
    the values themselves serve as groups without sorting; sparse ids are numbered by sorting."""
    if len(values) and values.min() >= 0 and values.max() < 4 * len(values):
        return values, first_index(values, int(values.max()) + 1)
    _, first, groups = np.unique(values, return_index=True, return_inverse=True)
    return groups, first


def prefix_ids(trace: Trace) -> np.ndarray:
    """A dense id per block for the prefix it ends, exact (no hashing): level by level, each
    (parent prefix, id) pair is numbered by sorting."""
    lengths = trace.lengths
    prefix = np.empty(len(trace.ids), dtype=np.int32)
    by_length = np.argsort(-lengths, kind="stable")
    # rows with more than `level` ids: a prefix of by_length
    active_counts = np.searchsorted(-lengths[by_length], -np.arange(lengths.max(initial=0)), "left")
    next_id, parents = 0, None
    for level, active in enumerate(active_counts):
        rows = by_length[:active]
        at = trace.offsets[rows] + level
        values = trace.ids[at]
        parent = parents[:active] if parents is not None else np.zeros(active, np.int64)
        order = np.lexsort((values, parent))
        new = np.ones(active, dtype=bool)
        new[1:] = (np.diff(parent[order]) != 0) | (np.diff(values[order]) != 0)
        numbered = np.empty(active, dtype=np.int64)
        numbered[order] = next_id + np.cumsum(new) - 1
        next_id += int(new.sum())
        prefix[at] = numbered
        parents = numbered
    return prefix


def last_block_tokens(trace: Trace, block_size: int) -> np.ndarray:
    """Per row, the tokens in its last block: the real remainder (clipped to 1..block_size for
    rows whose length disagrees with their ids); 0 for rows without ids."""
    lengths = trace.lengths
    last = np.clip(trace.input_length - (lengths - 1) * block_size, 1, block_size)
    return np.where(lengths > 0, last, 0)


def row_tokens(trace: Trace, block_size: int) -> np.ndarray:
    """Per row, the tokens its blocks cover: full blocks plus the real last block."""
    lengths = trace.lengths
    return np.where(lengths > 0, (lengths - 1) * block_size, 0) + last_block_tokens(trace, block_size)


def _first_per_row(flags: np.ndarray, trace: Trace, blocks: Blocks) -> np.ndarray:
    """Per row, the position of its first flagged block, or its length if none is flagged."""
    result = trace.lengths.copy()
    done = np.zeros(len(result), dtype=bool)
    for start, end in chunks(len(flags)):  # in block order: a row's earlier chunk wins
        flagged = np.flatnonzero(flags[start:end]) + start
        rows, first = np.unique(blocks.rows_at(flagged), return_index=True)
        new = ~done[rows]
        result[rows[new]] = blocks.position[flagged[first[new]]]
        done[rows] = True
    return result


def _count_per_row(flags: np.ndarray, blocks: Blocks, rows: int) -> np.ndarray:
    counts = np.zeros(rows, dtype=np.int64)
    for start, end in chunks(len(flags)):
        counts += np.bincount(blocks.rows(start, end)[flags[start:end]], minlength=rows)
    return counts


def compatible(trace: Trace, block_size: int, blocks: Blocks) -> dict:
    """The Measures of the compatible section: aiperf's analyze-trace metrics, with Dynamo's
    definitions (they agree)."""
    lengths = trace.lengths
    with_ids = lengths > 0
    # Theoretical hit rate: ids seen in earlier rows, file order.
    first_row = np.concatenate([np.zeros(0, np.int32)] + [
        blocks.rows_at(blocks.id_first[start:end]) for start, end in chunks(len(blocks.id_first))])
    unseen = np.empty(len(blocks.id_group), dtype=bool)
    for start, end in chunks(len(unseen)):
        unseen[start:end] = first_row[blocks.id_group[start:end]] >= blocks.rows(start, end)
    del first_row
    hit_rate = _first_per_row(unseen, trace, blocks)[with_ids] / lengths[with_ids]
    del unseen
    # Context length: (position, id) pairs over the whole file. An id that keeps one position
    # (every chained trace) has as many pairs as occurrences; others are counted by sorting.
    # An id occurs twice or more exactly when its first and last occurrences differ (a count per
    # id would convert every block's group to int64 first: 2.4 GB at 305M blocks).
    repeated = gathered(blocks.id_first != last_index(blocks.id_group, len(blocks.id_first)),
                        blocks.id_group)
    moved = gathered_compare(blocks.position[blocks.id_first], blocks.id_group, blocks.position,
                             np.not_equal)
    if moved.any():
        moved_ids = np.zeros(len(blocks.id_first), dtype=bool)
        moved_ids[blocks.id_group[moved]] = True
        mixed = gathered(moved_ids, blocks.id_group)
        pair = blocks.id_group[mixed].astype(np.int64) * (int(lengths.max()) + 1)
        pair += blocks.position[mixed]
        _, pair_group, pair_count = np.unique(pair, return_inverse=True, return_counts=True)
        repeated[mixed] = pair_count[pair_group] >= 2
    del moved
    repeated_per_row = _count_per_row(repeated, blocks, len(trace))
    del repeated
    context = np.where(repeated_per_row == lengths, trace.input_length, repeated_per_row * block_size)
    # Prefix reuse: each distinct hash_ids[:i]; a prefix occurs once exactly when its first and
    # last occurrences coincide (a count per prefix would widen every block's id to int64).
    prefixes = int(blocks.prefix.max(initial=-1)) + 1
    once = int(np.count_nonzero(
        first_index(blocks.prefix, prefixes) == last_index(blocks.prefix, prefixes)))
    first_ids = trace.ids[trace.offsets[:-1][with_ids]]
    _, starts = np.unique(first_ids, return_counts=True)
    isl, osl = trace.input_length, trace.output_length
    return {
        "total_requests": len(trace),
        "unique_prefixes": prefixes,
        "num_prefix_groups": int((starts >= 2).sum()),
        "prefix_occurrences": len(blocks.prefix),
        "reused_prefix_occurrences": len(blocks.prefix) - once,
        "stats": {"isl": describe(isl), "osl": describe(osl), "context": describe(context),
                  "unique_prompt": describe(isl - context), "hit_rate": describe(hit_rate)},
        "isl_range": (int(isl.min()) if len(isl) else 0, int(isl.max(initial=0))),
        "osl_range": (int(osl.min()) if len(osl) else 0, int(osl.max(initial=0))),
    }


def causal_order(trace: Trace) -> np.ndarray:
    """Each row's rank in (timestamp, file order)."""
    order = np.lexsort((np.arange(len(trace)), trace.timestamp))
    rank = np.empty(len(trace), dtype=np.int64)
    rank[order] = np.arange(len(trace))
    return rank


def hit_rates(trace: Trace, block_size: int, blocks: Blocks, warmup_fraction: float) -> dict:
    """The Measures of infinite-cache hit rates, causal: a block hits when its whole prefix appeared in an
    earlier row. With exact prefix ids a prefix's blocks are in one row at most once, so a block
    misses exactly at its prefix's first occurrence, and the hits of a row form a prefix."""
    rank = causal_order(trace)
    missed = _first_in_causal_order(trace, blocks, rank)
    rows = len(trace)
    blocks_per_row = trace.lengths
    last_tokens = last_block_tokens(trace, block_size)
    miss_blocks = np.zeros(rows, dtype=np.int64)
    miss_tokens = np.zeros(rows, dtype=np.float64)  # sums of whole numbers: exact in any order
    for start, end in chunks(len(missed)):
        part = missed[start:end]
        miss_rows = blocks.rows_at(part)
        at_end = blocks.position[part] == blocks_per_row[miss_rows] - 1
        miss_weight = np.where(at_end, last_tokens[miss_rows], block_size)
        miss_blocks += np.bincount(miss_rows, minlength=rows)
        miss_tokens += np.bincount(miss_rows, weights=miss_weight, minlength=rows)
    tokens_per_row = row_tokens(trace, block_size)
    with_blocks = blocks_per_row > 0
    after = rank >= math.floor(warmup_fraction * rows)
    return {
        "tokens": int(tokens_per_row.sum()), "miss_tokens": int(miss_tokens.sum()),
        "blocks": len(blocks.prefix), "misses": len(missed),
        "tokens_after_warmup": int(tokens_per_row[after].sum()),
        "miss_tokens_after_warmup": int(miss_tokens[after].sum()),
        "per_request_mean": float(np.mean(1 - miss_blocks[with_blocks] / blocks_per_row[with_blocks]))
                            if with_blocks.any() else 0.0,
    }


def _first_in_causal_order(trace: Trace, blocks: Blocks, rank: np.ndarray) -> np.ndarray:
    """Per prefix, the block where it first occurs in causal order: its one miss (as block
    indices, in no particular order). When timestamps never go back, causal order is file order
    and needs no ranks."""
    prefixes = int(blocks.prefix.max(initial=-1)) + 1
    if (np.diff(trace.timestamp) >= 0).all():
        return first_index(blocks.prefix, prefixes)
    earliest = np.full(prefixes, len(trace), dtype=np.int64)
    for start, end in chunks(len(blocks.prefix)):
        np.minimum.at(earliest, blocks.prefix[start:end], rank[blocks.rows(start, end)])
    # A prefix occurs at most once per row and ranks are distinct: one block per prefix matches.
    return np.concatenate([np.zeros(0, dtype=np.int64)] + [
        np.flatnonzero(earliest[blocks.prefix[start:end]] == rank[blocks.rows(start, end)]) + start
        for start, end in chunks(len(blocks.prefix))])


def _ratio(part: float, whole: float) -> float:
    return float(part / whole) if whole else 0.0


def minute_counts(timestamps: np.ndarray, origin: float) -> Counter:
    """Requests per minute since origin (the trace's first timestamp)."""
    return histogram(((timestamps - origin) // 60_000).astype(np.int64))


def request_rate(per_minute: Counter) -> dict:
    """Requests per minute, over the minutes from the first request to the last."""
    if not per_minute:
        return {"mean_per_minute": 0.0, "peak_per_minute": 0, "minutes": 0}
    minutes = max(per_minute) + 1
    return {"mean_per_minute": float(sum(per_minute.values()) / minutes),
            "peak_per_minute": int(max(per_minute.values())), "minutes": int(minutes)}


def session_counts(trace: Trace) -> Counter:
    """Requests per session id, for the rows that have one."""
    if trace.session is None:
        return Counter()
    return Counter(str(s) for s in trace.session if s is not None)


def session_stats(counts: Counter) -> dict | None:
    if not counts:
        return None
    per_session = np.fromiter(counts.values(), dtype=np.int64, count=len(counts))
    return {"sessions": len(counts), "requests_with_session": int(per_session.sum()),
            "requests_per_session": describe(per_session)}


def row_problems(trace: Trace, block_size: int) -> dict:
    """Broken row invariants and malformed lines, with example lines (file order)."""
    def examples(rows: np.ndarray) -> list[dict]:
        return [{"file": trace.files[trace.file_index[r]], "line": int(trace.line[r])}
                for r in rows[:MAX_EXAMPLES]]

    expected = -(-trace.input_length // block_size)
    wrong_length = np.flatnonzero(trace.lengths != expected)
    backwards = np.flatnonzero(np.diff(trace.timestamp) < 0) + 1
    return {
        "hash_ids_length_mismatch": {"count": int(len(wrong_length)), "examples": examples(wrong_length)},
        "timestamps_backwards": {"count": int(len(backwards)), "examples": examples(backwards)},
        "malformed_lines": {"count": trace.malformed_count, "examples": trace.malformed},
    }


def id_problems(ids_at_several_positions: np.ndarray, ids_behind_several_parents: np.ndarray) -> dict:
    return {name: {"count": int(len(ids)), "examples": np.sort(ids)[:MAX_EXAMPLES].tolist()}
            for name, ids in (("ids_at_several_positions", ids_at_several_positions),
                              ("ids_behind_several_parents", ids_behind_several_parents))}


def problems(trace: Trace, block_size: int, blocks: Blocks) -> dict:
    """What breaks the published traces' invariants: rows, and ids that are not chained (an id
    always at the same position behind the same parent as where it first was)."""
    def position(index: np.ndarray) -> np.ndarray:
        return blocks.position[index]

    def parent(index: np.ndarray) -> np.ndarray:
        """The id before each block in its row, -1 for a row's first block."""
        return np.where(blocks.position[index] > 0, trace.ids[index - 1], -1)

    return {**row_problems(trace, block_size),
            **id_problems(_ids_differing(trace, blocks, position),
                          _ids_differing(trace, blocks, parent))}


def _ids_differing(trace: Trace, blocks: Blocks, attribute) -> np.ndarray:
    """The ids whose attribute (a function of block indices) somewhere differs from its value
    at the id's first occurrence."""
    first = attribute(blocks.id_first)
    found = [np.zeros(0, dtype=trace.ids.dtype)]
    for start, end in chunks(len(trace.ids)):
        differs = first[blocks.id_group[start:end]] != attribute(np.arange(start, end))
        found.append(np.unique(trace.ids[start:end][differs]))
    return np.unique(np.concatenate(found))


@dataclass(frozen=True)
class Measures:
    """What the report says, however an engine measured it (the whole trace at once here, by
    shards in shard_report.py); report() builds the report from it, once for both engines."""

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
        "min_isl": m.isl_range[0], "max_isl": m.isl_range[1], "avg_isl": m.stats["isl"]["mean"],
        "min_osl": m.osl_range[0], "max_osl": m.osl_range[1], "avg_osl": m.stats["osl"]["mean"],
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
            "token_weighted_after_warmup": _ratio(m.tokens_after_warmup - m.miss_tokens_after_warmup,
                                                  m.tokens_after_warmup),
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


def analyze(trace: Trace, block_size: int = 512, warmup_fraction: float = 0.5) -> dict:
    blocks = Blocks.of(trace)
    return_freed_heap()
    measured = compatible(trace, block_size, blocks) | hit_rates(trace, block_size, blocks,
                                                                 warmup_fraction)
    origin = float(trace.timestamp.min()) if len(trace) else 0.0
    return report(Measures(**measured, per_minute=minute_counts(trace.timestamp, origin),
                           sessions=session_counts(trace),
                           problems=problems(trace, block_size, blocks)),
                  block_size, warmup_fraction)
