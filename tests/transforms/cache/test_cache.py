"""Cache analyses, pure: reuse intervals, stack distances, policy replays, capacities."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.presets import load_model
from kvtrace.transforms.cache import policies
from kvtrace.transforms.cache.cache_trace import CacheTrace
from kvtrace.transforms.cache.capacity import kv_bytes_per_token, parse_capacity
from kvtrace.transforms.cache.policies import hit_rate
from kvtrace.transforms.cache.policy_names import POLICIES
from kvtrace.transforms.cache.reuse import ccdf_at, reuse_events, reuse_time_histogram
from kvtrace.transforms.cache.stack_distance import stack_distances
from kvtrace.transforms.read.trace_io import Trace


def trace_of(rows: list[tuple[float, int, list[int]]]) -> Trace:
    """A Trace from (timestamp ms, input_length, hash_ids) rows."""
    ids = [i for _, _, row in rows for i in row]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(row) for _, _, row in rows], out=offsets[1:])
    return Trace(
        timestamp=np.array([t for t, _, _ in rows], dtype=np.float64),
        input_length=np.array([n for _, n, _ in rows], dtype=np.int64),
        output_length=np.ones(len(rows), dtype=np.int64),
        offsets=offsets,
        ids=np.array(ids, dtype=np.int64),
        session=None,
        line=np.arange(1, len(rows) + 1),
        file_index=np.zeros(len(rows), dtype=np.int32),
        files=["t.jsonl"],
    )


def test_blocks_are_exact_prefixes_in_causal_order_with_their_real_sizes():
    # Row 2 comes first in time; ids 5 behind different parents are different prefixes.
    cache = CacheTrace.of(trace_of([(20, 600, [1, 5]), (10, 700, [2, 5])]), block_size=512)
    assert cache.tokens.tolist() == [512, 188, 512, 88] and cache.row_starts.tolist() == [0, 2, 4]
    assert cache.block[0] != cache.block[2] and cache.block[1] != cache.block[3]
    assert cache.timestamp_ms.tolist() == [10, 20]


def test_reuse_interval_is_the_tokens_between_the_two_uses():
    # Row 1: blocks A (512) B (100); row 2: A again, then C. Clock: A ends at 512, B at 612;
    # row 2's A starts at 612: interval 100.
    cache = CacheTrace.of(trace_of([(0, 612, [1, 2]), (3_000, 1024, [1, 3])]), block_size=512)
    events = reuse_events(cache)
    assert events.interval_tokens.tolist() == [100] and events.tokens.tolist() == [512]
    assert events.total_tokens == 612 + 1024
    assert ccdf_at(events, 99) == pytest.approx(512 / 1636)
    assert ccdf_at(events, 100) == 0.0
    assert [b["share"] for b in reuse_time_histogram(events)][1] == 1.0  # 3 s: "1-10 s"


def test_partial_last_blocks_shared_by_repeats_never_give_more_than_all_tokens():
    # The same 700-token request three times: its partial block (188 tokens) is shared.
    cache = CacheTrace.of(trace_of([(t, 700, [1, 2]) for t in (0, 1, 2)]), block_size=512)
    distances = stack_distances(cache)
    assert distances.infinite_hit_rate() == pytest.approx(2 / 3)
    for policy in POLICIES:
        assert hit_rate(cache, policy, 10_000) == pytest.approx(2 / 3)


def test_lru_evicts_a_prefix_head_before_its_tail_prefix_lru_keeps_the_path():
    # Two pages: request [A B], then [C], then [A B]. LRU touches A then B, so after C it evicted
    # A and the third request hits nothing; prefix-lru evicts the leaf B and hits A.
    rows = [(0, 1024, [1, 2]), (1, 512, [3]), (2, 1024, [1, 2])]
    cache = CacheTrace.of(trace_of(rows), block_size=512)
    assert hit_rate(cache, "lru", 1024) == 0.0
    assert hit_rate(cache, "prefix-lru", 1024) == pytest.approx(512 / 2560)
    assert stack_distances(cache).hit_rates(np.array([1024]))[0] == 0.0


rows_strategy = st.lists(
    st.tuples(st.integers(0, 50), st.lists(st.integers(0, 6), min_size=0, max_size=6)),
    min_size=1,
    max_size=40,
)


def random_trace(rows: list[tuple[int, list[int]]], block_size: int) -> CacheTrace:
    return CacheTrace.of(
        trace_of(
            [
                (t, max(1, len(ids) * block_size - (t % block_size)) if ids else 0, ids)
                for t, ids in rows
            ]
        ),
        block_size,
    )


@settings(max_examples=60, deadline=None)
@given(rows=rows_strategy, pages=st.integers(0, 12), slack=st.sampled_from([1, 1024]))
def test_lru_from_stack_distances_equals_the_replay_at_every_capacity(rows, pages, slack):
    cache = random_trace(rows, block_size=4)
    distances = stack_distances(cache)
    with pytest.MonkeyPatch.context() as patch:  # slack 1: stale heap entries dropped often
        patch.setattr(policies, "HEAP_SLACK", slack)
        replayed = {policy: hit_rate(cache, policy, pages * 4) for policy in POLICIES}
    assert distances.hit_rates(np.array([pages * 4]))[0] == pytest.approx(replayed["lru"])
    for policy in POLICIES:  # dropping stale entries changes nothing
        assert hit_rate(cache, policy, pages * 4) == pytest.approx(replayed[policy])


@settings(max_examples=60, deadline=None)
@given(rows=rows_strategy, pages=st.integers(0, 12), tier2=st.integers(0, 12))
def test_rates_are_bounded_monotone_and_reach_the_infinite_cache(rows, pages, tier2):
    cache = random_trace(rows, block_size=4)
    distances = stack_distances(cache)
    infinite = distances.infinite_hit_rate()
    for policy in POLICIES:
        assert 0.0 <= hit_rate(cache, policy, pages * 4) <= infinite + 1e-12
        assert hit_rate(cache, policy, 4 * (len(cache.block) + 1)) == pytest.approx(infinite)
    small, large = distances.hit_rates(np.array([pages * 4, (pages + tier2) * 4]))
    assert small <= large
    from_gpu, from_tier2 = distances.two_tier(pages * 4, tier2 * 4)
    # One LRU stack: the tiers together hit as one cache of both sizes; the GPU serves at least
    # what it would alone (a tier-2 hit can also let later GPU blocks of the prefix count).
    assert from_gpu + from_tier2 == pytest.approx(large) and from_gpu >= small - 1e-12


def test_capacities_in_tokens_or_bytes():
    assert parse_capacity("3M", None).tokens == 3_000_000
    assert parse_capacity(" 500k", None).tokens == 500_000
    assert parse_capacity("40GB", 1000).tokens == 40_000_000
    assert parse_capacity("1GiB", 1024).bytes == 2**30
    with pytest.raises(ValueError, match="in bytes: give --kv-bytes-per-token"):
        parse_capacity("40GB", None)
    with pytest.raises(ValueError, match="write tokens"):
        parse_capacity("lots", None)


def test_model_presets_give_kv_bytes_per_token():
    assert kv_bytes_per_token(load_model("qwen3-8b")) == 2 * 36 * 8 * 128 * 2
    assert kv_bytes_per_token(load_model("deepseek-r1")) == 61 * (512 + 64) * 2
    with pytest.raises(ValueError, match="--model gpt-9: no such preset.*qwen3-8b"):
        load_model("gpt-9")
    with pytest.raises(ValueError, match="missing kv_heads"):
        kv_bytes_per_token({"name": "x", "layers": 2, "head_dim": 4})


def test_a_warm_up_counts_only_the_later_rows():
    # Row 0 fills the cache; row 1 repeats it: over the last 50% of rows everything hits.
    cache = CacheTrace.of(trace_of([(0, 1024, [1, 2]), (1, 1024, [1, 2])]), block_size=512)
    distances = stack_distances(cache)
    assert distances.infinite_hit_rate(0.5) == 1.0 and distances.infinite_hit_rate() == 0.5
    assert distances.hit_rates(np.array([1024]), warmup_fraction=0.5)[0] == 1.0
    assert distances.two_tier(512, 512, warmup_fraction=0.5) == (
        0.5,
        0.5,
    )  # P2 on the GPU, P1 below
    for policy in POLICIES:
        assert hit_rate(cache, policy, 1024, warmup_fraction=0.5) == 1.0


def test_belady_keeps_what_is_needed_sooner_than_what_arrives():
    # One page. [A C] then [A B X] then [A B]: caching C or B (or X) would push out A, which
    # every later request needs; belady keeps A throughout, as prefix-lru does here.
    rows = [(1000, 600, [1, 3]), (4000, 1500, [1, 2, 9]), (5000, 1000, [1, 2])]
    cache = CacheTrace.of(trace_of(rows), block_size=512)
    rates = {policy: hit_rate(cache, policy, 512) for policy in POLICIES}
    assert rates["belady"] == pytest.approx(1024 / 3100)
    assert rates["belady"] >= max(rates.values())
