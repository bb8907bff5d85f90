"""Exact LRU stack distances in one O(N log N) pass, and every LRU capacity's hit rate from them.

A KV cache is paged: every block, the partial last one of a request too, takes one page of
block_size tokens, so a cache of C tokens holds C // block_size blocks. LRU is a stack
algorithm: a block is cached at capacity C exactly when its stack distance (1 + the distinct
blocks used since its last use, in pages; x block_size in tokens) fits in C. A Fenwick tree
over use times, marking the time each block was last used, counts those in O(log N).

Distances are taken at the start of each request, before any of its blocks are touched: the
`lru` policy's hit is the longest cached prefix at that moment, which at capacity C is the
number of leading blocks whose running maximum distance is at most C. So one pass gives the
`lru` hit rate of every capacity (prefix_max), and the block-LRU rate too (every cached block
counts, prefix or not: distance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

from kvtrace.transforms.cache.cache_trace import CacheTrace

COLD = np.iinfo(np.int32).max  # the distance of a first use: no capacity holds it


@dataclass(frozen=True)
class StackDistances:
    distance: np.ndarray  # int32 pages per block occurrence (COLD for first uses), causal order
    prefix_max: np.ndarray  # int32: running maximum of distance within each request
    tokens: np.ndarray  # int32 real tokens of each occurrence: what a hit saves
    row_starts: np.ndarray  # the trace's: row r's blocks are [row_starts[r], row_starts[r + 1])
    block_size: int

    @property
    def total_tokens(self) -> int:
        return int(self.tokens.sum(dtype=np.int64))

    def hit_rates(
        self, capacities: np.ndarray, prefix: bool = True, warmup_fraction: float = 0.0
    ) -> np.ndarray:
        """Token-weighted hit rate at each capacity (tokens): `lru`'s (longest cached prefix)
        or, with prefix=False, block LRU's (every cached block counts); counting only rows
        after the first warmup_fraction of rows (earlier ones still fill the cache)."""
        cumulative = self._hits_within(prefix, warmup_fraction)
        pages = np.asarray(capacities, dtype=np.int64) // self.block_size
        total = self.tokens[self.first_measured(warmup_fraction) :].sum()
        hits = cumulative[np.clip(pages, 0, len(cumulative) - 1)]
        return hits / total if total else np.zeros(len(pages))

    def _hits_within(self, prefix: bool, warmup_fraction: float) -> np.ndarray:
        """Tokens of hits at each capacity in pages, 0..the largest distance: a histogram of
        distances, summed up (no sort: distances are below the distinct blocks)."""
        first = self.first_measured(warmup_fraction)
        by = (self.prefix_max if prefix else self.distance)[first:]
        warm = by != COLD
        per_distance = np.bincount(by[warm], weights=self.tokens[first:][warm])
        return np.cumsum(per_distance) if len(per_distance) else np.zeros(1)

    def first_measured(self, warmup_fraction: float) -> int:
        """The first block of the rows that count after a warm-up of that share of rows."""
        return int(self.row_starts[math.floor(warmup_fraction * (len(self.row_starts) - 1))])

    def infinite_hit_rate(self, warmup_fraction: float = 0.0) -> float:
        """Token-weighted hit rate of an unbounded cache, after a warm-up as in hit_rates."""
        first = self.first_measured(warmup_fraction)
        tokens = self.tokens[first:]
        return (
            float(tokens[self.prefix_max[first:] != COLD].sum() / tokens.sum())
            if tokens.sum()
            else 0.0
        )

    def two_tier(
        self, gpu_tokens: int, tier2_tokens: int, warmup_fraction: float = 0.0
    ) -> tuple[float, float]:
        """(hit rate served by the GPU, by tier 2) of a GPU cache with a CPU/SSD tier behind it:
        blocks the GPU evicts are demoted to tier 2 (LRU), a tier-2 hit is promoted back. That
        is one LRU stack whose top gpu pages are on the GPU and the next tier2 pages below."""
        first = self.first_measured(warmup_fraction)
        tokens = self.tokens[first:]
        total = tokens.sum()
        if not total:
            return 0.0, 0.0
        gpu_pages = gpu_tokens // self.block_size
        hit = self.prefix_max[first:] <= gpu_pages + tier2_tokens // self.block_size
        from_gpu = hit & (self.distance[first:] <= gpu_pages)
        return float(tokens[from_gpu].sum() / total), float(tokens[hit & ~from_gpu].sum() / total)

    def curve(self, points: int = 300, prefix: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(capacity tokens, hit rate) at log-spaced capacities spanning the distances."""
        by = self.prefix_max if prefix else self.distance
        warm = by[by != COLD]
        if not len(warm):
            return np.zeros(0), np.zeros(0)
        pages = np.unique(np.geomspace(max(1, warm.min()), warm.max(), points).round())
        capacities = pages.astype(np.int64) * self.block_size
        return capacities, self.hit_rates(capacities, prefix)


def stack_distances(trace: CacheTrace) -> StackDistances:
    distance = _distances(trace.block, trace.row_starts, trace.distinct_blocks)
    prefix_max = _running_max_per_row(distance, trace.row_starts)
    return StackDistances(distance, prefix_max, trace.tokens, trace.row_starts, trace.block_size)


@numba.njit(cache=True)
def _distances(block: np.ndarray, row_starts: np.ndarray, distinct: int) -> np.ndarray:
    uses = len(block)
    tree = np.zeros(uses + 1, dtype=np.int32)  # Fenwick tree over use times 1..uses
    last_use = np.zeros(distinct, dtype=np.int32)  # 0: never used (traces hold < 2^31 blocks)
    distance = np.empty(uses, dtype=np.int32)
    seen = 0  # distinct blocks used so far: the tree's total
    now = 0
    for row in range(len(row_starts) - 1):
        start, end = row_starts[row], row_starts[row + 1]
        for i in range(start, end):  # at the request's start, before touching
            b = block[i]
            if last_use[b] == 0:
                distance[i] = COLD
            else:
                at, before = last_use[b], 0  # blocks last used at times <= b's last use
                while at > 0:
                    before += tree[at]
                    at -= at & -at
                distance[i] = seen - before + 1
        for i in range(start, end):  # then every block touched, in order
            b = block[i]
            at = last_use[b]
            if at != 0:
                while at <= uses:
                    tree[at] -= 1
                    at += at & -at
            else:
                seen += 1
            now += 1
            at = now
            while at <= uses:
                tree[at] += 1
                at += at & -at
            last_use[b] = now
    return distance


@numba.njit(cache=True)
def _running_max_per_row(values: np.ndarray, row_starts: np.ndarray) -> np.ndarray:
    out = np.empty_like(values)
    for row in range(len(row_starts) - 1):
        running = values.dtype.type(0)
        for i in range(row_starts[row], row_starts[row + 1]):
            running = max(running, values[i])
            out[i] = running
    return out


def infinite_cache(distances: StackDistances) -> dict[str, float]:
    """The unbounded cache's token-weighted hit rates: the ceiling every capacity approaches."""
    return {
        "token_weighted": distances.infinite_hit_rate(),
        "token_weighted_last_50pct_of_rows": distances.infinite_hit_rate(0.5),
    }
