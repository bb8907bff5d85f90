"""`kvtrace reuse`: the reuse-interval CCDF, exact LRU stack distances and reuse times.

One machine, numpy and one compiled pass (transforms/cache): the CCDF and the reuse times are
vectorised; stack distances are an O(N log N) Fenwick-tree pass.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from transforms import storage
from transforms.cache import plots
from transforms.cache.cache_trace import read_cache_trace
from transforms.cache.reuse import ccdf_at, ccdf_curve, reuse_events, reuse_time_histogram
from transforms.cache.stack_distance import infinite_cache, stack_distances
from transforms.stats.trace_stats import row_problems

_LOG = logging.getLogger("kvtrace")

DEFINITIONS = {
    "token_clock": "rows in (timestamp, file) order; each block advances the clock by its real "
                   "tokens (the last block of a row by its remainder)",
    "reuse_event": "an occurrence of a block (an exact prefix) seen in an earlier request",
    "interval_tokens": "clock at the occurrence's start minus clock at the end of the block's "
                       "previous occurrence",
    "ccdf": "y(x) = tokens of reuse events with interval > x / all prompt tokens",
    "lru_hit_rate": "token-weighted; per request the longest prefix cached in an LRU cache of "
                    "C tokens (pages of block size) on arrival, then its blocks touched in order",
    "block_lru_hit_rate": "token-weighted; every block cached on arrival counts, prefix or not",
    "reuse_time": "seconds between the timestamps of a reuse event's request and the previous "
                  "use's request",
}


@dataclass(frozen=True)
class ReuseConfig:
    inputs: tuple[str, ...]
    block_size: int = 512
    gpu_kv_cache_size: int | None = None
    plot: str | None = None  # PNG path (any Beam filesystem)


def run_reuse(config: ReuseConfig) -> dict:
    """The report (JSON-ready); writes the plot when config.plot is set."""
    trace, cache = read_cache_trace(config.inputs, config.block_size)
    problems = row_problems(trace, config.block_size)
    del trace  # the cache's view is all that is left to read: free the trace's columns
    started = time.perf_counter()
    events = reuse_events(cache)
    x, y = ccdf_curve(events)
    distances = stack_distances(cache)
    capacities, lru = distances.curve()
    block_lru = distances.hit_rates(capacities, prefix=False)
    _LOG.info("reuse intervals and stack distances in %.1f s", time.perf_counter() - started)
    reuse_time = reuse_time_histogram(events)
    report = {
        "block_size": config.block_size,
        "rows": cache.rows,
        "blocks": len(cache.block),
        "prompt_tokens": events.total_tokens,
        "infinite_cache": infinite_cache(distances),
        "definitions": DEFINITIONS,
        "reused_token_share": float(events.tokens.sum() / events.total_tokens)
                              if events.total_tokens else 0.0,
        "ccdf": {"interval_tokens": x.tolist(), "share_above": y.tolist()},
        "lru_stack": {"capacity_tokens": capacities.tolist(), "lru_hit_rate": lru.tolist(),
                      "block_lru_hit_rate": block_lru.tolist()},
        "reuse_time": reuse_time,
        "problems": problems,
    }
    at_gpu = None
    if config.gpu_kv_cache_size:
        at_gpu = ccdf_at(events, config.gpu_kv_cache_size)
        report["gpu_kv_cache_size"] = config.gpu_kv_cache_size
        report["ccdf_at_gpu_kv_cache_size"] = at_gpu
    if config.plot:
        png = plots.reuse_figure(x, y, config.gpu_kv_cache_size, at_gpu, capacities, lru,
                                 block_lru, reuse_time)
        with storage.create(config.plot) as handle:
            handle.write(png)
    return report
