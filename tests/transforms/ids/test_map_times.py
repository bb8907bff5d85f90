"""An id map's record of when its nights published (format 7): requests per day, what a night's
clock resets are judged against, and the last published time, where the next night must begin.
Read strictly: only values kvtrace writes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtrace.transforms.errors import IdMapError, JobStopped
from kvtrace.transforms.ids import id_map, map_record
from kvtrace.transforms.ids.map_record import keyed, map_key, read_record
from kvtrace.transforms.trace_format import OUTPUT_LENGTH_FIELD

KEY = map_key(b"t" * 32)
IDENTITY = id_map.MapIdentity(KEY.salt_fingerprint, 4, {}, "scheme", {})
NO_FILES = {"blocks": [], "sessions": []}


def _night(base: id_map.MapVersion, time_from_ms: int, identity: str) -> id_map.Night:
    start = {
        "block_ids_from": base.next_id["blocks"],
        "sessions_from": base.next_id["sessions"],
        "time_from_ms": time_from_ms,
    }
    return id_map.Night(start, identity)


def _extended(base, night, times, compacted=False):
    added = {"blocks": 1, "sessions": 0}
    return id_map.next_version("m", base, NO_FILES, added, compacted, 4, 0, night, times)


def test_nights_add_their_days_and_push_the_last_published_time():
    empty = id_map.empty_version(IDENTITY)
    first = _extended(empty, _night(empty, 0, "a" * 64), id_map.NightTimes({3: 5, 4: 1}, 9_000))
    first = replace(first, record_sha256="0" * 64)  # the chain's link, as read
    second = _extended(first, _night(first, 9_500, "b" * 64), id_map.NightTimes({4: 2}, 20_000))
    assert (second.days, second.published_to_ms) == ({3: 5, 4: 3}, 20_000)
    read = read_record(keyed(second.record(), KEY), "v", KEY)
    assert id_map.MapVersion.from_record(read).days == {3: 5, 4: 3}
    # A compacting rerun records its night again but counts it once.
    again = _extended(second, _night(second, 9_500, "b" * 64), id_map.NightTimes({4: 2}, 1), True)
    assert (again.days, again.published_to_ms) == ({3: 5, 4: 3}, 20_000)


def test_a_new_night_must_begin_after_the_last_published_time():
    empty = id_map.empty_version(IDENTITY)
    first = _extended(empty, _night(empty, 0, "a" * 64), id_map.NightTimes({3: 2}, 2_000))
    with pytest.raises(JobStopped, match="at or before 2000 ms"):
        id_map.check_night_follows("m", first, _night(first, 2_000, "b" * 64))
    id_map.check_night_follows("m", first, _night(first, 2_001, "b" * 64))


def test_a_night_beginning_where_a_recorded_one_did_is_told_as_another_run_of_it():
    """Same start, other rows (say --emit-parents given the other way): not a cut to move."""
    empty = id_map.empty_version(IDENTITY)
    first = _extended(empty, _night(empty, 0, "a" * 64), id_map.NightTimes({3: 2}, 2_000))
    with pytest.raises(JobStopped, match="as the night .* recorded in version 1 did.*parent_row"):
        id_map.check_night_follows("m", first, _night(first, 0, "b" * 64))
    with pytest.raises(JobStopped, match="Cut nights on published times"):
        id_map.check_night_follows("m", first, _night(first, 1_000, "b" * 64))


@pytest.mark.parametrize(
    "days", [{"-1": 1}, {"01": 1}, {"3": 0}, {"3": True}, {"3": 1.0}, {"x": 1}, {"99999999": 1}]
)
def test_a_record_holds_only_days_kvtrace_writes(days):
    empty = id_map.empty_version(IDENTITY)
    record = _extended(empty, _night(empty, 0, "a" * 64), id_map.NightTimes({3: 1}, 0)).record()
    with pytest.raises(IdMapError, match="published_days"):
        read_record(keyed(record | {"published_days": days}, KEY), "v", KEY)


def test_a_format_6_record_is_read_without_times_and_with_them_refused():
    empty = id_map.empty_version(IDENTITY)
    record = _extended(empty, _night(empty, 0, "a" * 64), id_map.NightTimes({3: 1}, 0)).record()
    timeless = {k: v for k, v in record.items() if k not in map_record.TIMES}
    timeless["format_version"] = map_record.TIMELESS_FORMAT
    version = id_map.MapVersion.from_record(read_record(keyed(timeless, KEY), "v", KEY))
    assert (version.days, version.published_to_ms) == ({}, None)
    with pytest.raises(IdMapError, match="unknown key 'published_days'"):
        read_record(keyed(record | {"format_version": map_record.TIMELESS_FORMAT}, KEY), "v", KEY)


@pytest.mark.parametrize("edit", [{"published_to_ms": None}, {"published_days": {}}])
def test_days_and_the_last_time_are_recorded_together(edit):
    empty = id_map.empty_version(IDENTITY)
    record = _extended(empty, _night(empty, 0, "a" * 64), id_map.NightTimes({3: 1}, 0)).record()
    with pytest.raises(IdMapError, match="published_to_ms is"):
        read_record(keyed(record | edit, KEY), "v", KEY)


@pytest.mark.parametrize(
    ("granularity", "said"),
    [
        ({"timestamp_ms": 1, OUTPUT_LENGTH_FIELD: 1}, "Cut nights on published times (granules):"),
        (
            {"timestamp_ms": 500, OUTPUT_LENGTH_FIELD: 1},
            "(granules of 500 ms: --timestamp-granularity-ms)",
        ),
        (
            {"timestamp_ms": 1600, OUTPUT_LENGTH_FIELD: 16},
            "(granules of 1600 ms: --timestamp-granularity-ms, or without it the floor "
            "--length-granularity 16 sets)",
        ),
    ],
)
def test_a_cut_inside_a_granule_names_where_the_granule_came_from(granularity, said):
    """--length-granularity alone sets a timestamp granule (its floor): a night cut inside one
    is refused as with --timestamp-granularity-ms, and told so."""
    empty = id_map.empty_version(IDENTITY)
    first = _extended(empty, _night(empty, 0, "a" * 64), id_map.NightTimes({3: 2}, 2_000))
    with pytest.raises(JobStopped) as err:
        id_map.check_night_follows("m", first, _night(first, 1_000, "b" * 64), granularity)
    assert said in str(err.value)
