"""`kvtrace report`: one self-contained HTML page of a trace, titled by its model and dates: a
headline (span and rate, lengths, hit rates, what a GPU cache and an offload tier would do),
lengths, request rate, the hit-rate definitions side by side, sessions, the reuse CCDF, hit-rate
curves per policy, a two-tier sizing grid. Capacities are GiB where the model is known, hit
rates percent, as the CLI prints them (transforms/cache/capacity.py).

Images are embedded as data URIs and the page loads nothing from the network, so it can be
mailed or attached to a ticket as one file.
"""

from __future__ import annotations

import base64
import datetime
import html
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvtrace.pipelines.calibrate import CalibrateConfig, calibration, fits_png, trace_measured
from kvtrace.pipelines.simulate import DEFINITIONS, policy_curve, two_tier_grid
from kvtrace.transforms.cache import plots
from kvtrace.transforms.cache.cache_trace import CacheTrace, read_cache_trace
from kvtrace.transforms.cache.calibrate import lru_hit_rate
from kvtrace.transforms.cache.capacity import Capacity, capacity_text, default_gpu_kv_cache, percent
from kvtrace.transforms.cache.policy_names import CALIBRATED_POLICIES, POLICIES
from kvtrace.transforms.cache.reuse import ccdf_at, ccdf_curve, reuse_events, reuse_time_histogram
from kvtrace.transforms.cache.sessions import session_report
from kvtrace.transforms.cache.stack_distance import COLD, StackDistances, stack_distances
from kvtrace.transforms.read.trace_inputs import MAX_MANIFEST_BYTES, PublishedFolder, pin_of
from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.stats.trace_stats import analyze
from kvtrace.transforms.trace_format import DEFAULT_BLOCK_SIZE, MANIFEST, MODEL_NAME, parse_json
from kvtrace.transforms.write.manifest import model_name_problems
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
    gpu_kv_cache_size: Capacity | None = None  # default: capacity.default_gpu_kv_cache
    capacities: tuple[
        Capacity, ...
    ] = ()  # of the policy curves; default: log-spaced over the trace
    policies: tuple[str, ...] = POLICIES
    tier2_capacities: tuple[Capacity, ...] = ()  # of the sizing grid's columns; default as rows
    kv_bytes_per_token: int | None = None
    overwrite: bool = False
    model: str | None = None  # the --model preset sizing it; the manifest's model_name first
    measured: str | None = None  # the run's private measured file: measured against simulated


def run_report(config: ReportConfig, accept: Callable[[int, dict], None]) -> dict:
    """Writes the page (published whole, publish.file_output); returns the numbers it shows.
    accept(rows, problems) is called before any file is written: it refuses a trace of no rows."""
    trace, cache = read_cache_trace(config.inputs, config.block_size)
    stats = analyze(trace, config.block_size)
    accept(stats["total_requests"], stats["problems"])
    numbers, text = _numbers_and_page(config, trace, cache, stats)
    # A page showing the private measured file's numbers is private like it.
    with file_output(config.output, config.overwrite, private=bool(config.measured)) as output:
        output.write(text.encode())
    _LOG.info("report written to %s", config.output)
    return numbers


def _numbers_and_page(
    config: ReportConfig, trace: Trace, cache: CacheTrace, stats: dict
) -> tuple[dict, str]:
    events = reuse_events(cache)
    distances = stack_distances(cache)
    capacities = config.capacities or _capacities(
        distances.prefix_max, config.block_size, CURVE_POINTS
    )
    gpu = (config.gpu_kv_cache_size or default_gpu_kv_cache(config.kv_bytes_per_token)).tokens
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
    per_token = config.kv_bytes_per_token
    images = {
        "lengths": plots.lengths_png(cache.input_length, cache.output_length),
        "rate": plots.request_rate_png(cache.timestamp_ms),
        "ccdf": plots.ccdf_png(x, y, gpu, at_gpu, per_token),
        "reuse_time": plots.reuse_time_png(reuse_time_histogram(events)),
        "hit_rate": plots.hit_rate_png(
            {
                policy: ([p["capacity_tokens"] for p in points], [p["hit_rate"] for p in points])
                for policy, points in curves.items()
            },
            per_token,
        ),
        "two_tier": plots.two_tier_png(
            [c.tokens for c in grid_gpu], [c.tokens for c in grid_tier2], total, from_gpu, per_token
        ),
    }
    at_gpu_lru = float(distances.hit_rates(np.array([gpu]))[0])
    headline = {
        "requests": stats["total_requests"],
        "rate": stats["request_rate"],  # its span and rate, as analyze prints them
        "isl": stats["isl_stats"],
        "osl": stats["osl_stats"],
        "infinite_cache_hit_rate": stats["hit_rates"]["token_weighted"],
        "gpu_kv_cache_tokens": gpu,
        "gpu_chosen": config.gpu_kv_cache_size is None,
        "gpu_lru_hit_rate": at_gpu_lru,
        "with_tier2": _smallest_best_tier(grid, gpu),
    }
    if config.measured:
        numbers_measured, images["calibration"] = _measured(config, trace, cache, distances, gpu)
    numbers = {
        **({"measured": numbers_measured} if config.measured else {}),
        "title": _title(config, cache.timestamp_ms),
        "headline": headline,
        "analyze": stats,
        "sessions": session_report(trace, cache),
        "gpu_kv_cache_size": gpu,
        "ccdf_at_gpu_kv_cache_size": at_gpu,
        "policies": curves,
        "two_tier": grid,
    }
    return numbers, page(config, stats, numbers, images)


