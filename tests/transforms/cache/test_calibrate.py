"""Calibration, pure: measured hits from a known cache are explained by its capacity, and logs
no capacity explains are told so."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.cache.cache_trace import CacheTrace
from kvtrace.transforms.cache.calibrate import fit_lru, fit_replays, measured_summary, verdict
from kvtrace.transforms.cache.policies import row_hits
from kvtrace.transforms.cache.stack_distance import stack_distances
from kvtrace.transforms.read.measured import NOT_MEASURED
from kvtrace.transforms.read.trace_io import Trace

BLOCK = 4


def cache_of(rows: list[list[int]]) -> CacheTrace:
    """Rows of whole blocks, one ms apart."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    trace = Trace(
        timestamp=np.arange(len(rows), dtype=np.float64),
        input_length=np.array([max(1, len(r)) * BLOCK for r in rows], dtype=np.int64),
        output_length=np.ones(len(rows), dtype=np.int64),
        offsets=offsets,
        ids=np.array([i for r in rows for i in r], dtype=np.int64),
        session=None,
        line=np.arange(1, len(rows) + 1),
        file_index=np.zeros(len(rows), dtype=np.int32),
        files=["t.jsonl"],
    )
    return CacheTrace.of(trace, BLOCK)


def shared_prefix_rows(seed: int, count: int = 200) -> list[list[int]]:
    """Requests that extend earlier ones' prefixes, so capacity decides what hits."""
    random = np.random.default_rng(seed)
    rows: list[list[int]] = []
    fresh = 0
    for _ in range(count):
        prefix = rows[random.integers(len(rows))] if rows and random.random() < 0.7 else []
        keep = prefix[: random.integers(len(prefix) + 1)]
        extra = int(random.integers(1, 5))
        rows.append([*keep, *range(fresh, fresh + extra)])
        fresh += extra
    return rows


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), pages=st.integers(1, 150))
def test_lru_hits_at_a_known_capacity_are_recovered_exactly(seed, pages):
    cache = cache_of(shared_prefix_rows(seed))
    # The measured values: the replay's own LRU (not the stack distances fitted against).
    measured = row_hits(cache, "lru", [pages * BLOCK])[0]
    distances = stack_distances(cache)
    fit = fit_lru(distances, measured)
    upto = fit.capacity_tokens_upto
    assert fit.capacity_tokens <= pages * BLOCK and (upto is None or pages * BLOCK <= upto)
    assert fit.mae_tokens == 0
    summary = measured_summary(distances, measured)
    assert fit.simulated_hit_rate == summary.hit_rate
    assert verdict(summary, fit, BLOCK) is None


def test_requests_without_a_count_are_left_out():
    cache = cache_of(shared_prefix_rows(7))
    measured = row_hits(cache, "lru", [40 * BLOCK])[0]
    measured[::2] = NOT_MEASURED
    distances = stack_distances(cache)
    fit = fit_lru(distances, measured)
    assert fit.mae_tokens == 0 and fit.capacity_tokens <= 40 * BLOCK
    assert measured_summary(distances, measured).requests == 100


def test_replayed_policies_fit_over_their_grid():
    cache = cache_of(shared_prefix_rows(3))
    grid = [0, 20 * BLOCK, 60 * BLOCK, 200 * BLOCK]
    hits = row_hits(cache, "prefix-lru", grid)
    prompt = int(cache.tokens.sum())
    fit = fit_replays("prefix-lru", grid, hits, hits[2], prompt)
    assert fit.capacity_tokens == 60 * BLOCK and fit.mae_tokens == 0
    assert fit.curve_mae_tokens.tolist()[2] == 0 and min(fit.curve_mae_tokens[[0, 1, 3]]) > 0


def test_hits_beyond_the_infinite_cache_are_told_as_a_shared_cache():
    cache = cache_of(shared_prefix_rows(5))
    distances = stack_distances(cache)
    # Every request says its whole first block was cached, first uses too: another replica's.
    measured = np.full(cache.rows, BLOCK, dtype=np.int64)
    summary = measured_summary(distances, measured)
    said = verdict(summary, fit_lru(distances, measured), BLOCK)
    assert summary.above_ceiling > 0.01 * cache.rows
    assert said is not None and "shared across replicas" in said


def test_counts_in_another_block_size_are_told_so():
    cache = cache_of(shared_prefix_rows(11))
    distances = stack_distances(cache)
    # The engine's blocks are 6 tokens: what it cached is in multiples of 6, not of 4.
    measured = (row_hits(cache, "lru", [10**6])[0] // 12) * 6
    summary = measured_summary(distances, measured)
    said = verdict(summary, fit_lru(distances, measured), BLOCK)
    assert summary.common_divisor % BLOCK and said is not None and "block size" in said
