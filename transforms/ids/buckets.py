"""Time buckets: how a global order is cut into pieces one worker can sort.

Dense ids and output shards both need a global order over all requests. Instead of one worker
sorting everything, elements go to time buckets; a small side input of per-bucket counts gives
each bucket its starting offset, and each bucket is sorted on its own.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

# One minute of traffic: small enough for one worker to sort even at tens of thousands of
# requests per second, large enough that a month of logs needs only ~45k buckets in a side input.
BUCKET_MS = 60_000


def buckets_of(timestamps_ms: np.ndarray) -> np.ndarray:
    """Each timestamp's bucket (whole or fractional ms: traces may carry either)."""
    return np.floor_divide(timestamps_ms, BUCKET_MS).astype(np.int64, copy=False)


def first_offsets(sizes: Mapping[int, int], start: int = 0) -> dict[int, int]:
    """Each bucket's offset: start plus the sizes of all earlier buckets."""
    offsets, total = {}, start
    for bucket in sorted(sizes):
        offsets[bucket] = total
        total += sizes[bucket]
    return offsets


def plan_shards(buckets: np.ndarray, sizes: np.ndarray, max_per_shard: int) -> np.ndarray:
    """The first bucket of each shard: consecutive buckets (distinct, ascending; sizes >= 1)
    grouped into shards of at most max_per_shard (a bucket never splits; a larger one is a
    shard of its own).

    Depends only on the sizes, so the same data gives the same files whatever the worker count.
    One search per shard, not a step per bucket: the gate plans a whole trace's buckets.
    """
    ends = np.cumsum(sizes)
    firsts, first = [], 0
    while first < len(buckets):
        firsts.append(first)
        # The first bucket that would overfill this shard starts the next (never this one).
        limit = ends[first] - sizes[first] + max_per_shard
        first = max(first + 1, int(np.searchsorted(ends, limit, side="right")))
    return np.asarray(buckets, dtype=np.int64)[firsts]


def shards_of(buckets: np.ndarray, plan: np.ndarray) -> np.ndarray:
    """Each bucket's shard in a plan (plan_shards): the last shard starting at or before it."""
    return np.searchsorted(plan, buckets, side="right").astype(np.int64) - 1
