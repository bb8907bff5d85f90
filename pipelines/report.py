"""`kvtrace report`: one self-contained HTML page of a trace: a headline (duration, rate, lengths,
hit rates, what a GPU cache and an offload tier would do), lengths, request rate, the hit-rate
definitions side by side, the reuse CCDF, hit-rate curves per policy, a two-tier sizing grid.

Images are embedded as data URIs and the page loads nothing from the network, so it can be
mailed or attached to a ticket as one file.
"""

from __future__ import annotations

import base64
import html
import logging
from dataclasses import dataclass

import numpy as np

from kvtrace.pipelines.simulate import policy_curve, two_tier_grid
from kvtrace.transforms.cache import plots
from kvtrace.transforms.cache.cache_trace import read_cache_trace
from kvtrace.transforms.cache.capacity import Capacity
from kvtrace.transforms.cache.policies import POLICIES
from kvtrace.transforms.cache.reuse import ccdf_at, ccdf_curve, reuse_events, reuse_time_histogram
from kvtrace.transforms.cache.stack_distance import COLD, stack_distances
from kvtrace.transforms.stats.trace_stats import analyze
from kvtrace.transforms.trace_format import DEFAULT_BLOCK_SIZE
from kvtrace.transforms.write.publish import file_output

_LOG = logging.getLogger("kvtrace")
# Capacities of the hit-rate curves and the sizing grid, log-spaced over the trace's own
# range of LRU stack distances: enough points to read a knee, few enough replays to stay fast.
CURVE_POINTS = 8
GRID_POINTS = 4


@dataclass(frozen=True)
class ReportConfig:
    inputs: tuple[str, ...]
    output: str
    block_size: int = DEFAULT_BLOCK_SIZE
    gpu_kv_cache_size: int | None = None  # default: where LRU reaches half its best hit rate
    capacities: tuple[
        Capacity, ...
    ] = ()  # of the policy curves; default: log-spaced over the trace
    policies: tuple[str, ...] = POLICIES
    tier2_capacities: tuple[Capacity, ...] = ()  # of the sizing grid's columns; default as rows
    kv_bytes_per_token: int | None = None
    overwrite: bool = False


def run_report(config: ReportConfig) -> dict:
    """Writes the page (published whole, publish.file_output); returns the numbers it shows."""
    with file_output(config.output, config.overwrite) as output:
        numbers, text = _numbers_and_page(config)
        output.write(text.encode())
    _LOG.info("report written to %s", config.output)
    return numbers


def _numbers_and_page(config: ReportConfig) -> tuple[dict, str]:
    trace, cache = read_cache_trace(config.inputs, config.block_size)
    stats = analyze(trace, config.block_size)
    events = reuse_events(cache)
    distances = stack_distances(cache)
    capacities = config.capacities or _capacities(
        distances.prefix_max, config.block_size, CURVE_POINTS
    )
    gpu = config.gpu_kv_cache_size or _half_way(distances, capacities)
    curves = {
        policy: policy_curve(cache, distances, policy, capacities) for policy in config.policies
    }
    grid_gpu = tuple(
        sorted(
            {
                *_capacities(distances.prefix_max, config.block_size, GRID_POINTS),
                Capacity(gpu, None),
            },
            key=lambda c: c.tokens,
        )
    )
    grid_tier2 = config.tier2_capacities or grid_gpu
    grid = two_tier_grid(distances, grid_gpu, grid_tier2)
    x, y = ccdf_curve(events)
    at_gpu = ccdf_at(events, gpu)
    total = np.array([p["hit_rate"] for p in grid]).reshape(len(grid_gpu), len(grid_tier2))
    from_gpu = np.array([p["gpu_hit_rate"] for p in grid]).reshape(total.shape)
    images = {
        "lengths": plots.lengths_png(cache.input_length, cache.output_length),
        "rate": plots.request_rate_png(cache.timestamp_ms),
        "ccdf": plots.ccdf_png(x, y, gpu, at_gpu),
        "reuse_time": plots.reuse_time_png(reuse_time_histogram(events)),
        "hit_rate": plots.hit_rate_png(
            {
                policy: ([p["capacity_tokens"] for p in points], [p["hit_rate"] for p in points])
                for policy, points in curves.items()
            }
        ),
        "two_tier": plots.two_tier_png(
            [c.tokens for c in grid_gpu], [c.tokens for c in grid_tier2], total, from_gpu
        ),
    }
    at_gpu_lru = float(distances.hit_rates(np.array([gpu]))[0])
    best_tier = max((p for p in grid if p["capacity_tokens"] == gpu), key=lambda p: p["hit_rate"])
    headline = {
        "requests": stats["total_requests"],
        "duration_s": float(np.ptp(cache.timestamp_ms) / 1000) if len(cache.timestamp_ms) else 0.0,
        "requests_per_minute": stats["request_rate"]["mean_per_minute"],
        "isl": stats["isl_stats"],
        "osl": stats["osl_stats"],
        "infinite_cache_hit_rate": stats["hit_rates"]["token_weighted"],
        "gpu_kv_cache_tokens": gpu,
        "gpu_chosen": config.gpu_kv_cache_size is None,
        "gpu_lru_hit_rate": at_gpu_lru,
        "with_tier2": best_tier,
    }
    numbers = {
        "headline": headline,
        "analyze": stats,
        "gpu_kv_cache_size": gpu,
        "ccdf_at_gpu_kv_cache_size": at_gpu,
        "policies": curves,
        "two_tier": grid,
    }
    return numbers, page(config, stats, numbers, images)


def _capacities(prefix_max: np.ndarray, block_size: int, points: int) -> tuple[Capacity, ...]:
    warm = prefix_max[prefix_max != COLD]
    if not len(warm):
        return (Capacity(block_size, None),)
    pages = np.unique(np.geomspace(max(1, warm.min()), warm.max(), points).round().astype(np.int64))
    return tuple(Capacity(int(p) * block_size, None) for p in pages)


