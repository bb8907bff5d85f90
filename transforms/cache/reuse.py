"""Reuse intervals on a token clock (what could a CPU or SSD tier behind the GPU hold?).

The clock: blocks in causal order, each advancing it by its real tokens. A reuse event is an
occurrence of a block seen in an earlier request (a prefix occurs once per request, so every
repeat is across requests); its interval is the clock at the occurrence's start minus the clock
at the end of the block's previous occurrence: the tokens that went through the cache between
the two uses. The CCDF y(x) is the share of all prompt tokens that are reused with an interval
above x: what a GPU cache of x tokens cannot keep, the most an offload tier could serve. It is
reported at the edges of bins 32 per doubling of the interval (binned_ccdf), exact there, from
sums any shard of the trace's prefixes can add to (reuse_shards.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from kvtrace.transforms.cache.cache_trace import CacheTrace

# Reuse time buckets in seconds, as people size offload tiers: within a turn, a conversation,
# a session, an hour, beyond.
REUSE_TIME_EDGES_S = (0.0, 1.0, 10.0, 60.0, 600.0, 3600.0, float("inf"))
REUSE_TIME_LABELS = ("<1 s", "1-10 s", "10 s-1 min", "1-10 min", "10 min-1 h", "1 h+")


# Interval bins of the CCDF: [0, 1), then integer edges at 2^(k/32) up to 2^48 tokens: ~3% wide.
INTERVAL_EDGES = np.unique(
    np.concatenate([[0], np.ceil(2.0 ** (np.arange(48 * 32 + 1) / 32))])
).astype(np.int64)

# Events are sorted as one int64 each, interval << TOKEN_BITS | tokens: no index array, half the
# memory of an argsort (a 10M-row trace has ~2e8 reuse events). Blocks hold < 2^21 tokens and a
# trace < 2^42 (4e12) tokens.
TOKEN_BITS = 21


@dataclass(frozen=True)
class ReuseEvents:
    interval_tokens: np.ndarray  # int64, sorted ascending
    tokens: np.ndarray  # int64 tokens of each event, in the same order
    time_tokens: np.ndarray  # int64 reused tokens per REUSE_TIME_LABELS bucket
    total_tokens: int  # every prompt token of the trace (the CCDF's denominator)


def reuse_events(trace: CacheTrace) -> ReuseEvents:
    """Every reuse event of a trace (its blocks in causal order, one after another)."""
    return clocked_reuse_events(
        trace.block, trace.tokens, trace.row_starts, trace.timestamp_ms, trace.distinct_blocks
    )


def clocked_reuse_events(
    block: np.ndarray,
    tokens: np.ndarray,
    row_starts: np.ndarray,
    timestamp_ms: np.ndarray,
    distinct: int,
    start: np.ndarray | None = None,
) -> ReuseEvents:
    """The reuse events of block occurrences in clock order (block: dense ids below distinct;
    row r's occurrences are [row_starts[r], row_starts[r + 1]), at timestamp_ms[r]). start is
    the clock at each occurrence's start, None when they follow one another (a whole trace);
    given, they may be any set of prefixes' occurrences (a prefix shard), as every event depends
    only on its prefix's own occurrences. One pass, remembering each block's last use: no sort
    of the blocks."""
    total = int(tokens.sum(dtype=np.int64))
    clock_end = total if start is None else int((start + tokens).max(initial=0))
    if clock_end >= 1 << (63 - TOKEN_BITS):
        raise ValueError(
            f"a trace of {clock_end:,} prompt tokens is beyond the reuse analysis "
            f"(2^{63 - TOKEN_BITS}); split it"
        )
    packed, time_tokens = _events(
        block,
        tokens,
        row_starts,
        timestamp_ms,
        distinct,
        np.array(REUSE_TIME_EDGES_S[1:-1]) * 1000.0,
        np.zeros(0, np.int64) if start is None else start,
    )
    packed.sort()
    return ReuseEvents(packed >> TOKEN_BITS, packed & ((1 << TOKEN_BITS) - 1), time_tokens, total)


@numba.njit(cache=True)
def _events(block, tokens, row_starts, timestamp_ms, distinct, time_edges_ms, start):
    last_end = np.full(distinct, -1, dtype=np.int64)  # clock at the end of the last use
    last_row = np.zeros(distinct, dtype=np.int32)
    packed = np.empty(len(block), dtype=np.int64)
    time_tokens = np.zeros(len(time_edges_ms) + 1, dtype=np.int64)
    contiguous = len(start) == 0
    events, clock = 0, 0
    for row in range(len(row_starts) - 1):
        for i in range(row_starts[row], row_starts[row + 1]):
            b = block[i]
            begins = clock if contiguous else start[i]
            if last_end[b] >= 0:  # a prefix occurs once per request: an earlier one
                packed[events] = ((begins - last_end[b]) << TOKEN_BITS) | tokens[i]
                events += 1
                waited = timestamp_ms[row] - timestamp_ms[last_row[b]]
                time_tokens[np.searchsorted(time_edges_ms, waited, side="right")] += tokens[i]
            clock += tokens[i]
            last_end[b] = begins + tokens[i]
            last_row[b] = row
    return packed[:events].copy(), time_tokens


def ccdf_at(events: ReuseEvents, x: float) -> float:
    """Share of all prompt tokens reused with an interval above x tokens."""
    if not events.total_tokens:
        return 0.0
    above = np.searchsorted(events.interval_tokens, x, side="right")
    return float(events.tokens[above:].sum() / events.total_tokens)


def interval_bins(events: ReuseEvents) -> np.ndarray:
    """Reused tokens per interval bin (INTERVAL_EDGES[b] <= interval < INTERVAL_EDGES[b + 1]):
    sums, so the bins of shards of a trace's prefixes add up to the whole trace's."""
    reused = np.concatenate([np.zeros(1, np.int64), np.cumsum(events.tokens, dtype=np.int64)])
    starts = np.searchsorted(events.interval_tokens, INTERVAL_EDGES, side="left")
    return np.diff(reused[starts], append=reused[-1])


def ccdf_curve(events: ReuseEvents) -> tuple[np.ndarray, np.ndarray]:
    """The CCDF of a whole trace, as binned_ccdf samples it."""
    return binned_ccdf(interval_bins(events), events.total_tokens)


def binned_ccdf(bins: np.ndarray, total_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) at every bin edge x = INTERVAL_EDGES[b] - 1 from the first bin holding tokens (the
    first edge above 0) to the last, exact there: the one sampling of the CCDF, whether the bins
    are a whole trace's (the local engine) or merged from shards (Beam), so both report the same
    points."""
    above = np.cumsum(bins[::-1])[::-1]  # tokens with interval >= INTERVAL_EDGES[b]
    used = np.flatnonzero(bins)
    if not len(used) or not total_tokens:
        return np.zeros(0, np.int64), np.zeros(0)
    b = np.arange(max(1, used[0]), used[-1] + 1)
    return INTERVAL_EDGES[b] - 1, above[b] / total_tokens


def reuse_time_histogram(events: ReuseEvents) -> list[dict]:
    """Reused tokens by time since the previous use, as shares of all reused tokens."""
    reused = int(events.time_tokens.sum())
    return [
        {"bucket": label, "tokens": int(t), "share": float(t / reused) if reused else 0.0}
        for label, t in zip(REUSE_TIME_LABELS, events.time_tokens.tolist())
    ]
