"""The Beam path of `kvtrace reuse`: clocked by time bucket, reuse events by prefix shard, equal
to the local engine."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import shared_path, write_jsonl
from kvtrace.pipelines.reuse_local import ReuseConfig, run_reuse
from kvtrace.transforms.cache.cache_trace import read_cache_trace
from kvtrace.transforms.cache.reuse import ccdf_at, reuse_events
from kvtrace.transforms.cache.reuse_shards import CLOCKED, ReuseSummary, clock_starts, summarize


def clocked(rows: list[tuple[int, int, int, int, float]]) -> np.ndarray:
    """(prefix, start, tokens, ts) rows."""
    table = np.zeros(len(rows), dtype=CLOCKED)
    for i, (prefix, start, tokens, ts) in enumerate(rows):
        table[i] = (prefix, prefix, start, tokens, ts)
    return table


def test_clock_starts_add_up_earlier_buckets_in_time_order():
    assert clock_starts({5: 10, 2: 7, 9: 1}) == {2: 0, 5: 7, 9: 17}


def test_summary_of_one_prefix_reused_twice():
    # Prefix 1 at clock 0 (512 tokens), again at 612 and at 2000: intervals 100 and 876.
    table = clocked(
        [(1, 0, 512, 0.0), (2, 512, 100, 0.0), (1, 612, 512, 500.0), (1, 2000, 512, 90_000.0)]
    )
    summary = summarize(table, gpu_kv_cache_size=500)
    assert (summary.total_tokens, summary.reused_tokens, summary.above_gpu_tokens) == (
        1636,
        1024,
        512,
    )
    assert [b["tokens"] for b in summary.reuse_time()] == [512, 0, 0, 512, 0, 0]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 600)), min_size=1, max_size=60),
    cut=st.integers(0, 60),
)
def test_summaries_merge_to_the_summary_of_the_whole(rows, cut):
    starts = np.cumsum([0] + [t for _, t in rows])[:-1]
    table = clocked([(p, int(s), t, float(s)) for (p, t), s in zip(rows, starts)])
    prefixes = table["prefix_lo"]
    left, right = table[prefixes < cut % 6], table[prefixes >= cut % 6]  # a prefix stays whole
    whole, parts = summarize(table, 300), summarize(left, 300).merge(summarize(right, 300))
    assert (whole.reused_tokens, whole.above_gpu_tokens) == (
        parts.reused_tokens,
        parts.above_gpu_tokens,
    )
    assert np.array_equal(whole.interval_tokens, parts.interval_tokens)


@pytest.mark.beam
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_pipeline_reports_reuse_of_a_tiny_trace(tmp_path):
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that

    from kvtrace.pipelines.reuse_beam import build

    rows = [
        {"timestamp": t, "input_length": 20, "output_length": 1, "hash_ids": ids}
        for t, ids in ((2_000, [0, 1]), (0, [0, 2]), (5_000, [0, 1]))
    ]
    trace = str(write_jsonl(tmp_path / "t.jsonl", rows))
    config = ReuseConfig((trace,), block_size=16, gpu_kv_cache_size=10)

    def check(reports):
        [report] = reports
        # Clock in time order: [0,2] 0-20, [0,1] 20-40, [0,1] 40-60. Reuses: prefix [0] twice
        # (16 tokens, intervals 4 and 4), prefix [0,1] once (4 tokens, interval 56 - 40 = 16,
        # the only one above 10).
        assert report["rows"] == 3 and report["prompt_tokens"] == 60
        assert report["reused_token_share"] == pytest.approx((16 + 16 + 4) / 60)
        assert report["ccdf_at_gpu_kv_cache_size"] == pytest.approx(4 / 60)

    with TestPipeline() as pipeline:
        assert_that(build(pipeline, config), check)


@pytest.mark.beam
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_beam_equals_local_on_the_real_trace(tmp_path):
    from kvtrace.pipelines.reuse_beam import run_reuse_beam

    trace = str(shared_path("traces", "synthetic_trace.jsonl"))
    config = ReuseConfig((trace,), 512, 345_792, str(tmp_path / "beam.png"))
    beam, local = run_reuse_beam(config, []), run_reuse(ReuseConfig((trace,), 512, 345_792))
    for key in (
        "ccdf_at_gpu_kv_cache_size",
        "reused_token_share",
        "prompt_tokens",
        "rows",
        "reuse_time",
    ):
        assert beam[key] == local[key], key
    _, cache = read_cache_trace([trace], 512)
    events = reuse_events(cache)
    x, y = beam["ccdf"]["interval_tokens"], beam["ccdf"]["share_above"]
    assert [ccdf_at(events, v) for v in x] == pytest.approx(y, abs=1e-12)
    assert (tmp_path / "beam.png").read_bytes()[:4] == b"\x89PNG"
    assert ReuseSummary().ccdf()[0].size == 0
