"""Trace statistics, vectorised over a whole trace held as columns (the fast local path).

Two families, each named for what it measures:
- compatible: the per-request metrics of Dynamo's `datagen analyze` and aiperf's analyze-trace,
  with their exact definitions (file order, id-seen sets, whole-file pair counts);
- hit_rates: infinite-cache hit rates over the longest cached prefix, causal in (timestamp, file
  order), token- and block-weighted, for cache sizing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvtrace.transforms.trace_io import Trace

STAT_NAMES = ("mean", "std_dev", "min", "p25", "median", "p75", "max")
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
    """Per-block views of a trace: row, position and the exact prefix each block ends."""

    row: np.ndarray
    position: np.ndarray
    prefix: np.ndarray  # dense id of hash_ids[:position + 1], equal exactly for equal prefixes

    @staticmethod
    def of(trace: Trace) -> Blocks:
        lengths = trace.lengths
        row = np.repeat(np.arange(len(trace)), lengths)
        position = np.arange(len(trace.ids)) - np.repeat(trace.offsets[:-1], lengths)
        return Blocks(row, position, prefix_ids(trace))


def prefix_ids(trace: Trace) -> np.ndarray:
    """A dense id per block for the prefix it ends, exact (no hashing): level by level, each
    (parent prefix, id) pair is numbered by sorting."""
    lengths = trace.lengths
    prefix = np.empty(len(trace.ids), dtype=np.int64)
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


def block_weights(trace: Trace, block_size: int, blocks: Blocks) -> np.ndarray:
    """Tokens per block: block_size, the last block of a row its real remainder (clipped to
    1..block_size for rows whose length disagrees with their ids)."""
    weights = np.full(len(trace.ids), block_size, dtype=np.int64)
    lengths = trace.lengths
    has = lengths > 0
    last = trace.offsets[1:][has] - 1
    remainder = trace.input_length[has] - (lengths[has] - 1) * block_size
    weights[last] = np.clip(remainder, 1, block_size)
    return weights


def _first_per_row(flags: np.ndarray, trace: Trace, blocks: Blocks) -> np.ndarray:
    """Per row, the position of its first flagged block, or its length if none is flagged."""
    lengths = trace.lengths
    result = lengths.copy()
    flagged = np.flatnonzero(flags)
    rows = blocks.row[flagged]
    first = np.unique(rows, return_index=True)
    result[first[0]] = blocks.position[flagged[first[1]]]
    return result


def compatible(trace: Trace, block_size: int, blocks: Blocks) -> dict:
    """aiperf's analyze-trace keys, with Dynamo's definitions (they agree)."""
    lengths = trace.lengths
    with_ids = lengths > 0
    # Theoretical hit rate: ids seen in earlier rows, file order.
    _, first_index, inverse = np.unique(trace.ids, return_index=True, return_inverse=True)
    first_row = blocks.row[first_index][inverse]
    unseen_index = _first_per_row(first_row >= blocks.row, trace, blocks)
    hit_rate = unseen_index[with_ids] / lengths[with_ids]
    # Context length: (position, id) pairs over the whole file.
    pair_order = np.lexsort((trace.ids, blocks.position))
    pair_new = np.ones(len(pair_order), dtype=bool)
    pair_new[1:] = (np.diff(blocks.position[pair_order]) != 0) | (np.diff(trace.ids[pair_order]) != 0)
    pair_group = np.cumsum(pair_new) - 1
    pair_count = np.bincount(pair_group)
    repeated = np.empty(len(pair_order), dtype=bool)
    repeated[pair_order] = pair_count[pair_group] >= 2
    repeated_per_row = np.bincount(blocks.row, weights=repeated, minlength=len(trace)).astype(np.int64)
    context = np.where(repeated_per_row == lengths, trace.input_length, repeated_per_row * block_size)
    # Prefix reuse: each distinct hash_ids[:i].
    prefix_count = np.bincount(blocks.prefix) if len(blocks.prefix) else np.zeros(0, np.int64)
    first_ids = trace.ids[trace.offsets[:-1][with_ids]]
    _, starts = np.unique(first_ids, return_counts=True)
    isl, osl = trace.input_length, trace.output_length
    return {
        "total_requests": len(trace),
        "unique_prefixes": int(len(prefix_count)),
        "num_prefix_groups": int((starts >= 2).sum()),
        "cache_hit_rate": float(hit_rate.mean()) if len(hit_rate) else 0.0,
        "min_isl": int(isl.min()) if len(isl) else 0,
        "max_isl": int(isl.max(initial=0)),
        "avg_isl": float(isl.mean()) if len(isl) else 0.0,
        "min_osl": int(osl.min()) if len(osl) else 0,
        "max_osl": int(osl.max(initial=0)),
        "avg_osl": float(osl.mean()) if len(osl) else 0.0,
        "prefix_reuse_ratio": (float(prefix_count[prefix_count > 1].sum() / prefix_count.sum())
                               if len(prefix_count) else 0.0),
        "isl_stats": describe(isl),
        "osl_stats": describe(osl),
        "context_length_stats": describe(context),
        "unique_prompt_length_stats": describe(isl - context),
        "hit_rate_stats": describe(hit_rate),
    }


def causal_order(trace: Trace) -> np.ndarray:
    """Each row's rank in (timestamp, file order)."""
    order = np.lexsort((np.arange(len(trace)), trace.timestamp))
    rank = np.empty(len(trace), dtype=np.int64)
    rank[order] = np.arange(len(trace))
    return rank


