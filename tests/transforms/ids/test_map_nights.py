"""An id map version's history entry names the night that made it (format 6): its start, as its
manifest publishes it, and its identity. Read strictly: only entries kvtrace writes."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from kvtrace.transforms.errors import IdMapError
from kvtrace.transforms.ids import id_map, map_record
from kvtrace.transforms.ids.map_record import keyed, map_key, read_record

KEY = map_key(b"m" * 32)
IDENTITY = id_map.MapIdentity(KEY.salt_fingerprint, 4, {}, "scheme", {})


def night(base: id_map.MapVersion, time_from_ms: int, identity: str) -> id_map.Night:
    return id_map.Night(
        {
            "block_ids_from": base.next_id["blocks"],
            "sessions_from": base.next_id["sessions"],
            "time_from_ms": time_from_ms,
        },
        identity,
    )


def two_nights() -> dict:
    """Version 2's record, before its MAC: two nights, the second at 60 s."""
    empty = id_map.empty_version(IDENTITY)
    first = id_map.next_version(
        "m",
        empty,
        {"blocks": [], "sessions": []},
        {"blocks": 7, "sessions": 2},
        False,
        4,
        0,
        night(empty, 0, "a" * 64),
    )
    first = replace(first, record_sha256=hashlib.sha256(keyed(first.record(), KEY)).hexdigest())
    second = id_map.next_version(
        "m",
        first,
        {"blocks": [], "sessions": []},
        {"blocks": 3, "sessions": 1},
        False,
        4,
        0,
        night(first, 60_000, "b" * 64),
    )
    return second.record()


def test_a_versions_record_holds_each_nights_start_and_identity():
    record = two_nights()
    read = read_record(keyed(record, KEY), "v", KEY)
    assert [(e["start"], e["night"]) for e in read["history"]] == [
        ({"block_ids_from": 0, "sessions_from": 0, "time_from_ms": 0}, "a" * 64),
        ({"block_ids_from": 7, "sessions_from": 2, "time_from_ms": 60_000}, "b" * 64),
    ]


def _entry_edited(record: dict, number: int, **changes) -> dict:
    history = [dict(e) for e in record["history"]]
    history[number - 1] |= changes
    return record | {"history": history}


@pytest.mark.parametrize(
    "edit",
    [
        # a start not where the versions before it ended: the record proves those figures twice
        {"start": {"block_ids_from": 6, "sessions_from": 2, "time_from_ms": 60_000}},
        {"start": {"block_ids_from": 7, "sessions_from": 2, "time_from_ms": -1}},
        {"start": {"block_ids_from": 7, "sessions_from": True, "time_from_ms": 60_000}},
        {"start": {"block_ids_from": 7, "sessions_from": 2}},
        {"night": "B" * 64},
        {"night": None},
    ],
)
def test_a_night_entry_kvtrace_never_writes_is_refused(edit):
    with pytest.raises(IdMapError, match="history entry 2 is not one kvtrace writes"):
        read_record(keyed(_entry_edited(two_nights(), 2, **edit), KEY), "v", KEY)


def test_entries_without_a_night_only_come_first_and_only_format_6_names_nights():
    record = two_nights()
    old_after_new = record | {
        "history": [
            record["history"][0],
            {k: record["history"][1][k] for k in ("version", "added", "compacted")},
        ]
    }
    with pytest.raises(IdMapError, match="history entry 2"):
        read_record(keyed(old_after_new, KEY), "v", KEY)
    new_after_old = record | {
        "history": [
            {k: record["history"][0][k] for k in ("version", "added", "compacted")},
            record["history"][1],
        ]
    }
    assert read_record(keyed(new_after_old, KEY), "v", KEY)["history"] == new_after_old["history"]
    with pytest.raises(IdMapError, match="history entry 1"):  # format 5 named no night
        nightless = {
            k: v
            for k, v in record.items()
            if k not in ("map_id", "previous_sha256", *map_record.TIMES)
        }
        read_record(
            keyed(nightless | {"format_version": map_record.NIGHTLESS_FORMAT}, KEY), "v", KEY
        )
