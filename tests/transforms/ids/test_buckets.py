import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.ids.buckets import (
    BUCKET_MS,
    buckets_of,
    first_offsets,
    plan_shards,
    shards_of,
)


def test_buckets_floor_negative_positive_and_fractional_times():
    times = np.array([0, BUCKET_MS - 1, BUCKET_MS, -1])
    assert buckets_of(times).tolist() == [0, 0, 1, -1]
    assert buckets_of(times + 0.5).tolist() == [0, 0, 1, -1]
    assert buckets_of(times).dtype == np.int64 == buckets_of(times + 0.5).dtype


def test_first_offsets_are_cumulative_in_bucket_order():
    assert first_offsets({5: 2, -1: 3, 2: 4}) == {-1: 0, 2: 3, 5: 7}
    assert first_offsets({0: 1}, start=10) == {0: 10}


def test_plan_shards_groups_consecutive_buckets_without_splitting_one():
    buckets = np.array([0, 1, 2, 3, 4])
    plan = plan_shards(buckets, np.array([3, 3, 3, 10, 1]), max_per_shard=6)
    assert plan.tolist() == [0, 2, 3, 4]
    assert plan_shards(np.array([], np.int64), np.array([], np.int64), 5).tolist() == []
    assert shards_of(buckets, plan).tolist() == [0, 0, 1, 2, 3]


def greedy(sizes: list[int], max_per_shard: int) -> list[int]:
    """The plan as a bucket-by-bucket fill: a shard takes the next bucket while it fits."""
    shards, filled = [], 0
    for bucket, size in enumerate(sizes):
        if not shards or filled + size > max_per_shard:
            shards, filled = shards + [bucket], 0
        filled += size
    return shards


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 20), max_size=40), st.integers(1, 30))
def test_plan_shards_is_the_bucket_by_bucket_fill(sizes, max_per_shard):
    buckets = np.arange(len(sizes), dtype=np.int64) * 7 - 3
    plan = plan_shards(buckets, np.array(sizes, np.int64), max_per_shard)
    assert plan.tolist() == buckets[greedy(sizes, max_per_shard)].tolist()
