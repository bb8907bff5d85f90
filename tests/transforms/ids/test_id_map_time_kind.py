"""An id map records the kind of time its origin is (relative offsets or epoch dates) beside the
origin, under the MAC, and a night of the other kind is refused at the commit in one line, the
map not extended and nothing published: counted from a relative origin, epoch dates would
publish the wall clock. Maps keyed before the kind was recorded (format 4) are read as they are,
their kind their origin's, and their next commit writes format 5.

The unit tests; the whole CLI runs are in tests/e2e/test_id_map_time_kind_nights.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.ids import id_map
from kvtrace.transforms.ids.map_record import map_key

SALT = b"time-kind-test-salt-of-32-bytes!"


KEY = map_key(SALT)


EPOCH_MS = 1_700_000_000_000


IDENTITY = id_map.MapIdentity(KEY.salt_fingerprint, 4, {}, "scheme", {}, "probe")


def _base(origin_ms: int | None) -> id_map.MapVersion:
    return replace(id_map.empty_version(IDENTITY), timestamp_origin_ms=origin_ms)


@pytest.mark.parametrize(
    "origin_ms, night_ms, night_words",
    [(5_000, EPOCH_MS, "epoch dates"), (EPOCH_MS, 5_000, "relative times")],
)
def test_a_night_of_another_kind_than_the_maps_origin_is_refused(origin_ms, night_ms, night_words):
    with pytest.raises(JobStopped, match=f"timestamps are {night_words}, but") as caught:
        id_map.check_night_kind("map", _base(origin_ms), night_ms)
    assert "\n" not in str(caught.value) and "no trace was published" in str(caught.value)


@pytest.mark.parametrize(
    "origin_ms, night_ms",
    [(5_000, 6_000), (EPOCH_MS, EPOCH_MS + 1), (None, EPOCH_MS), (5_000, None)],
)
def test_a_night_of_the_maps_kind_or_a_maps_first_is_accepted(origin_ms, night_ms):
    id_map.check_night_kind("map", _base(origin_ms), night_ms)