def hit_rates(trace: Trace, block_size: int, blocks: Blocks, warmup_fraction: float) -> dict:
    """Infinite-cache hit rates, causal: a block hits when its whole prefix appeared in an
    earlier row. With exact prefix ids a prefix's blocks are in one row at most once, so a block
    misses exactly at its prefix's first occurrence, and the hits of a row form a prefix."""
    rank = causal_order(trace)
    block_rank = rank[blocks.row]
    order = np.lexsort((block_rank, blocks.prefix))
    first = np.ones(len(order), dtype=bool)
    first[1:] = np.diff(blocks.prefix[order]) != 0
    miss = np.empty(len(order), dtype=bool)
    miss[order] = first
    weights = block_weights(trace, block_size, blocks)
    rows = len(trace)
    blocks_per_row = trace.lengths
    miss_blocks = np.bincount(blocks.row, weights=miss, minlength=rows)
    tokens_per_row = np.bincount(blocks.row, weights=weights, minlength=rows)
    miss_tokens = np.bincount(blocks.row, weights=weights * miss, minlength=rows)
    with_blocks = blocks_per_row > 0
    after = rank >= math.floor(warmup_fraction * rows)
    return {
        "token_weighted": _ratio(tokens_per_row.sum() - miss_tokens.sum(), tokens_per_row.sum()),
        "block_weighted": _ratio(len(miss) - miss.sum(), len(miss)),
        "per_request_mean": float(np.mean(1 - miss_blocks[with_blocks] / blocks_per_row[with_blocks]))
                            if with_blocks.any() else 0.0,
        "token_weighted_after_warmup": _ratio(
            tokens_per_row[after].sum() - miss_tokens[after].sum(), tokens_per_row[after].sum()
        ),
        "warmup_fraction": warmup_fraction,
        "working_set": {"unique_blocks": int(miss.sum()), "unique_tokens": int(miss_tokens.sum())},
    }


def _ratio(part: float, whole: float) -> float:
    return float(part / whole) if whole else 0.0


def request_rate(trace: Trace) -> dict:
    """Requests per minute, over the minutes from the first request to the last."""
    if not len(trace):
        return {"mean_per_minute": 0.0, "peak_per_minute": 0, "minutes": 0}
    minute = ((trace.timestamp - trace.timestamp.min()) // 60_000).astype(np.int64)
    per_minute = np.bincount(minute)
    return {"mean_per_minute": float(len(trace) / len(per_minute)),
            "peak_per_minute": int(per_minute.max()), "minutes": int(len(per_minute))}


def sessions(trace: Trace) -> dict | None:
    if trace.session is None:
        return None
    present = np.array([s is not None for s in trace.session])
    if not present.any():
        return None
    _, counts = np.unique(trace.session[present].astype(str), return_counts=True)
    return {"sessions": int(len(counts)), "requests_with_session": int(present.sum()),
            "requests_per_session": describe(counts)}


def problems(trace: Trace, block_size: int, blocks: Blocks) -> dict:
    """What breaks the published traces' invariants, with example line numbers."""
    def examples(rows: np.ndarray) -> list[dict]:
        return [{"file": trace.files[trace.file_index[r]], "line": int(trace.line[r])}
                for r in rows[:MAX_EXAMPLES]]

    lengths = trace.lengths
    expected = -(-trace.input_length // block_size)
    wrong_length = np.flatnonzero(lengths != expected)
    backwards = np.flatnonzero(np.diff(trace.timestamp) < 0) + 1
    # Chained: an id always at the same position behind the same parent.
    parent = np.where(blocks.position > 0, np.roll(trace.ids, 1), -1)
    two_positions = _ids_with_many(trace.ids, blocks.position)
    two_parents = _ids_with_many(trace.ids, parent)
    return {
        "hash_ids_length_mismatch": {"count": int(len(wrong_length)), "examples": examples(wrong_length)},
        "timestamps_backwards": {"count": int(len(backwards)), "examples": examples(backwards)},
        "ids_at_several_positions": {"count": int(len(two_positions)),
                                     "examples": two_positions[:MAX_EXAMPLES].tolist()},
        "ids_behind_several_parents": {"count": int(len(two_parents)),
                                       "examples": two_parents[:MAX_EXAMPLES].tolist()},
        "malformed_lines": {"count": trace.malformed_count, "examples": trace.malformed},
    }


def _ids_with_many(ids: np.ndarray, attribute: np.ndarray) -> np.ndarray:
    """The ids that occur with more than one distinct value of attribute."""
    order = np.lexsort((attribute, ids))
    ids_sorted, attr_sorted = ids[order], attribute[order]
    same_id = ids_sorted[1:] == ids_sorted[:-1]
    differs = same_id & (attr_sorted[1:] != attr_sorted[:-1])
    return np.unique(ids_sorted[1:][differs])


def analyze(trace: Trace, block_size: int = 512, warmup_fraction: float = 0.5) -> dict:
    blocks = Blocks.of(trace)
    report = compatible(trace, block_size, blocks)
    report["hit_rates"] = hit_rates(trace, block_size, blocks, warmup_fraction)
    report["request_rate"] = request_rate(trace)
    session_stats = sessions(trace)
    if session_stats:
        report["sessions"] = session_stats
    report["problems"] = problems(trace, block_size, blocks)
    report["block_size"] = block_size
    report["definitions"] = DEFINITIONS
    return report
