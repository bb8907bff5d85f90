"""`kvtrace reuse`: the reuse-interval CCDF, exact LRU stack distances and reuse times.

One machine, numpy and one compiled pass (transforms/cache): the CCDF and the reuse times are
vectorised; stack distances are an O(N log N) Fenwick-tree pass.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvtrace.transforms.cache import plots
from kvtrace.transforms.cache.cache_trace import read_cache_trace
from kvtrace.transforms.cache.reuse import ccdf_at, ccdf_curve, reuse_events, reuse_time_histogram
from kvtrace.transforms.cache.reuse_report import reuse_report
from kvtrace.transforms.cache.stack_distance import infinite_cache, stack_distances
from kvtrace.transforms.stats.trace_stats import row_problems
from kvtrace.transforms.storage import is_url
from kvtrace.transforms.trace_format import DEFAULT_BLOCK_SIZE
from kvtrace.transforms.write.publish import OutputRefused, StagedFile, check_file, file_output

_LOG = logging.getLogger("kvtrace")


@dataclass(frozen=True)
class ReuseConfig:
    inputs: tuple[str, ...]
    block_size: int = DEFAULT_BLOCK_SIZE
    gpu_kv_cache_size: int | None = None
    plot: str | None = None  # PNG path (any Beam filesystem)
    kv_bytes_per_token: int | None = None  # the model's: the plot's capacities in GiB


def check_plot(config: ReuseConfig) -> None:
    """The plot's location, before any work: a plain file to replace whole, never an input."""
    if not config.plot:
        return
    check_file(config.plot, overwrite=True)
    if not is_url(config.plot) and os.path.abspath(config.plot) in {
        os.path.abspath(path) for path in config.inputs if not is_url(path)
    }:
        raise OutputRefused(f"--output {config.plot} is one of the traces read")


def write_plot(path: str, png: bytes, report: StagedFile | None) -> None:
    """The plot, staged and renamed into place (the one write protocol), the report with it."""
    with file_output(path, report=report) as output:
        output.write(png)


def run_reuse(
    config: ReuseConfig,
    report_file: StagedFile | None = None,
    accept: Callable[[dict], None] = lambda report: None,
) -> dict:
    """The report (JSON-ready); writes the plot when config.plot is set, once accept (the
    command's judgement of the report, which may stage it into report_file) has passed."""
    check_plot(config)
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
    at_gpu = ccdf_at(events, config.gpu_kv_cache_size) if config.gpu_kv_cache_size else None
    stack = {
        "blocks": len(cache.block),
        "infinite_cache": infinite_cache(distances),
        "lru_stack": {
            "capacity_tokens": capacities.tolist(),
            "lru_hit_rate": lru.tolist(),
            "block_lru_hit_rate": block_lru.tolist(),
        },
    }
    report = reuse_report(
        config.block_size,
        cache.rows,
        events.total_tokens,
        int(events.tokens.sum()),
        (x, y),
        reuse_time,
        problems,
        config.gpu_kv_cache_size,
        at_gpu,
        stack,
    )
    accept(report)
    if config.plot:
        png = plots.reuse_figure(
            x,
            y,
            config.gpu_kv_cache_size,
            at_gpu,
            capacities,
            lru,
            block_lru,
            reuse_time,
            config.kv_bytes_per_token,
        )
        write_plot(config.plot, png, report_file)
    return report