def _measured(
    config: ReportConfig, trace: Trace, cache: CacheTrace, distances: StackDistances, gpu: int
) -> tuple[dict, bytes]:
    """The engine's measured hit rate beside the trace's ceiling and lru at the GPU cache and
    at the capacity that explains the measured counts best (calibrate's numbers and plot)."""
    measured = trace_measured(trace, config.measured or "")
    policies = tuple(p for p in config.policies if p in CALIBRATED_POLICIES)
    calibrate = CalibrateConfig(
        config.inputs, config.measured or "", config.block_size, policies or ("lru",)
    )
    report, fits = calibration(cache, distances, measured, calibrate)
    report["lru_at_gpu_kv_cache_size"] = lru_hit_rate(distances, measured, gpu)
    return report, fits_png(fits, config.kv_bytes_per_token)


def _note(measured: dict) -> str:
    """The measured aggregate's note (calibrate.below_floor_note), if it has one, for the page."""
    return f" Note: {html.escape(measured['note'])}." if "note" in measured else ""


def _measured_section(config: ReportConfig, numbers: dict, images: dict[str, bytes]) -> str:
    if "measured" not in numbers:
        return ""
    per_token = config.kv_bytes_per_token
    report = numbers["measured"]
    measured = report["measured"]
    rows = [
        ("measured by the engine", measured["hit_rate"], "its responses' cached tokens"),
        ("infinite cache (this trace's ceiling)", measured["infinite_cache_hit_rate"], ""),
        (
            f"lru at the GPU cache, {capacity_text(numbers['gpu_kv_cache_size'], per_token)}",
            report["lru_at_gpu_kv_cache_size"],
            "",
        ),
    ]
    for policy, fit in report["policies"].items():
        note = f"mean error {fit['mae_tokens']:,.1f} tokens per request" + (
            f"; {fit['verdict']}" if fit["verdict"] else ""
        )
        rows.append(
            (
                f"{policy} at its best capacity, "
                f"{capacity_text(fit['capacity_tokens'], per_token)}",
                fit["simulated_hit_rate"],
                note,
            )
        )
    body = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{percent(value)}</td><td>{html.escape(note)}</td></tr>"
        for name, value, note in rows
    )
    return f"""<h2>Measured against simulated</h2>
<p>Over the {measured["requests"]:,} requests whose logs carried the engine's cached tokens
(token-weighted; kvtrace calibrate fits the capacity).{_note(measured)}</p>
<table><tr><th>hit rate</th><th>value</th><th>note</th></tr>{body}</table>
{_image(images["calibration"], "calibration error by capacity")}
"""


def _capacities(prefix_max: np.ndarray, block_size: int, points: int) -> tuple[Capacity, ...]:
    warm = prefix_max[prefix_max != COLD]
    if not len(warm):
        return (Capacity(block_size, None),)
    pages = np.unique(np.geomspace(max(1, warm.min()), warm.max(), points).round().astype(np.int64))
    return tuple(Capacity(int(p) * block_size, None) for p in pages)


def _smallest_best_tier(grid: list[dict], gpu: int) -> dict:
    """Of the grid's tiers behind the GPU capacity, the smallest whose hit rate prints as the
    best one does: a larger tier that adds nothing a reader can see is not the advice."""
    behind = sorted(
        (p for p in grid if p["capacity_tokens"] == gpu), key=lambda p: p["tier2_capacity_tokens"]
    )
    best = percent(max(p["hit_rate"] for p in behind))
    return next(p for p in behind if percent(p["hit_rate"]) == best)


# Timestamps from this many ms on are epoch times (2001-09-09 on) up to the year 9999; kvtrace
# publishes them from the first request, so its traces are dated by their folders' names, as a
# nightly's {date} makes them (kvtrace/config.fill_dates).
EPOCH_MS = (10**12, 253_402_300_799_999)
_DATE_IN_PATH = re.compile(r"(?<![0-9])([0-9]{4}-[0-9]{2}-[0-9]{2})(?![0-9])")


