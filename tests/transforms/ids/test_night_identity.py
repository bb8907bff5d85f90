"""A night's identity: its rows on the map's clock, whatever clock they publish on, so a map
records a night alike under either --time-origin; a night recorded by its files' digests (the
identity before) is still found."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvtrace.transforms.ids import id_map
from kvtrace.transforms.trace_format import NIGHT_ORIGIN, TIME_ORIGIN_FIELD

START = {"block_ids_from": 7, "sessions_from": 2, "time_from_ms": 86_400_000}


def night_folder(folder: Path, times: list[int], *, own_clock: bool) -> tuple[dict, str]:
    """A night's folder as kvtrace writes it, its rows from the map's origin or its own."""
    folder.mkdir()
    shift = START["time_from_ms"] if own_clock else 0
    rows = [
        {"timestamp": t - shift, "input_length": 8, "output_length": 2, "hash_ids": [7, 8 + i]}
        for i, t in enumerate(times)
    ]
    shard = "".join(json.dumps(row) + "\n" for row in rows).encode()
    (folder / "trace-00000-of-00001.jsonl").write_bytes(shard)
    manifest = {
        "id_map": START,
        "files": ["stats.json", "trace-00000-of-00001.jsonl"],
        "sha256": {"stats.json": "1" * 64, "trace-00000-of-00001.jsonl": shard.hex()[:64]},
        **({TIME_ORIGIN_FIELD: NIGHT_ORIGIN} if own_clock else {}),
    }
    return manifest, str(folder)


def test_a_night_is_the_same_night_on_either_clock(tmp_path):
    times = [86_400_000, 86_400_613, 86_410_000]
    on_map = night_folder(tmp_path / "map", times, own_clock=False)
    own = night_folder(tmp_path / "own", times, own_clock=True)
    assert id_map.night_identity(*on_map) == id_map.night_identity(*own)
    assert id_map.files_identity(on_map[0]) != id_map.files_identity(own[0])
    later = night_folder(tmp_path / "later", [t + 1 for t in times], own_clock=True)
    assert id_map.night_identity(*later) != id_map.night_identity(*own)


@pytest.mark.parametrize("shift", [0, 86_400_000])
def test_only_a_rows_leading_timestamp_moves_and_a_line_not_kvtraces_stays(shift):
    row = b'{"timestamp": 5, "input_length": 1, "output_length": 0, "hash_ids": [5]}\n'
    moved = id_map._on_map_clock(row, shift)
    assert json.loads(moved) == json.loads(row) | {"timestamp": 5 + shift}
    for foreign in (b'{"timestamp": -5, "x": 1}\n', b'{"input_length": 1}\n', b"\xff" * 9):
        assert id_map._on_map_clock(foreign, shift) == foreign


def test_a_line_over_the_bound_is_hashed_in_pieces_only_its_first_a_row(monkeypatch):
    import io

    monkeypatch.setattr(id_map, "_READ_BYTES", 8)
    monkeypatch.setattr(id_map, "MAX_TRACE_LINE_BYTES", 16)
    data = b"a\n" + b"b" * 40 + b"\nc"
    pieces = list(id_map._pieces(io.BytesIO(data)))
    assert b"".join(piece for piece, _ in pieces) == data
    assert max(len(piece) for piece, _ in pieces) <= 16 + 8
    assert [starts for _, starts in pieces] == [True] + [True] + [False] * (len(pieces) - 3) + [
        True
    ]


def test_a_rerun_finds_a_night_recorded_by_either_identity():
    night = id_map.Night(START, "a" * 64, "b" * 64)
    entry = {"version": 1, "added": {}, "compacted": False, "start": START}
    empty = id_map.empty_version(id_map.MapIdentity("0" * 16, 4, {}, "scheme", {}))
    for recorded in ("a" * 64, "b" * 64):
        version = replace(empty, history=[entry | {"night": recorded}])
        assert id_map.recorded_start(version, *night.identities()) == START
    assert id_map.recorded_start(version, "c" * 64) is None
