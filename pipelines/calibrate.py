"""`kvtrace calibrate`: per policy, the cache capacity whose simulated per-request hits best
match the cached tokens the serving engine measured (the private measured file of the trace).

`lru` is fitted over every capacity at once from one stack-distance pass; the policies that
replay (transforms/cache/policies.py) are fitted over a log-spaced grid of capacities.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvtrace.transforms.cache import plots
from kvtrace.transforms.cache.cache_trace import CacheTrace, causal_rows, read_cache_trace
from kvtrace.transforms.cache.calibrate import (
    Fit,
    Measured,
    fit_lru,
    fit_replays,
    measured_summary,
    verdict,
)
from kvtrace.transforms.cache.policies import row_hits
from kvtrace.transforms.cache.stack_distance import StackDistances, stack_distances
from kvtrace.transforms.read.measured import check_totals, read_measured, trace_manifest
from kvtrace.transforms.read.trace_inputs import pin_of
from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.stats.trace_stats import row_problems
from kvtrace.transforms.trace_format import DEFAULT_BLOCK_SIZE, MIN_MEASURED_REQUESTS, STATS
from kvtrace.transforms.write.publish import file_output
from kvtrace.transforms.write.totals import MEASURED_COUNTS

_LOG = logging.getLogger("kvtrace")

DEFINITIONS = {
    "measured_hit_rate": "the engine's cached tokens over the prompt tokens of the requests "
    "whose log carried a count",
    "simulated_hit_rate": "the policy's at the best capacity, over the same requests: per "
    "request the real tokens of the longest prefix of its blocks cached on arrival",
    "mae_tokens": "mean over those requests of |simulated - measured| cached tokens",
    "capacity_tokens": "the smallest capacity of the least error (lru: to capacity_tokens_upto "
    "the error is the same; null: every larger capacity)",
}


@dataclass(frozen=True)
class CalibrateConfig:
    inputs: tuple[str, ...]
    measured: str
    block_size: int = DEFAULT_BLOCK_SIZE
    policies: tuple[str, ...] = ("lru",)
    plot: str | None = None
    grid_points: int = 32  # capacities replayed per policy other than lru
    kv_bytes_per_token: int | None = None


def run_calibrate(
    config: CalibrateConfig, accept: Callable[[int, dict], None] = lambda rows, problems: None
) -> dict:
    """The report (JSON-ready); the plot written once accept (rows, problems) has passed."""
    trace, cache = read_cache_trace(config.inputs, config.block_size)
    problems = row_problems(trace, config.block_size)
    measured = trace_measured(trace, config.measured)
    del trace
    report, fits = calibration(cache, stack_distances(cache), measured, config)
    accept(cache.rows, problems)
    if config.plot:
        with file_output(config.plot, overwrite=True, private=True) as output:  # of measured
            output.write(fits_png(fits, config.kv_bytes_per_token))
    return {"rows": cache.rows, "problems": problems, **report}


def trace_measured(trace: Trace, path: str) -> np.ndarray:
    """The measured file's counts per row of the trace, in causal order (NOT_MEASURED where
    none): its rows are keyed by trace shard, the trace's files the shards of the output its
    header names, in order."""
    manifest = trace_manifest(path, trace.files)
    shard_rows = np.bincount(trace.file_index, minlength=len(trace.files))
    measured = read_measured(path, shard_rows.tolist(), manifest)
    check_totals(path, measured, trace.input_length, _published_counts(trace.files[0]))
    return measured[causal_rows(trace)]


def _published_counts(shard: str) -> tuple[int, int, int] | None:
    """The measured aggregate's counts in stats.json of the output the shard is of (its bytes
    the ones the manifest lists), or None where it publishes none."""
    from kvtrace.transforms.stats.audit import MAX_STATS_BYTES

    output = pin_of(shard)
    assert output is not None  # trace_manifest refuses loose files
    if STATS not in output.sha256:  # its manifest lists none: no aggregate either
        return None
    with output.open(STATS) as handle:
        raw = handle.read(MAX_STATS_BYTES + 1)
    output.check(STATS, hashlib.sha256(raw).hexdigest())
    measured = json.loads(raw).get("measured")
    return None if measured is None else tuple(measured[name] for name in MEASURED_COUNTS)


def calibration(
    cache: CacheTrace, distances: StackDistances, measured: np.ndarray, config: CalibrateConfig
) -> tuple[dict, dict[str, Fit]]:
    """(the numbers, each policy's fit) of fitting each policy to the measured counts."""
    started = time.perf_counter()
    summary = measured_summary(distances, measured)
    fits = {"lru": fit_lru(distances, measured)} if "lru" in config.policies else {}
    grid = [0, *distances.curve(config.grid_points)[0].tolist()]
    for policy in config.policies:
        if policy != "lru":
            hits = row_hits(cache, policy, grid)
            fits[policy] = fit_replays(policy, grid, hits, measured, summary.prompt_tokens)
    _LOG.info("calibrated %s in %.1f s", ", ".join(fits), time.perf_counter() - started)
    report = {
        "block_size": config.block_size,
        "measured": _measured_report(summary),
        "policies": {p: _fit_report(f, summary, config.block_size) for p, f in fits.items()},
        "definitions": DEFINITIONS,
    }
    return report, fits


def fits_png(fits: dict[str, Fit], kv_bytes_per_token: int | None) -> bytes:
    return plots.calibration_png(
        {p: (f.curve_capacity_tokens, f.curve_mae_tokens) for p, f in fits.items()},
        {p: f.capacity_tokens for p, f in fits.items()},
        kv_bytes_per_token,
    )


def below_floor_note(requests: int) -> str | None:
    """What an aggregate of fewer requests than anonymize would publish is (None: not fewer):
    said in every output that carries it, which is owner-only as the measured file is."""
    if requests >= MIN_MEASURED_REQUESTS:
        return None
    return (
        f"over fewer than {MIN_MEASURED_REQUESTS} requests it all but gives each one's private "
        f"count (anonymize publishes none so small): keep it private like the measured file"
    )


def _measured_report(summary: Measured) -> dict:
    note = below_floor_note(summary.requests)
    return {
        **({"note": note} if note else {}),
        "requests": summary.requests,
        "cached_tokens": summary.cached_tokens,
        "prompt_tokens": summary.prompt_tokens,
        "hit_rate": summary.hit_rate,
        "infinite_cache_hit_rate": summary.ceiling_hit_rate,
        "requests_above_infinite_cache": summary.above_ceiling,
        "common_divisor_tokens": summary.common_divisor,
    }


def _fit_report(fit: Fit, summary: Measured, block_size: int) -> dict:
    return {
        "capacity_tokens": fit.capacity_tokens,
        "capacity_tokens_upto": fit.capacity_tokens_upto,
        "mae_tokens": fit.mae_tokens,
        "simulated_hit_rate": fit.simulated_hit_rate,
        "hit_rate_difference": summary.hit_rate - fit.simulated_hit_rate,
        "verdict": verdict(summary, fit, block_size),
    }