def _dates(
    timestamp_ms: np.ndarray, files: tuple[str, ...], published: bool = False
) -> tuple[str, str | None]:
    """The trace's dates (UTC): from epoch timestamps, else the dates its paths name, else
    "undated" and why, said plainly (published: the trace is a kvtrace output folder's, whose
    manifest holds no date by design)."""
    if len(timestamp_ms) and EPOCH_MS[0] <= timestamp_ms.min() <= timestamp_ms.max() <= EPOCH_MS[1]:
        days = [
            datetime.datetime.fromtimestamp(t / 1000, datetime.UTC).date().isoformat()
            for t in (timestamp_ms.min(), timestamp_ms.max())
        ]
    else:
        days = sorted({d for f in files for d in _DATE_IN_PATH.findall(f) if _is_date(d)})
    if days:
        return (days[0] if days[0] == days[-1] else f"{days[0]} to {days[-1]}"), None
    if not len(timestamp_ms):
        return "undated", "the trace holds no request"
    times = (
        "kvtrace publishes times in ms from the first request and no date in its manifest"
        if published
        else "its times are not epoch times (ms from its own start, as kvtrace publishes them)"
    )
    return "undated", f"{times}, and no path names a day (YYYY-MM-DD, as a nightly's {{date}})"


def _is_date(text: str) -> bool:
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        return False
    return True


def _title(config: ReportConfig, timestamp_ms: np.ndarray) -> dict:
    """What the page is titled by: the model, the dates, and why there are none if so."""
    published = any(pin_of(f) is not None for f in config.inputs)
    dates, undated_because = _dates(timestamp_ms, config.inputs, published)
    return {"model": _model_name(config), "dates": dates, "undated_because": undated_because}


def _model_name(config: ReportConfig) -> str | None:
    """The model the trace is of: the model_name its manifests publish, else the --model preset
    that sizes it, else None."""
    folders = {pin for f in config.inputs if (pin := pin_of(f)) is not None}
    published = sorted({name for folder in folders if (name := _published_model_name(folder))})
    return ", ".join(published) if published else config.model


def _published_model_name(folder: PublishedFolder) -> str | None:
    """A kvtrace output folder's model_name, if its manifest holds one the gate would accept."""
    with folder.open(MANIFEST) as handle:
        manifest = parse_json(handle.read(MAX_MANIFEST_BYTES + 1))
    name = manifest.get(MODEL_NAME) if isinstance(manifest, dict) else None
    return name if isinstance(name, str) and not model_name_problems(name) else None


def _image(png: bytes, alt: str) -> str:
    return (
        f'<img alt="{html.escape(alt)}" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}">'
    )


def _headline(config: ReportConfig, numbers: dict) -> str:
    h = numbers["headline"]
    per_token = config.kv_bytes_per_token
    gpu = h["gpu_kv_cache_tokens"]
    chosen = (
        " (kvtrace's default: 50 GiB, an 80 GB H100 under vLLM's default memory use less an 8B "
        "model's weights"
        + ("" if per_token else ", at Llama-3.1-8B's 128 KiB per token")
        + "; set --gpu-kv-cache-size)"
        if h["gpu_chosen"]
        else ""
    )
    tokens = f" ({gpu:,} tokens at {per_token:,} bytes per token)" if per_token else ""
    items = [
        (
            "trace",
            f"{h['requests']:,} requests in {h['rate']['minutes']:,} one-minute bins, from the "
            f"first request's to the last's: {h['rate']['mean_per_minute']:,.1f} per minute on "
            f"average, peak {h['rate']['peak_per_minute']:,}",
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
            f"{percent(h['infinite_cache_hit_rate'])} of prompt tokens hit "
            f"(token-weighted): the ceiling",
        ),
        (
            "GPU KV cache",
            f"{capacity_text(gpu, per_token)}{tokens}{chosen}: LRU hits "
            f"{percent(h['gpu_lru_hit_rate'])}",
        ),
        ("with an offload tier", offload_verdict(h, per_token)),
    ]
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in items)
    return f'<table class="headline">{rows}</table>'


def offload_verdict(headline: dict, kv_bytes_per_token: int | None) -> str:
    """What a CPU/SSD tier behind the GPU adds, compared as the page prints the figures."""
    gpu, ceiling = headline["gpu_lru_hit_rate"], headline["infinite_cache_hit_rate"]
    tier = headline["with_tier2"]
    if percent(gpu) == percent(ceiling):
        return f"not needed: the GPU alone reaches the ceiling ({percent(ceiling)})"
    if percent(tier["hit_rate"]) == percent(gpu):
        return (
            f"none of the tiers sized adds to the GPU's {percent(gpu)} (the ceiling is "
            f"{percent(ceiling)}): give larger ones with --tier2-capacity"
        )
    return (
        f"{capacity_text(tier['tier2_capacity_tokens'], kv_bytes_per_token)} of CPU/SSD behind "
        f"it: {percent(tier['hit_rate'])} ({percent(tier['gpu_hit_rate'])} from the GPU, "
        f"{percent(tier['tier2_hit_rate'])} from the tier; the ceiling is {percent(ceiling)})"
    )


