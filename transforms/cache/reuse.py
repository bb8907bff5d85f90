"""Reuse intervals on a token clock (seed 003's question: what could a CPU or SSD tier hold?).

The clock: blocks in causal order, each advancing it by its real tokens. A reuse event is an
occurrence of a block seen in an earlier request (a prefix occurs once per request, so every
repeat is across requests); its interval is the clock at the occurrence's start minus the clock
at the end of the block's previous occurrence: the tokens that went through the cache between
the two uses. The CCDF y(x) is the share of all prompt tokens that are reused with an interval
above x: what a GPU cache of x tokens cannot keep, the most an offload tier could serve.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from transforms.cache.cache_trace import CacheTrace

# Reuse time buckets in seconds, as people size offload tiers: within a turn, a conversation,
# a session, an hour, beyond.
REUSE_TIME_EDGES_S = (0.0, 1.0, 10.0, 60.0, 600.0, 3600.0, float("inf"))
REUSE_TIME_LABELS = ("<1 s", "1-10 s", "10 s-1 min", "1-10 min", "10 min-1 h", "1 h+")


@dataclass(frozen=True)
class ReuseEvents:
    interval_tokens: np.ndarray  # int64, sorted ascending
    tokens: np.ndarray  # int64 tokens of each event, in the same order
    seconds: np.ndarray  # float64 time since the previous use, in the same order
    total_tokens: int  # every prompt token of the trace (the CCDF's denominator)


def reuse_events(trace: CacheTrace) -> ReuseEvents:
    clock_end = np.cumsum(trace.tokens, dtype=np.int64)
    by_block = np.argsort(trace.block, kind="stable")  # each block's occurrences in causal order
    repeat = np.flatnonzero(trace.block[by_block][1:] == trace.block[by_block][:-1])
    current, previous = by_block[repeat + 1], by_block[repeat]
    tokens = trace.tokens[current].astype(np.int64)
    interval = clock_end[current] - tokens - clock_end[previous]
    rows = trace.row_of_block()
    seconds = (trace.timestamp_ms[rows[current]] - trace.timestamp_ms[rows[previous]]) / 1000.0
    order = np.argsort(interval, kind="stable")
    return ReuseEvents(interval[order], tokens[order], seconds[order],
                       int(clock_end[-1]) if len(clock_end) else 0)


def ccdf_at(events: ReuseEvents, x: float) -> float:
    """Share of all prompt tokens reused with an interval above x tokens."""
    if not events.total_tokens:
        return 0.0
    above = np.searchsorted(events.interval_tokens, x, side="right")
    return float(events.tokens[above:].sum() / events.total_tokens)


def ccdf_curve(events: ReuseEvents, points: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) at up to `points` log-spaced intervals spanning the data, for plotting."""
    positive = events.interval_tokens[events.interval_tokens > 0]
    if not len(positive) or not events.total_tokens:
        return np.zeros(0), np.zeros(0)
    x = np.unique(np.geomspace(positive[0], positive[-1], points).round())
    above = np.searchsorted(events.interval_tokens, x, side="right")
    suffix = np.concatenate([np.cumsum(events.tokens[::-1])[::-1], [0]])
    return x, suffix[above] / events.total_tokens


def reuse_time_histogram(events: ReuseEvents) -> list[dict]:
    """Reused tokens by time since the previous use, as shares of all reused tokens."""
    reused = int(events.tokens.sum())
    bucket = np.searchsorted(REUSE_TIME_EDGES_S[1:-1], events.seconds, side="right")
    tokens = np.bincount(bucket, weights=events.tokens, minlength=len(REUSE_TIME_LABELS))
    return [{"bucket": label, "tokens": int(t), "share": float(t / reused) if reused else 0.0}
            for label, t in zip(REUSE_TIME_LABELS, tokens)]
