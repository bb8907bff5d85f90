"""A map of engine hash captures names their format in its identity (engine_capture): a text
map's record holds no such key (it is the record kvtrace wrote before), a capture map's is one
of the formats kvtrace reads, only in the format that has it, and a map of one kind refuses a
run of another in one line (docs/ID_MAP.md: what a map's ids are over)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtrace.transforms.errors import IdMapError
from kvtrace.transforms.ids import id_map, map_record
from kvtrace.transforms.ids.map_record import keyed, map_key, read_record
from kvtrace.transforms.trace_format import CAPTURE_FORMATS, CAPTURE_SCHEME

KEY = map_key(b"c" * 32)
TEXT = id_map.MapIdentity(KEY.salt_fingerprint, 4, {"tokenizer.json": "ab" * 32}, "scheme", {})
DYNAMO = id_map.MapIdentity(
    KEY.salt_fingerprint, 4, {}, CAPTURE_SCHEME, {}, None, CAPTURE_FORMATS[0]
)


def _record(identity: id_map.MapIdentity) -> dict:
    empty = id_map.empty_version(identity)
    start = {"block_ids_from": 0, "sessions_from": 0, "time_from_ms": 0}
    night = id_map.Night(start, "a" * 64)
    version = id_map.next_version(
        "m",
        empty,
        {"blocks": [], "sessions": []},
        {"blocks": 1, "sessions": 0},
        False,
        4,
        0,
        night,
        id_map.NightTimes({3: 1}, 0),
    )
    return version.record()


def test_a_capture_maps_record_names_its_format_and_a_text_maps_none():
    assert "engine_capture" not in _record(TEXT)
    record = _record(DYNAMO)
    assert record["engine_capture"] == CAPTURE_FORMATS[0]
    read = id_map.MapVersion.from_record(read_record(keyed(record, KEY), "v", KEY))
    assert read.identity == DYNAMO
    assert (
        id_map.MapVersion.from_record(read_record(keyed(_record(TEXT), KEY), "v", KEY)).identity
        == TEXT
    )


@pytest.mark.parametrize("value", [None, "", "dynamo", 1, ["dynamo-request-trace"]])
def test_a_record_names_only_a_format_kvtrace_reads(value):
    record = _record(DYNAMO) | {"engine_capture": value}
    with pytest.raises(IdMapError, match="engine_capture"):
        read_record(keyed(record, KEY), "v", KEY)


def test_a_record_of_a_format_before_capture_maps_holds_none():
    record = {k: v for k, v in _record(DYNAMO).items() if k not in map_record.TIMES}
    record["format_version"] = map_record.TIMELESS_FORMAT
    with pytest.raises(IdMapError, match="unknown key 'engine_capture'"):
        read_record(keyed(record, KEY), "v", KEY)


def test_a_map_of_one_kind_refuses_a_run_of_another(tmp_path, monkeypatch):
    published = replace(id_map.MapVersion.from_record(_record(DYNAMO)), record_sha256="0" * 64)
    monkeypatch.setattr(id_map, "verified_newest", lambda directory, key: (published.record(), b""))
    lmcache = replace(DYNAMO, engine_capture=CAPTURE_FORMATS[1])
    for run, said in (
        (TEXT, "numbers engine hashes of --capture dynamo-request-trace, this run reads blocks"),
        (lmcache, "this run reads engine hashes of --capture lmcache-lookup-hashes"),
    ):
        with pytest.raises(IdMapError, match=said):
            id_map.open_map(str(tmp_path), run, KEY)
    assert id_map.open_map(str(tmp_path), DYNAMO, KEY).identity == DYNAMO
