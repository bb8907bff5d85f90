"""`audit --id-map`: a night extending an id map passes only as the night a version of the map
recorded, by its start (all three figures) and its identity (its files' digests); a map whose
versions record no night fails closed, saying what to do.

The whole CLI runs; the unit tests are in tests/transforms/stats/test_audit_map_nights.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from helpers import anonymize_night, chat, write_jsonl
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.ids import anchor, id_map, map_record
from kvtrace.transforms.ids.map_record import keyed, map_key
from kvtrace.transforms.stats import audit as gate

SALT = b"n" * 32


KEY = map_key(SALT)


def recorded(folder: Path) -> gate.MapVersionNumbering:
    manifest = json.loads((folder / "manifest.json").read_text())
    return gate.MapVersionNumbering(
        gate._start_figures(manifest["id_map"]), id_map.night_identity(manifest, str(folder))
    )


@pytest.mark.slow
def test_a_night_of_a_map_from_before_format_6_passes_once_anonymized_again(
    tiny_tokenizer, tmp_path
):
    """What the gate's flag says to do works: the rerun records the night in a version of its
    own (no id added), publishes the same rows, and the gate confirms it."""
    (tmp_path / "salt").write_bytes(SALT)
    mapped = ["--id-map", str(tmp_path / "map"), "--salt-file", str(tmp_path / "salt")]
    logs = [
        write_jsonl(
            tmp_path / f"night{day}.jsonl",
            [chat(i, day * 86_400_000 + 1_000 * i, f"u{i % 2}", rotate=day) for i in range(6)],
        )
        for day in (1, 2)
    ]
    for day, log in enumerate(logs, 1):
        assert anonymize_night(tiny_tokenizer, [log], tmp_path / f"n{day}", *mapped) == 0
    for number in (1, 2):  # as kvtrace wrote the map before nights were recorded
        path = tmp_path / "map" / "versions" / f"{number:06d}.json"
        record = {
            k: v
            for k, v in json.loads(path.read_bytes()).items()
            if k not in ("mac", "map_id", "previous_sha256", *map_record.TIMES)
        }
        record["history"] = [
            {k: e[k] for k in ("version", "added", "compacted")} for e in record["history"]
        ]
        path.write_bytes(keyed(record | {"format_version": map_record.NIGHTLESS_FORMAT}, KEY))
    marks = anchor.marks_folder(SaltSource("file", str(tmp_path / "salt")), None)
    Path(anchor.place_path(marks, str(tmp_path / "map"))).write_bytes(
        keyed(
            {  # before map ids
                "format": anchor.MARK_FORMAT,
                "map": anchor.map_location(str(tmp_path / "map")),
                "version": 2,
                "record_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            },
            KEY,
        )
    )
    numbering = gate.map_numbering(str(tmp_path / "map"), SALT)
    report = gate.audit(str(tmp_path / "n2"), tiny_tokenizer, numbering=numbering)
    assert [f for f in report["flags"] if "record none" in f], report["flags"]
    assert anonymize_night(tiny_tokenizer, [logs[1]], tmp_path / "again", *mapped) == 0
    for name in ("trace-00000-of-00001.parquet", "stats.json"):
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "n2" / name).read_bytes()
    numbering = gate.map_numbering(str(tmp_path / "map"), SALT)
    assert numbering[2:] == [recorded(tmp_path / "again")]
    versions = [id_map.read_version_record(str(tmp_path / "map"), n, KEY) for n in (2, 3)]
    assert versions[0]["next_id"] == versions[1]["next_id"]  # no id added
    report = gate.audit(str(tmp_path / "again"), tiny_tokenizer, numbering=numbering)
    assert report["publishable"], report["flags"]