def _sessions(numbers: dict) -> str:
    sessions = numbers["sessions"]
    per = sessions["requests_per_session"]
    defined = (
        "the trace's own session ids (rows without one: by their first block)"
        if sessions["defined_by"] == "session ids"
        else "the requests that share a first block (the trace names no sessions); every reuse "
        "is then within a session, since a block is its exact prefix"
    )
    rows = (
        (
            "sessions",
            f"{sessions['sessions']:,} ({sessions['single_request_sessions']:,} of one request)",
        ),
        (
            "requests per session",
            f"mean {per['mean']:,.1f}, median {per['median']:,.0f}, p75 {per['p75']:,.0f}, max "
            f"{per['max']:,.0f}",
        ),
        (
            "reused tokens",
            f"{percent(sessions['reused_within_session'])} within a session, "
            f"{percent(sessions['reused_across_sessions'])} across sessions",
        ),
    )
    cells = "".join(f"<tr><th>{k}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<p>Sessions are {html.escape(defined)}.</p><table>{cells}</table>"


def title(numbers: dict) -> str:
    """The page's title: the model (or that none is named) and the trace's dates."""
    model = numbers["title"]["model"] or "model not named"
    return f"kvtrace report: {model}, {numbers['title']['dates']}"


def _undated(numbers: dict) -> str:
    """A line saying why the title names no date, when it names none."""
    why = numbers["title"]["undated_because"]
    return f"<p>Undated: {html.escape(why)}.</p>\n" if why else ""


def page(config: ReportConfig, stats: dict, numbers: dict, images: dict[str, bytes]) -> str:
    per_token = config.kv_bytes_per_token
    rates = stats["hit_rates"]
    definitions = stats["definitions"]
    policy_rows = "".join(
        f"<tr><td>{policy}</td>"
        + "".join(f"<td>{percent(p['hit_rate'])}</td>" for p in points)
        + f"<td>{html.escape(DEFINITIONS[policy])}</td></tr>"
        for policy, points in numbers["policies"].items()
    )
    header = "".join(
        f"<th>{capacity_text(p['capacity_tokens'], per_token)}</th>"
        for p in next(iter(numbers["policies"].values()))
    )
    rate_rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{percent(value)}</td>"
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
    heading = html.escape(title(numbers))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{heading}</title>
<style>
body {{ font-family: sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }}
img {{ max-width: 100%; }} table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; font-size: 14px; text-align: left; }}
table.headline {{ background: #f4f7fb; font-size: 16px; }}
h2 {{ border-bottom: 1px solid #ddd; margin-top: 2em; }}
</style></head><body>
<h1>{heading}</h1>
{_undated(numbers)}<p>Block size {config.block_size}. Hit rates are the share of prompt tokens served from cache
(the longest cached prefix of each request), in %; capacities in
{"GiB" if per_token else "tokens (give --model for GiB)"}.</p>
{_headline(config, numbers)}
{_measured_section(config, numbers, images)}<h2>Input and output lengths</h2>{_image(images["lengths"], "ISL and OSL histograms")}
<h2>Request rate</h2>{_image(images["rate"], "requests per minute")}
<h2>Hit rates: the definitions side by side (infinite cache)</h2>
<table><tr><th>hit rate</th><th>value</th><th>definition</th></tr>{rate_rows}</table>
<h2>Sessions</h2>{_sessions(numbers)}
<h2>Reuse intervals</h2>
<p>Share of prompt tokens reused after more than x tokens went through the cache; at
{capacity_text(numbers["gpu_kv_cache_size"], per_token)} of GPU cache (red),
{percent(numbers["ccdf_at_gpu_kv_cache_size"])} of prompt tokens are reused too late for it: the
most a CPU/SSD tier could serve.</p>
{_image(images["ccdf"], "reuse interval CCDF")}{_image(images["reuse_time"], "reuse time")}
<h2>Hit rate by policy and capacity</h2>{_image(images["hit_rate"], "hit rate per policy")}
<table><tr><th>policy \\ capacity</th>{header}<th>eviction</th></tr>{policy_rows}</table>
<h2>Two-tier sizing</h2>{_image(images["two_tier"], "two-tier grid")}
<p>GPU capacity (rows) with an LRU CPU/SSD tier behind it (columns): hit rate, and in brackets
the part the GPU serves.</p>
</body></html>
"""
