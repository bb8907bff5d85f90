"""An id map records the kind of time its origin is (relative offsets or epoch dates) beside the
origin, under the MAC, and a night of the other kind is refused at the commit in one line, the
map not extended and nothing published: counted from a relative origin, epoch dates would
publish the wall clock. Maps keyed before the kind was recorded (format 4) are read as they are,
their kind their origin's, and their next commit writes format 5."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from helpers import anonymize_night, chat, write_jsonl
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.errors import IdMapError
from kvtrace.transforms.ids import anchor, id_map, map_record
from kvtrace.transforms.ids.map_record import keyed, map_key, read_record

SALT = b"time-kind-test-salt-of-32-bytes!"
KEY = map_key(SALT)
EPOCH_MS = 1_700_000_000_000


def _night(folder: Path, name: str, start_ms: int, rotate: int = 0) -> Path:
    return write_jsonl(
        folder / f"{name}.jsonl", [chat(i, start_ms + 1_000 * i, rotate=rotate) for i in range(4)]
    )


@pytest.fixture
def relative_map(tiny_tokenizer, tmp_path) -> tuple[Path, list[str]]:
    """A map whose first night was a replay log's relative times."""
    (tmp_path / "salt").write_bytes(SALT)
    mapped = ["--id-map", str(tmp_path / "map"), "--salt-file", str(tmp_path / "salt")]
    assert (
        anonymize_night(
            tiny_tokenizer, [_night(tmp_path, "replay", 5_000)], tmp_path / "night1", *mapped
        )
        == 0
    )
    return tmp_path / "map", mapped


def _record(map_dir: Path, number: int) -> dict:
    return json.loads((map_dir / "versions" / f"{number:06d}.json").read_bytes())


def test_the_record_holds_its_origins_kind_under_the_mac(relative_map):
    map_dir, _ = relative_map
    record = _record(map_dir, 1)
    assert (
        record["format_version"] == map_record.FORMAT_VERSION
        and record["timestamp_origin_ms"] == 5_000
    )
    assert record["timestamp_kind"] == "relative"
    content = {k: v for k, v in record.items() if k != "mac"}
    for kind in ("epoch", None):  # even keyed by the salt's holder, one fact is never two
        with pytest.raises(IdMapError, match="timestamp_kind .* is not the kind of its origin"):
            read_record(keyed(content | {"timestamp_kind": kind}, KEY), "versions/000001.json", KEY)


def test_a_night_of_epoch_dates_on_a_relative_map_is_refused_even_one_adding_nothing(
    relative_map, tiny_tokenizer, tmp_path, capsys
):
    """The replay's own prompts, dated: no new id, so no new version, yet its times would be
    counted from the replay's origin all the same."""
    map_dir, mapped = relative_map
    capsys.readouterr()
    assert (
        anonymize_night(
            tiny_tokenizer, [_night(tmp_path, "dated", EPOCH_MS)], tmp_path / "night2", *mapped
        )
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "timestamps are epoch dates, but the id map" in err and "relative times" in err, err
    assert not (tmp_path / "night2").exists()
    assert id_map.current_version_number(str(map_dir)) == 1
    assert (
        anonymize_night(
            tiny_tokenizer,
            [_night(tmp_path, "replay2", 9_000_000, rotate=2)],
            tmp_path / "night3",
            *mapped,
        )
        == 0
    )


def test_a_map_keyed_before_the_kind_was_recorded_is_read_and_written_in_the_current_format(
    relative_map, tiny_tokenizer, tmp_path
):
    """A format-4 record is proved by its MAC: read as it is, its kind its origin's (a dated
    night still refused), and the next commit writes the current format with the kind. A
    format-4 record holding the kind is none kvtrace wrote."""
    map_dir, mapped = relative_map
    path = map_dir / "versions" / "000001.json"
    content = {
        k: v
        for k, v in _record(map_dir, 1).items()
        if k not in ("mac", "timestamp_kind", "map_id", "previous_sha256", *map_record.TIMES)
    }
    content["history"] = [
        {k: entry[k] for k in ("version", "added", "compacted")} for entry in content["history"]
    ]  # format 4 named no night
    old = keyed(content | {"format_version": map_record.UNKINDED_FORMAT}, KEY)
    path.write_bytes(old)  # as kvtrace wrote it before, and marked so
    marks = anchor.marks_folder(SaltSource("file", str(tmp_path / "salt")), None)
    place = Path(anchor.place_path(marks, str(map_dir)))  # a mark from before map ids
    place.write_bytes(
        keyed(
            {
                "format": anchor.MARK_FORMAT,
                "map": anchor.map_location(str(map_dir)),
                "version": 1,
                "record_sha256": hashlib.sha256(old).hexdigest(),
            },
            KEY,
        )
    )
    assert id_map.MapVersion.from_record(read_record(old, str(path), KEY)).timestamp_kind == (
        "relative"
    )
    with pytest.raises(IdMapError, match="unknown key 'timestamp_kind'"):
        read_record(
            keyed(
                content
                | {"format_version": map_record.UNKINDED_FORMAT, "timestamp_kind": "relative"},
                KEY,
            ),
            str(path),
            KEY,
        )
    assert (
        anonymize_night(
            tiny_tokenizer, [_night(tmp_path, "dated", EPOCH_MS)], tmp_path / "night2", *mapped
        )
        == 1
    )
    assert (
        anonymize_night(
            tiny_tokenizer,
            [_night(tmp_path, "replay2", 9_000_000, rotate=2)],
            tmp_path / "night3",
            *mapped,
        )
        == 0
    )
    assert path.read_bytes() == old
    newest = _record(map_dir, 2)
    assert (newest["format_version"], newest["timestamp_kind"]) == (
        map_record.FORMAT_VERSION,
        "relative",
    )
    assert newest["previous_sha256"] == hashlib.sha256(old).hexdigest()  # its id born here
    assert json.loads(place.read_bytes())["map_id"] == newest["map_id"]
    mark = Path(anchor.mark_path(marks, newest["map_id"]))
    assert (
        json.loads(mark.read_bytes())["record_sha256"]
        == hashlib.sha256((map_dir / "versions" / "000002.json").read_bytes()).hexdigest()
    )
