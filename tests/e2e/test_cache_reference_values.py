"""kvtrace reuse / simulate on the real trace: the reference values, whole runs (the CLI's bad
lines and the report page are in tests/cli/test_cache_cli.py)."""

from __future__ import annotations

import json

import pytest

from helpers import shared_path
from kvtrace.cli import main


def run_json(capsys, tmp_path, *argv: str) -> tuple[dict, str]:
    out = tmp_path / "out.json"
    assert main([*argv, "--json", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


# The fast set's costliest run (5% of its test time; CI runs it): the mechanism, reuse intervals,
# their ccdf and the LRU stack, is checked fast in tests/transforms/cache/test_cache.py
# (test_reuse_interval_is_the_tokens_between_the_two_uses,
# test_lru_from_stack_distances_equals_the_replay_at_every_capacity).
@pytest.mark.slow
def test_reuse_matches_the_reference_values_and_draws_the_plot(tmp_path, capsys):
    trace = str(shared_path("traces", "synthetic_trace.jsonl"))
    plot = tmp_path / "reuse.png"
    report, out = run_json(
        capsys,
        tmp_path,
        "reuse",
        trace,
        "--block-size",
        "512",
        "--gpu-kv-cache-size",
        "345792",
        "--output",
        str(plot),
    )
    assert report["ccdf_at_gpu_kv_cache_size"] == pytest.approx(0.5938, abs=5e-5)
    assert report["infinite_cache"]["token_weighted"] == pytest.approx(0.6512, abs=5e-5)
    assert report["infinite_cache"]["token_weighted_last_50pct_of_rows"] == pytest.approx(
        0.8627, abs=5e-5
    )
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lru = report["lru_stack"]
    assert all(a <= b for a, b in zip(lru["lru_hit_rate"], lru["lru_hit_rate"][1:]))
    assert sum(b["share"] for b in report["reuse_time"]) == pytest.approx(1.0)
    assert "(beyond the GPU cache): 59.4% of prompt tokens" in out  # printed in percent


# 4% of the fast set's test time (CI runs it): every policy's hit rates and the two tiers are
# checked fast in tests/transforms/cache/test_cache.py
# (test_rates_are_bounded_monotone_and_reach_the_infinite_cache,
# test_belady_keeps_what_is_needed_sooner_than_what_arrives).
@pytest.mark.slow
def test_simulate_matches_the_reference_values(tmp_path, capsys):
    trace = str(shared_path("traces", "synthetic_trace.jsonl"))
    report, out = run_json(
        capsys, tmp_path, "simulate", trace, "--capacity", "3000000,50M", "--tier2-capacity", "47M"
    )
    lru = {p["capacity_tokens"]: p["hit_rate"] for p in report["policies"]["lru"]}
    assert lru[3_000_000] == pytest.approx(0.3151, abs=5e-5)
    assert lru[50_000_000] == pytest.approx(0.6512, abs=5e-5)
    at_3m = {policy: points[0]["hit_rate"] for policy, points in report["policies"].items()}
    assert at_3m["belady"] >= max(at_3m.values()) and all(0 <= r <= 1 for r in at_3m.values())
    tiers = report["two_tier"][0]
    assert tiers["gpu_hit_rate"] + tiers["tier2_hit_rate"] == pytest.approx(
        lru[50_000_000], abs=1e-3
    )
    assert "| 3,000,000 tokens | 31.5% |" in out  # printed in percent