def _half_way(distances, capacities: tuple[Capacity, ...]) -> int:
    """The smallest capacity where LRU reaches half its infinite-cache hit rate."""
    tokens = np.array([c.tokens for c in capacities])
    rates = distances.hit_rates(tokens)
    return int(tokens[np.searchsorted(rates, rates[-1] / 2)]) if len(tokens) else 0


def _image(png: bytes, alt: str) -> str:
    return (
        f'<img alt="{html.escape(alt)}" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}">'
    )


def _headline(config: ReportConfig, numbers: dict) -> str:
    h = numbers["headline"]
    tier = h["with_tier2"]
    chosen = (
        " (chosen by kvtrace: where LRU reaches half its best hit rate; set --gpu-kv-cache-size)"
        if h["gpu_chosen"]
        else ""
    )
    per_token = (
        f", {h['gpu_kv_cache_tokens'] * config.kv_bytes_per_token / 1e9:,.1f} GB at "
        f"{config.kv_bytes_per_token:,} bytes per token"
        if config.kv_bytes_per_token
        else ""
    )
    items = [
        (
            "trace",
            f"{h['requests']:,} requests over {h['duration_s'] / 60:,.1f} minutes, "
            f"{h['requests_per_minute']:,.1f} per minute",
        ),
        (
            "input length",
            f"mean {h['isl']['mean']:,.0f}, median {h['isl']['median']:,.0f}, max "
            f"{h['isl']['max']:,.0f} tokens",
        ),
        (
            "output length",
            f"mean {h['osl']['mean']:,.0f}, median {h['osl']['median']:,.0f}, max "
            f"{h['osl']['max']:,.0f} tokens",
        ),
        (
            "infinite cache",
            f"{h['infinite_cache_hit_rate']:.1%} of prompt tokens hit "
            f"(token-weighted): the ceiling",
        ),
        (
            "GPU KV cache",
            f"{h['gpu_kv_cache_tokens']:,} tokens{per_token}{chosen}: LRU hits "
            f"{h['gpu_lru_hit_rate']:.1%}",
        ),
        (
            "with an offload tier",
            f"{tier['tier2_capacity_tokens']:,} tokens of CPU/SSD behind "
            f"it: {tier['hit_rate']:.1%} ({tier['gpu_hit_rate']:.1%} from "
            f"the GPU)",
        ),
    ]
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in items)
    return f'<table class="headline">{rows}</table>'


def page(config: ReportConfig, stats: dict, numbers: dict, images: dict[str, bytes]) -> str:
    rates = stats["hit_rates"]
    definitions = stats["definitions"]
    policy_rows = "".join(
        f"<tr><td>{policy}</td>"
        + "".join(f"<td>{p['hit_rate']:.1%}</td>" for p in points)
        + "</tr>"
        for policy, points in numbers["policies"].items()
    )
    header = "".join(
        f"<th>{p['capacity_tokens']:,}</th>" for p in next(iter(numbers["policies"].values()))
    )
    rate_rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{value:.1%}</td>"
        f"<td>{html.escape(definitions[key])}</td></tr>"
        for name, key, value in (
            ("aiperf / Dynamo cache_hit_rate", "cache_hit_rate", stats["cache_hit_rate"]),
            ("per request mean (causal)", "per_request_mean", rates["per_request_mean"]),
            ("block weighted", "block_weighted", rates["block_weighted"]),
            ("token weighted", "token_weighted", rates["token_weighted"]),
            (
                "token weighted after warm-up",
                "token_weighted_after_warmup",
                rates["token_weighted_after_warmup"],
            ),
        )
    )
    files = ", ".join(html.escape(f.rsplit("/", 1)[-1]) for f in config.inputs)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>kvtrace report: {files}</title>
<style>
body {{ font-family: sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }}
img {{ max-width: 100%; }} table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; font-size: 14px; text-align: left; }}
table.headline {{ background: #f4f7fb; font-size: 16px; }}
h2 {{ border-bottom: 1px solid #ddd; margin-top: 2em; }}
</style></head><body>
<h1>kvtrace report: {files}</h1>
<p>Block size {config.block_size}. Hit rates are the share of prompt tokens served from cache
(the longest cached prefix of each request), in % unless said otherwise.</p>
{_headline(config, numbers)}
<h2>Input and output lengths</h2>{_image(images["lengths"], "ISL and OSL histograms")}
<h2>Request rate</h2>{_image(images["rate"], "requests per minute")}
<h2>Hit rates: the definitions side by side (infinite cache)</h2>
<table><tr><th>hit rate</th><th>value</th><th>definition</th></tr>{rate_rows}</table>
<h2>Reuse intervals</h2>
<p>Share of prompt tokens reused after more than x tokens went through the cache; at
{numbers["gpu_kv_cache_size"]:,} tokens of GPU cache (red), {numbers["ccdf_at_gpu_kv_cache_size"]:.1%}
of prompt tokens are reused too late for it: the most a CPU/SSD tier could serve.</p>
{_image(images["ccdf"], "reuse interval CCDF")}{_image(images["reuse_time"], "reuse time")}
<h2>Hit rate by policy and capacity</h2>{_image(images["hit_rate"], "hit rate per policy")}
<table><tr><th>policy \\ capacity (tokens)</th>{header}</tr>{policy_rows}</table>
<h2>Two-tier sizing</h2>{_image(images["two_tier"], "two-tier grid")}
<p>GPU capacity (rows) with an LRU CPU/SSD tier behind it (columns): hit rate, and in brackets
the part the GPU serves.</p>
</body></html>
"""
