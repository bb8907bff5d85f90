"""`kvtrace simulate`: hit rate against cache capacity per policy, and a two-tier sizing grid.

`lru` comes from one stack-distance pass for every capacity at once; the other policies replay
the trace once per capacity (transforms/cache/policies.py and queue_policies.py: sequential by
nature).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from kvtrace.transforms.cache.cache_trace import CacheTrace, read_cache_trace
from kvtrace.transforms.cache.capacity import Capacity
from kvtrace.transforms.cache.decode_cache import read_output_ids, with_decode_cache
from kvtrace.transforms.cache.policies import hit_rates
from kvtrace.transforms.cache.policy_names import POLICIES
from kvtrace.transforms.cache.stack_distance import StackDistances, infinite_cache, stack_distances
from kvtrace.transforms.stats.trace_stats import row_problems
from kvtrace.transforms.trace_format import DEFAULT_BLOCK_SIZE

_LOG = logging.getLogger("kvtrace")

DEFINITIONS = {
    "capacity": "tokens of KV cache; every block (the partial last one too) takes a page of "
    "block size tokens",
    "hit_rate": "token-weighted: per request, the real tokens of the longest prefix of its "
    "blocks cached on arrival, over all prompt tokens (never above 1); only rows "
    "after the first warmup_fraction of rows count (the others fill the cache)",
    "lru": "the request's blocks touched in order once its hit is counted (as by every "
    "policy); least recently used evicted",
    "prefix-lru": "the same, evicting the least recently used leaf (no cached descendant), "
    "never a block of the running request",
    "fifo": "first inserted evicted first; hits do not refresh",
    "belady": "furthest next use evicted first (offline optimum; deepest first on a tie); "
    "a block needed later than every cached one is not cached",
    "s3-fifo": "S3-FIFO: a small FIFO (10% of pages) whose blocks hit twice move to a main FIFO "
    "(reinsertion while 2-bit counts last), the others leave their ids in a ghost FIFO from "
    "which a return goes to main",
    "sieve": "SIEVE: one FIFO with a visited bit; a hand walking from old to new evicts the first "
    "block not visited since it last passed",
    "arc": "ARC: recency and frequency LRU lists with ghost lists steering their split",
    "tinylfu": "W-TinyLFU: a 1% window LRU, then a segmented LRU admitting a block only if a "
    "count-min sketch saw it more often than the block it would evict",
    "two_tier": "exclusive LRU tiers: GPU evictions are demoted to tier 2, tier-2 hits "
    "promoted; hit rates split by the tier that served them",
}


@dataclass(frozen=True)
class SimulateConfig:
    inputs: tuple[str, ...]
    capacities: tuple[Capacity, ...]
    policies: tuple[str, ...] = POLICIES
    block_size: int = DEFAULT_BLOCK_SIZE
    kv_bytes_per_token: int | None = None
    tier2_capacities: tuple[Capacity, ...] = ()
    warmup_fraction: float = 0.0  # rows that only fill the cache (kvcache-simulator: 0.5)
    decode_cache: bool = False  # replay output_hash_ids: blocks cached after decoding


def run_simulate(config: SimulateConfig) -> dict:
    trace, cache = read_cache_trace(config.inputs, config.block_size)
    problems = row_problems(trace, config.block_size)
    rows = cache.rows
    if config.decode_cache:
        cache = with_decode_cache(trace, read_output_ids(config.inputs, trace), config.block_size)
    del trace  # free the trace's columns: the cache's view is all the replays read
    distances = stack_distances(cache)
    report = {
        "block_size": config.block_size,
        "kv_bytes_per_token": config.kv_bytes_per_token,
        "rows": rows,
        "decode_cache": config.decode_cache,
        "prompt_tokens": distances.total_tokens,
        "infinite_cache": infinite_cache(distances),
        "definitions": {
            k: v
            for k, v in DEFINITIONS.items()
            if k in config.policies
            or k in ("capacity", "hit_rate")
            or (k == "two_tier" and config.tier2_capacities)
        },
        "warmup_fraction": config.warmup_fraction,
        "policies": {
            policy: policy_curve(
                cache, distances, policy, config.capacities, config.warmup_fraction
            )
            for policy in config.policies
        },
        "problems": problems,
    }
    if config.tier2_capacities:
        report["two_tier"] = two_tier_grid(
            distances, config.capacities, config.tier2_capacities, config.warmup_fraction
        )
    return report


def policy_curve(
    cache: CacheTrace,
    distances: StackDistances,
    policy: str,
    capacities: tuple[Capacity, ...],
    warmup_fraction: float = 0.0,
) -> list[dict]:
    started = time.perf_counter()
    if policy == "lru":  # a stack algorithm: every capacity from one pass
        rates = distances.hit_rates(
            np.array([c.tokens for c in capacities]), warmup_fraction=warmup_fraction
        )
    else:
        finished = []

        def done(_: int) -> None:
            finished.append(1)
            _LOG.info("%s: %d of %d capacities replayed", policy, len(finished), len(capacities))

        rates = hit_rates(cache, policy, [c.tokens for c in capacities], warmup_fraction, done)
    _LOG.info("%s done in %.1f s", policy, time.perf_counter() - started)
    return [
        _point(capacity, {"hit_rate": float(rate)}) for capacity, rate in zip(capacities, rates)
    ]


def two_tier_grid(
    distances: StackDistances,
    gpu: tuple[Capacity, ...],
    tier2: tuple[Capacity, ...],
    warmup_fraction: float = 0.0,
) -> list[dict]:
    grid = []
    for first in gpu:
        for second in tier2:
            from_gpu, from_tier2 = distances.two_tier(first.tokens, second.tokens, warmup_fraction)
            point = _point(
                first,
                {
                    "tier2_capacity_tokens": second.tokens,
                    "hit_rate": from_gpu + from_tier2,
                    "gpu_hit_rate": from_gpu,
                    "tier2_hit_rate": from_tier2,
                },
            )
            if second.bytes is not None:
                point["tier2_capacity_bytes"] = second.bytes
            grid.append(point)
    return grid


def _point(capacity: Capacity, values: dict) -> dict:
    point: dict = {"capacity_tokens": capacity.tokens}
    if capacity.bytes is not None:
        point["capacity_bytes"] = capacity.bytes
    return {**point, **values}
