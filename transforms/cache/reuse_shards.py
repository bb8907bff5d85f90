"""Reuse intervals shard by shard, for traces beyond one machine (pipelines/reuse_beam.py).

The token clock needs the global causal order, but only as a running sum: each time bucket
learns the tokens of every earlier bucket (a small side input), orders its own rows and clocks
their blocks. Reuse events then depend only on each prefix's own occurrences, so prefixes
shard freely: a shard finds its prefixes' events with the local engine's pass
(reuse.clocked_reuse_events) and emits mergeable summaries (token sums and histograms, the
CCDF's interval bins: reuse.interval_bins), and the CCDF is sampled from the merged bins as the
local engine samples a whole trace's (reuse.binned_ccdf); `ccdf_at_gpu_kv_cache_size` is exact. LRU stack distances do not
shard: a block's distance counts every other block used in between, so they stay on one
machine (stack_distance.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvtrace.transforms.cache.reuse import (
    INTERVAL_EDGES,
    REUSE_TIME_LABELS,
    binned_ccdf,
    clocked_reuse_events,
    interval_bins,
)
from kvtrace.transforms.stats.trace_shards import dense_prefixes

CLOCKED = np.dtype(
    [("prefix_hi", "<u8"), ("prefix_lo", "<u8"), ("start", "<i8"), ("tokens", "<i8"), ("ts", "<f8")]
)


def bucket_tokens(blocks: np.ndarray, bucket: np.ndarray) -> dict[int, int]:
    """Tokens per time bucket of a chunk's blocks (bucket: each block's row's bucket)."""
    keys, inverse = np.unique(bucket, return_inverse=True)
    return dict(
        zip(keys.tolist(), np.bincount(inverse, weights=blocks["weight"]).astype(np.int64).tolist())
    )


def clock_starts(bucket_totals: dict[int, int]) -> dict[int, int]:
    """The clock at the start of each bucket: the tokens of every earlier bucket."""
    starts, clock = {}, 0
    for bucket in sorted(bucket_totals):
        starts[bucket], clock = clock, clock + bucket_totals[bucket]
    return starts


def clock_blocks(blocks: np.ndarray, start: int) -> np.ndarray:
    """One bucket's blocks (analyze's BLOCK table, any order) clocked in causal order: by
    (timestamp, rowkey), then position."""
    order = np.lexsort((blocks["pos"], blocks["rowkey"], blocks["ts"]))
    ordered = blocks[order]
    clocked = np.empty(len(ordered), dtype=CLOCKED)
    clocked["prefix_hi"], clocked["prefix_lo"] = ordered["prefix_hi"], ordered["prefix_lo"]
    clocked["tokens"], clocked["ts"] = ordered["weight"], ordered["ts"]
    clocked["start"] = start + np.cumsum(ordered["weight"]) - ordered["weight"]
    return clocked


@dataclass
class ReuseSummary:
    """Mergeable: every sum the report needs, from any set of prefixes."""

    total_tokens: int = 0
    reused_tokens: int = 0
    above_gpu_tokens: int = 0
    interval_tokens: np.ndarray = field(
        default_factory=lambda: np.zeros(len(INTERVAL_EDGES), np.int64)
    )
    time_tokens: np.ndarray = field(
        default_factory=lambda: np.zeros(len(REUSE_TIME_LABELS), np.int64)
    )

    def merge(self, other: ReuseSummary) -> ReuseSummary:
        return ReuseSummary(
            self.total_tokens + other.total_tokens,
            self.reused_tokens + other.reused_tokens,
            self.above_gpu_tokens + other.above_gpu_tokens,
            self.interval_tokens + other.interval_tokens,
            self.time_tokens + other.time_tokens,
        )

    def ccdf(self) -> tuple[np.ndarray, np.ndarray]:
        return binned_ccdf(self.interval_tokens, self.total_tokens)

    def reuse_time(self) -> list[dict]:
        reused = int(self.time_tokens.sum())
        return [
            {"bucket": label, "tokens": int(t), "share": float(t / reused) if reused else 0.0}
            for label, t in zip(REUSE_TIME_LABELS, self.time_tokens)
        ]


def summarize(clocked: np.ndarray, gpu_kv_cache_size: int | None) -> ReuseSummary:
    """The reuse events of a shard's prefixes (every occurrence of each prefix present), found
    as the local engine finds a whole trace's (reuse.clocked_reuse_events), then binned."""
    clocked = clocked[np.argsort(clocked["start"])]
    prefix = dense_prefixes(clocked)
    # Each occurrence its own row: a prefix occurs once per request, so rows only carry times.
    events = clocked_reuse_events(
        prefix,
        clocked["tokens"],
        np.arange(len(clocked) + 1),
        clocked["ts"],
        int(prefix.max(initial=-1)) + 1,
        clocked["start"],
    )
    above_gpu = (
        int(
            events.tokens[
                np.searchsorted(events.interval_tokens, gpu_kv_cache_size, side="right") :
            ].sum()
        )
        if gpu_kv_cache_size
        else 0
    )
    return ReuseSummary(
        total_tokens=events.total_tokens,
        reused_tokens=int(events.tokens.sum()),
        above_gpu_tokens=above_gpu,
        interval_tokens=interval_bins(events),
        time_tokens=events.time_tokens,
    )
