"""The report's headline verdict, title and chosen tier, as pure functions of its numbers."""

from __future__ import annotations

import re

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.pipelines.report import (
    ReportConfig,
    _dates,
    _headline,
    _smallest_best_tier,
    offload_verdict,
)
from kvtrace.transforms.stats.trace_stats import minute_counts, request_rate


def headline(gpu: float, ceiling: float, tier: dict) -> dict:
    return {"gpu_lru_hit_rate": gpu, "infinite_cache_hit_rate": ceiling, "with_tier2": tier}


def point(tier2: int, gpu: float, tier: float) -> dict:
    return {
        "capacity_tokens": 1024,
        "tier2_capacity_tokens": tier2,
        "hit_rate": gpu + tier,
        "gpu_hit_rate": gpu,
        "tier2_hit_rate": tier,
    }


def test_the_gpu_alone_reaching_the_ceiling_is_said_so():
    verdict = offload_verdict(headline(0.7131, 0.7134, point(1024, 0.7131, 0.0)), None)
    assert verdict == "not needed: the GPU alone reaches the ceiling (71.3%)"


def test_a_tier_that_adds_something_is_named_with_its_parts():
    verdict = offload_verdict(headline(0.2, 0.7, point(2**20, 0.21, 0.4)), 147_456)
    assert verdict.startswith("144.0 GiB of CPU/SSD behind it: 61.0% (21.0% from the GPU")
    assert "the ceiling is 70.0%" in verdict


def test_tiers_that_add_nothing_visible_say_to_size_larger_ones():
    verdict = offload_verdict(headline(0.2, 0.7, point(16, 0.2, 0.0001)), None)
    assert "none of the tiers sized adds to the GPU's 20.0%" in verdict


def test_the_smallest_tier_printing_the_best_rate_is_the_advice():
    grid = [point(4096, 0.2, 0.30001), point(1024, 0.2, 0.1), point(2048, 0.2, 0.3)]
    assert _smallest_best_tier(grid, 1024)["tier2_capacity_tokens"] == 2048


def test_dates_from_epoch_times_else_from_dated_paths_else_undated_saying_why():
    day = 1_736_899_200_000  # 2025-01-15T00:00:00Z
    assert _dates(np.array([day, day + 3_600_000.0]), ()) == ("2025-01-15", None)
    assert _dates(np.array([day, day + 86_400_000.0]), ())[0] == "2025-01-15 to 2025-01-16"
    relative = np.array([0.0, 5000.0])
    dated = _dates(relative, ("traces/2025-01-15/trace-00000-of-00001.jsonl",))
    assert dated == ("2025-01-15", None)
    dates, why = _dates(relative, ("traces/2025-13-45/t.jsonl", "t.jsonl"))
    assert dates == "undated" and "not epoch times" in why and "no path names a day" in why
    assert _dates(np.array([1e300]), ())[0] == "undated"  # beyond any calendar: not a date
    _, why = _dates(relative, ("night/trace-00000-of-00001.jsonl",), published=True)
    assert "no date in its manifest" in why
    assert _dates(np.array([]), ()) == ("undated", "the trace holds no request")


def trace_line(timestamps_ms: np.ndarray) -> str:
    """The headline's first line for a trace of these request times."""
    lengths = {"mean": 1.0, "median": 1.0, "max": 1.0}
    numbers = {
        "headline": {
            "requests": len(timestamps_ms),
            "rate": request_rate(minute_counts(timestamps_ms, float(timestamps_ms.min()))),
            "isl": lengths,
            "osl": lengths,
            "infinite_cache_hit_rate": 0.5,
            "gpu_kv_cache_tokens": 1024,
            "gpu_chosen": False,
            "gpu_lru_hit_rate": 0.5,
            "with_tier2": point(1024, 0.5, 0.0),
        }
    }
    page = _headline(ReportConfig(inputs=(), output="report.html"), numbers)
    return re.search(r"<th>trace</th><td>(.*?)</td>", page)[1]


def test_the_headline_rate_is_its_requests_over_the_span_it_prints():
    # The closing check's trace: 3,993 requests 17.0 minutes apart fill 18 one-minute bins.
    timestamps = np.linspace(0, 17 * 60_000, 3993)
    line = trace_line(timestamps)
    assert line.startswith("3,993 requests in 18 one-minute bins, from the first request")
    assert f"{3993 / 18:,.1f} per minute on average" in line


@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=200))
def test_the_rate_is_requests_over_minutes_for_any_trace(times):
    rate = request_rate(minute_counts(np.array(times, dtype=np.float64), float(min(times))))
    assert rate["minutes"] == (max(times) - min(times)) // 60_000 + 1
    assert rate["mean_per_minute"] == len(times) / rate["minutes"]
