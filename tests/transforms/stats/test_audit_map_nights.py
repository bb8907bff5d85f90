"""`audit --id-map`: a night extending an id map passes only as the night a version of the map
recorded, by its start (all three figures) and its identity (its files' digests); a map whose
versions record no night fails closed, saying what to do."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from kvtrace.transforms.ids import id_map, map_record
from kvtrace.transforms.ids.map_record import keyed, map_key
from kvtrace.transforms.stats import audit as gate
from kvtrace.transforms.trace_format import CAPTURE_FIELD, CAPTURE_FORMATS, capture_manifest

SALT = b"n" * 32
KEY = map_key(SALT)
START = {"block_ids_from": 7, "sessions_from": 2, "time_from_ms": 60_000}
MANIFEST = {
    "id_map": START,
    "files": ["stats.json"],  # no trace shard: the identity's rows are none
    "sha256": {"stats.json": "1" * 64, "trace-00000-of-00001.jsonl": "2" * 64},
}


def flags(manifest: dict, numbering: list[gate.MapVersionNumbering]) -> list[str]:
    checked = gate._Gate()
    given = gate.Given(numbering=numbering)
    no_rows = id_map.NightRows(manifest).identity()  # as the audit reads no shard
    gate._confirm_recorded_start(
        gate._Confirming("no-shards", [], manifest, gate._Rows(), given, None, checked, no_rows)
    )
    return checked.flags


def recorded(manifest: dict) -> gate.MapVersionNumbering:
    """As maps recorded a night before its identity counted on the map's clock: still passes."""
    return gate.MapVersionNumbering(
        gate._start_figures(manifest["id_map"]), id_map.files_identity(manifest)
    )


def test_a_night_passes_only_as_a_version_recorded_it():
    numbering = [gate.MapVersionNumbering((0, 0, 0), "a" * 64), recorded(MANIFEST)]
    assert flags(MANIFEST, numbering) == []
    others = [
        MANIFEST | {"id_map": START | {"time_from_ms": 61_000}},  # another clock
        MANIFEST | {"id_map": START | {"sessions_from": 0}},
        MANIFEST | {"sha256": MANIFEST["sha256"] | {"stats.json": "3" * 64}},  # other rows
    ]
    for other in others:
        said = flags(other, numbering)
        assert len(said) == 1 and "not a night a version of the id map recorded" in said[0]


def test_a_night_passes_only_by_a_map_of_its_kind():
    """A map of captures confirms only a capture night of its format, a text map only a text
    night: the same start and identity recorded by a map of another kind is no version's."""
    dynamo, lmcache = CAPTURE_FORMATS
    captured = MANIFEST | {CAPTURE_FIELD: capture_manifest(dynamo)}
    by_dynamo = [replace(recorded(captured), capture=dynamo)]
    assert flags(captured, by_dynamo) == []
    for manifest, numbering, said in (
        (
            captured,
            [recorded(captured)],
            f"numbers blocks of text, this night engine hashes of --capture {dynamo}",
        ),
        (MANIFEST, by_dynamo, f"numbers engine hashes of --capture {dynamo}, this night blocks"),
        (
            MANIFEST | {CAPTURE_FIELD: capture_manifest(lmcache)},
            [replace(recorded(captured), capture=dynamo)],
            f"this night engine hashes of --capture {lmcache}",
        ),
    ):
        flagged = flags(manifest, numbering)
        assert len(flagged) == 1 and said in flagged[0], flagged


def test_a_map_recording_no_nights_fails_closed_saying_what_to_do():
    said = flags(MANIFEST, [gate.MapVersionNumbering(None, None)] * 2)
    assert len(said) == 1 and "versions 1-2 record none" in said[0]
    assert "anonymize it again with this kvtrace" in said[0]


def test_a_night_whose_shards_were_not_all_read_fails_closed():
    """Its identity binds every row: without a shard's bytes there is none to match, whatever
    the manifest's digests say (the former identity is theirs)."""
    checked = gate._Gate()
    given = gate.Given(numbering=[recorded(MANIFEST)])
    gate._confirm_recorded_start(
        gate._Confirming("unread", [], MANIFEST, gate._Rows(), given, None, checked, None)
    )
    assert len(checked.flags) == 1 and "a shard was not read" in checked.flags[0]


def test_map_numbering_reads_each_versions_night(tmp_path: Path):
    identity = id_map.MapIdentity(KEY.salt_fingerprint, 4, {}, "scheme", {})
    empty = id_map.empty_version(identity)
    night = id_map.Night(START | {"block_ids_from": 0, "sessions_from": 0}, "a" * 64)
    first = id_map.next_version(
        str(tmp_path),
        empty,
        {"blocks": [], "sessions": []},
        {"blocks": 7, "sessions": 2},
        False,
        4,
        0,
        night,
    )
    id_map.publish(str(tmp_path), empty, first, KEY)
    assert gate.map_numbering(str(tmp_path), SALT) == [
        gate.MapVersionNumbering((0, 0, 60_000), "a" * 64)
    ]
    # The same version as kvtrace wrote it before nights were recorded (format 5): read, and
    # its night unconfirmed.
    path = tmp_path / "versions" / "000001.json"
    record = {
        k: v
        for k, v in json.loads(path.read_bytes()).items()
        if k not in ("mac", "map_id", "previous_sha256", *map_record.TIMES)
    }
    record["history"] = [
        {k: e[k] for k in ("version", "added", "compacted")} for e in record["history"]
    ]
    path.write_bytes(keyed(record | {"format_version": map_record.NIGHTLESS_FORMAT}, KEY))
    assert gate.map_numbering(str(tmp_path), SALT) == [gate.MapVersionNumbering(None, None)]
