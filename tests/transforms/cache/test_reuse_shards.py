"""reuse's one algorithm: the prefix shards of the Beam engine find exactly the local engine's
reuse events (binned)."""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import trace_of
from kvtrace.transforms.cache.cache_trace import CacheTrace
from kvtrace.transforms.cache.reuse import INTERVAL_EDGES, ccdf_at, ccdf_curve, reuse_events
from kvtrace.transforms.cache.reuse_shards import ReuseSummary, clock_blocks, summarize
from kvtrace.transforms.stats.trace_shards import by_shard, chunk_tables

BLOCK_SIZE = 4  # as helpers.trace_of

rows_strategy = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.integers(0, 6).map(lambda t: t * 700.0),
        st.lists(st.integers(0, 9), max_size=6),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(rows_strategy, st.integers(1, 5))
def test_reuse_events_of_prefix_shards_are_the_whole_traces(rows, shards):
    trace = trace_of(rows)
    whole = reuse_events(CacheTrace.of(trace, BLOCK_SIZE))
    _, table = chunk_tables(trace, BLOCK_SIZE)
    clocked = clock_blocks(table, 0)
    parts = [summarize(part, 5) for _, part in by_shard(clocked, clocked["prefix_lo"], shards)]
    assert sum(p.total_tokens for p in parts) == whole.total_tokens
    assert sum(p.reused_tokens for p in parts) == int(whole.tokens.sum())
    assert sum(p.above_gpu_tokens for p in parts) == int(
        whole.tokens[whole.interval_tokens > 5].sum()
    )
    binned = np.bincount(
        np.searchsorted(INTERVAL_EDGES, whole.interval_tokens, side="right") - 1,
        weights=whole.tokens,
        minlength=len(INTERVAL_EDGES),
    ).astype(np.int64)
    assert (
        sum((p.interval_tokens for p in parts), np.zeros(len(INTERVAL_EDGES), np.int64)).tolist()
        == binned.tolist()
    )
    assert (
        sum((p.time_tokens for p in parts), np.zeros_like(whole.time_tokens)).tolist()
        == whole.time_tokens.tolist()
    )
    # the CCDF both engines report: the same points from the merged bins as from the whole
    merged = functools.reduce(ReuseSummary.merge, parts, ReuseSummary())
    x, y = merged.ccdf()
    assert (x.tolist(), y.tolist()) == tuple(v.tolist() for v in ccdf_curve(whole))
    assert y.tolist() == [ccdf_at(whole, v) for v in x.tolist()]  # exact at every point
