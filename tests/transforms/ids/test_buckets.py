import numpy as np

from transforms.ids.buckets import BUCKET_MS, buckets_of, first_offsets, plan_shards


def test_buckets_floor_negative_positive_and_fractional_times():
    times = np.array([0, BUCKET_MS - 1, BUCKET_MS, -1])
    assert buckets_of(times).tolist() == [0, 0, 1, -1]
    assert buckets_of(times + 0.5).tolist() == [0, 0, 1, -1]
    assert buckets_of(times).dtype == np.int64 == buckets_of(times + 0.5).dtype


def test_first_offsets_are_cumulative_in_bucket_order():
    assert first_offsets({5: 2, -1: 3, 2: 4}) == {-1: 0, 2: 3, 5: 7}
    assert first_offsets({0: 1}, start=10) == {0: 10}


def test_plan_shards_groups_consecutive_buckets_without_splitting_one():
    assert plan_shards({0: 3, 1: 3, 2: 3, 3: 10, 4: 1}, max_per_shard=6) == {
        0: 0, 1: 0, 2: 1, 3: 2, 4: 3
    }
    assert plan_shards({}, 5) == {}
