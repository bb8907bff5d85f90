"""The plots of reuse, simulate and report, as PNG bytes (matplotlib, no display needed).

Each plot names the definition of what it draws, since hit rates differ by definition.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from kvtrace.transforms.cache.capacity import GIB, capacity_text, percent

if TYPE_CHECKING:  # annotations only: pyplot is imported by the first plot drawn
    import matplotlib.pyplot as plt

_DPI = 110


@functools.cache
def _pyplot() -> ModuleType:
    """pyplot, imported when a plot is first drawn: its import costs ~2 s of CPU, which every
    process importing this module (the cache commands' jobs without a plot, each test worker)
    would otherwise pay."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot

    return matplotlib.pyplot


def _png(figure: plt.Figure) -> bytes:
    sink = io.BytesIO()
    figure.tight_layout()
    figure.savefig(sink, format="png", dpi=_DPI)
    _pyplot().close(figure)
    return sink.getvalue()


def draw_ccdf(
    axes: plt.Axes,
    x: np.ndarray,
    y: np.ndarray,
    gpu_kv_cache_size: int | None,
    at_gpu: float | None,
    kv_bytes_per_token: int | None = None,
) -> None:
    """Seed 003's plot: share of prompt tokens reused after more than x tokens, log x; with a
    GPU cache size, red lines at it and at the share beyond it (drawn even outside the data)."""
    axes.scatter(x, 100 * y, s=6)
    axes.set_xscale("log")
    axes.set_xlabel("reuse interval x (tokens through the cache since the previous use)")
    axes.set_ylabel("% of prompt tokens reused after > x")
    axes.set_title("CCDF of block reuse intervals (token-weighted, across requests)", fontsize=10)
    if gpu_kv_cache_size:
        axes.axvline(
            gpu_kv_cache_size,
            color="red",
            linestyle="--",
            label=f"GPU KV cache: {capacity_text(gpu_kv_cache_size, kv_bytes_per_token)}"
            + (f" ({gpu_kv_cache_size:,} tokens)" if kv_bytes_per_token else ""),
        )
        axes.axhline(
            100 * (at_gpu or 0.0),
            color="red",
            linestyle=":",
            label=f"{percent(at_gpu or 0.0)} reusable beyond it (offload bound)",
        )
        low, high = axes.get_xlim() if len(x) else (gpu_kv_cache_size / 10, gpu_kv_cache_size * 10)
        axes.set_xlim(min(low, gpu_kv_cache_size / 2), max(high, gpu_kv_cache_size * 2))
        axes.legend(fontsize=8)
    axes.set_ylim(bottom=0)
    axes.grid(True, which="both", alpha=0.3)


def reuse_figure(
    x: np.ndarray,
    y: np.ndarray,
    gpu_kv_cache_size: int | None,
    at_gpu: float | None,
    capacities: np.ndarray | None,
    lru: np.ndarray | None,
    block_lru: np.ndarray | None,
    reuse_time: Sequence[dict],
    kv_bytes_per_token: int | None = None,
) -> bytes:
    """The CCDF, the exact LRU curves (when stack distances were computed) and reuse times;
    capacities in GiB where a token's bytes are known (the model), as the report draws them."""
    panels = 3 if capacities is not None else 2
    figure, axes = _pyplot().subplots(1, panels, figsize=(5.7 * panels, 4.8))
    draw_ccdf(axes[0], x, y, gpu_kv_cache_size, at_gpu, kv_bytes_per_token)
    if capacities is not None:
        draw_lru_stack(axes[1], capacities, lru, block_lru, gpu_kv_cache_size, kv_bytes_per_token)
    draw_reuse_time(axes[-1], reuse_time)
    return _png(figure)


def draw_lru_stack(
    axes: plt.Axes,
    capacities: np.ndarray,
    lru: np.ndarray,
    block_lru: np.ndarray,
    gpu_kv_cache_size: int | None,
    kv_bytes_per_token: int | None = None,
) -> None:
    """The exact LRU hit rates (%) against capacity (tokens, or GiB), the GPU's size in red."""
    capacity = _capacity_axis(capacities, kv_bytes_per_token)
    axes.plot(capacity, 100 * np.asarray(lru), label="lru: longest cached prefix per request")
    axes.plot(
        capacity, 100 * np.asarray(block_lru), linestyle="--", label="block LRU: every cached block"
    )
    axes.set_xscale("log")
    axes.set_ylim(bottom=0)
    axes.set_xlabel(
        f"LRU cache capacity ({_capacity_unit(kv_bytes_per_token)}, pages of block size)"
    )
    axes.set_ylabel("hit rate, % of prompt tokens (token-weighted)")
    axes.set_title("Exact LRU hit rate from stack distances", fontsize=10)
    if gpu_kv_cache_size:
        gpu = _capacity_axis([gpu_kv_cache_size], kv_bytes_per_token)[0]
        axes.axvline(gpu, color="red", linestyle="--")
    axes.legend(fontsize=8)
    axes.grid(True, which="both", alpha=0.3)


def draw_reuse_time(axes: plt.Axes, reuse_time: Sequence[dict]) -> None:
    axes.bar([b["bucket"] for b in reuse_time], [100 * b["share"] for b in reuse_time])
    axes.set_ylabel("% of reused tokens")
    axes.set_title("Time since the previous use (seconds, by timestamp)", fontsize=10)
    axes.tick_params(axis="x", labelsize=8)


def ccdf_png(
    x: np.ndarray,
    y: np.ndarray,
    gpu_kv_cache_size: int | None,
    at_gpu: float | None,
    kv_bytes_per_token: int | None = None,
) -> bytes:
    figure, axes = _pyplot().subplots(figsize=(7, 4.8))
    draw_ccdf(axes, x, y, gpu_kv_cache_size, at_gpu, kv_bytes_per_token)
    return _png(figure)


def reuse_time_png(reuse_time: Sequence[dict]) -> bytes:
    figure, axes = _pyplot().subplots(figsize=(7, 4))
    draw_reuse_time(axes, reuse_time)
    return _png(figure)


def _capacity_axis(tokens: Sequence[int], kv_bytes_per_token: int | None) -> np.ndarray:
    """Capacities in the unit capacity_text prints: GiB when a token's bytes are known."""
    values = np.asarray(tokens, dtype=np.float64)
    return values * kv_bytes_per_token / GIB if kv_bytes_per_token else values


def _capacity_unit(kv_bytes_per_token: int | None) -> str:
    return "GiB" if kv_bytes_per_token else "tokens"


def hit_rate_png(
    curves: dict[str, tuple[Sequence[int], Sequence[float]]], kv_bytes_per_token: int | None = None
) -> bytes:
    """Token-weighted hit rate (%) against capacity (tokens, or GiB), one line per policy."""
    figure, axes = _pyplot().subplots(figsize=(7, 4.8))
    for policy, (capacities, rates) in curves.items():
        axes.plot(
            _capacity_axis(capacities, kv_bytes_per_token),
            100 * np.asarray(rates),
            marker="o",
            markersize=3,
            label=policy,
        )
    axes.set_xscale("log")
    axes.set_ylim(bottom=0)
    axes.set_xlabel(f"cache capacity ({_capacity_unit(kv_bytes_per_token)})")
    axes.set_ylabel("hit rate, % of prompt tokens (token-weighted)")
    axes.set_title("Hit rate by policy: hit = longest cached prefix per request", fontsize=10)
    axes.legend(fontsize=8)
    axes.grid(True, which="both", alpha=0.3)
    return _png(figure)


def two_tier_png(
    gpu: Sequence[int],
    tier2: Sequence[int],
    total: np.ndarray,
    from_gpu: np.ndarray,
    kv_bytes_per_token: int | None = None,
) -> bytes:
    """Hit rate of each (GPU, tier-2) capacity pair; cells show total and the GPU's part, in
    percent as the colour scale is."""
    figure, axes = _pyplot().subplots(figsize=(1.6 * len(tier2) + 3, 0.7 * len(gpu) + 2))
    image = axes.imshow(
        100 * total, cmap="viridis", vmin=0, vmax=max(1e-7, 100 * float(total.max())), aspect="auto"
    )
    for i in range(len(gpu)):
        for j in range(len(tier2)):
            axes.text(
                j,
                i,
                f"{percent(total[i, j])}\n(GPU {percent(from_gpu[i, j])})",
                ha="center",
                va="center",
                fontsize=7,
                color="white" if total[i, j] < 0.6 * total.max() else "black",
            )
    axes.set_xticks(
        range(len(tier2)), [capacity_text(t, kv_bytes_per_token) for t in tier2], fontsize=7
    )
    axes.set_yticks(
        range(len(gpu)), [capacity_text(g, kv_bytes_per_token) for g in gpu], fontsize=7
    )
    axes.set_xlabel("tier-2 (CPU/SSD) capacity")
    axes.set_ylabel("GPU capacity")
    axes.set_title("Two-tier LRU: hit rate, % of prompt tokens (the GPU's part)", fontsize=10)
    figure.colorbar(image, ax=axes, label="hit rate, % of prompt tokens")
    return _png(figure)


def lengths_png(input_length: np.ndarray, output_length: np.ndarray) -> bytes:
    figure, (isl, osl) = _pyplot().subplots(1, 2, figsize=(11, 3.8))
    for axes, values, name in (
        (isl, input_length, "input length (ISL)"),
        (osl, output_length, "output length (OSL)"),
    ):
        axes.hist(values, bins=60, color="tab:blue")
        axes.set_xlabel(f"{name}, tokens")
        axes.set_ylabel("requests")
        axes.set_title(f"{name}: mean {np.mean(values) if len(values) else 0:,.0f}", fontsize=10)
    return _png(figure)


MAX_RATE_BINS = 2000


def request_rate_png(timestamp_ms: np.ndarray) -> bytes:
    figure, axes = _pyplot().subplots(figsize=(11, 3.5))
    if len(timestamp_ms):
        minutes = (timestamp_ms - timestamp_ms.min()) / 60_000
        # One bin per minute, or wider bins for a long trace: the plot's cost never follows its
        # span (a trace of years would otherwise ask for millions of bins).
        width = max(1.0, float(np.ceil((minutes.max() + 1) / MAX_RATE_BINS)))
        bins = int(np.ceil((minutes.max() + 1) / width))
        counts, edges = np.histogram(minutes, bins=bins, range=(0, bins * width))
        axes.plot(edges[:-1], counts / width)
        axes.set_ylim(bottom=0)
    axes.set_xlabel("minutes since the first request")
    axes.set_ylabel("requests per minute")
    axes.set_title("Request rate over time", fontsize=10)
    axes.grid(True, alpha=0.3)
    return _png(figure)


def calibration_png(
    curves: dict[str, tuple[Sequence[int], Sequence[float]]],
    best: dict[str, int],
    kv_bytes_per_token: int | None = None,
) -> bytes:
    """Mean absolute error per request (tokens) between simulated and measured hits against
    capacity, one line per policy, its best capacity marked."""
    figure, axes = _pyplot().subplots(figsize=(7, 4.8))
    for policy, (capacities, errors) in curves.items():
        x = _capacity_axis(capacities, kv_bytes_per_token)
        (line,) = axes.step(x, errors, where="post", label=policy)
        axes.axvline(
            _capacity_axis([best[policy]], kv_bytes_per_token)[0],
            color=line.get_color(),
            linestyle=":",
            label=f"{policy} best: {capacity_text(best[policy], kv_bytes_per_token)}",
        )
    axes.set_xscale("symlog", linthresh=1)
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.set_xlabel(f"cache capacity ({_capacity_unit(kv_bytes_per_token)})")
    axes.set_ylabel("mean |simulated - measured| cached tokens per request")
    axes.set_title(
        "Calibration: simulated hit (longest cached prefix) against the engine's", fontsize=10
    )
    axes.legend(fontsize=8)
    axes.grid(True, which="both", alpha=0.3)
    return _png(figure)
