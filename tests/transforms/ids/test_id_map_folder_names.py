"""A map's folder is listed by its name as spelled (storage.files_in): `--id-map 'maps/m[1]'`
counts its own versions and clears its own segments, never a sibling's a glob would match."""

from __future__ import annotations

from pathlib import Path

from kvtrace.transforms.ids import id_map, map_record
from kvtrace.transforms.ids.segments import SegmentFile

KEY = map_record.map_key(b"nightly-salt-kept-in-a-secret-manager")
CHECKSUM = {"sha256": "0" * 64, "bytes": 1}


def _one_night(directory: Path) -> id_map.MapVersion:
    """Version 1 committed, listing segments/000001-a1a1a1a1a1a1."""
    empty = id_map.empty_version(id_map.MapIdentity("f" * 16, 4, {}, "scheme", {}))
    winner = f"{directory}/segments/000001-a1a1a1a1a1a1/blocks-00000.parquet"
    published = id_map.next_version(
        str(directory),
        empty,
        {
            "blocks": [SegmentFile(winner, CHECKSUM | {"footer_sha256": "1" * 64}, CHECKSUM)],
            "sessions": [],
        },
        {"blocks": 1, "sessions": 0},
        False,
        64,
        0,
        id_map.Night({"block_ids_from": 0, "sessions_from": 0, "time_from_ms": 0}, "a" * 64),
    )
    (directory / "segments" / "000001-a1a1a1a1a1a1").mkdir(parents=True)
    id_map.publish(str(directory), empty, published, KEY)
    return published


def test_a_map_named_with_a_bracket_lists_its_own_versions_and_segments(tmp_path):
    own, sibling = tmp_path / "m[1]", tmp_path / "m1"  # the glob m[1] matches m1
    published = _one_night(own)
    for folder in (own, sibling):
        loser = folder / "segments" / "000001-loser"
        loser.mkdir(parents=True)
        (loser / "blocks-00000.parquet").write_bytes(b"x")
    (sibling / "versions").mkdir()
    (sibling / "versions" / "000002.json").write_bytes(b"{}")
    assert id_map.current_version_number(str(own)) == 1
    removed = id_map.discard_abandoned(str(own), published, KEY)
    loser = own / "segments" / "000001-loser"
    assert removed == [str(loser), str(loser / "blocks-00000.parquet")]
    assert (sibling / "segments" / "000001-loser" / "blocks-00000.parquet").exists()
