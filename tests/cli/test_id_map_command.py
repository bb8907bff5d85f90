"""`kvtrace id-map upgrade`: a map written before keying (format 3) is keyed with its salt and
anchored, and nights extend it again; a wrong salt, no map, a salt with nowhere for its mark or
a rolled-back map is refused in one line, the map's bytes untouched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import anonymize_night, chat, write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.ids import anchor, map_record
from kvtrace.transforms.ids.map_record import keyless_checksum, map_key, record_bytes

SALT = b"id-map-command-salt-of-32-bytes!"
KEY = map_key(SALT)


def _night(folder: Path, day: int) -> Path:
    return write_jsonl(
        folder / f"night{day}.jsonl",
        [chat(i, 1_700_000_000_000 + day * 86_400_000 + 1_000 * i, rotate=day) for i in range(6)],
    )


@pytest.fixture(scope="module")
def built(tiny_tokenizer, tmp_path_factory) -> Path:
    """A keyed map of two nights, beside its salt file and folder of marks."""
    folder = tmp_path_factory.mktemp("built")
    (folder / "salt").write_bytes(SALT)
    for day in range(2):
        assert (
            anonymize_night(
                tiny_tokenizer,
                [_night(folder, day)],
                folder / f"out{day}",
                "--id-map",
                str(folder / "map"),
                "--salt-file",
                str(folder / "salt"),
            )
            == 0
        )
    return folder


def _copy(built: Path, tmp_path: Path) -> Path:
    (tmp_path / "salt").write_bytes(SALT)
    shutil.copytree(built / "map", tmp_path / "map")
    return tmp_path / "map"


def _as_format_3(map_dir: Path) -> None:
    """Every record as kvtrace wrote them before keying; no mark then (marks are keyed)."""
    for path in sorted((map_dir / "versions").glob("*.json")):
        record = json.loads(path.read_bytes())
        for later in (
            "mac",
            "timestamp_kind",
            "map_id",
            "previous_sha256",
            *map_record.TIMES,
        ):  # after format 3
            del record[later]
        record["history"] = [
            {k: entry[k] for k in ("version", "added", "compacted")} for entry in record["history"]
        ]  # format 3 named no night
        record["format_version"] = map_record.KEYLESS_FORMAT
        path.write_bytes(record_bytes(record | {"sha256": keyless_checksum(record)}))


def _records(map_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((map_dir / "versions").glob("*.json"))}


def _upgrade(*args: str) -> int:
    return main(["id-map", "upgrade", *args])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def test_a_format_3_map_upgraded_is_keyed_anchored_and_extended(
    built, tiny_tokenizer, tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    map_dir = _copy(built, tmp_path)
    _as_format_3(map_dir)
    salted = ["--salt-file", str(tmp_path / "salt")]
    capsys.readouterr()
    assert _upgrade(str(map_dir), *salted) == 0
    assert "keyed version(s) 1, 2; version 2 anchored" in capsys.readouterr().out
    for raw in _records(map_dir).values():
        assert map_record.read_record(raw, "record", KEY)["format_version"] == (
            map_record.FORMAT_VERSION
        )
    marks = anchor.marks_folder(SaltSource("file", str(tmp_path / "salt")), None)
    map_id = json.loads(_records(map_dir)["000002.json"])["map_id"]  # keying gave it
    assert anchor.read_mark(anchor.mark_path(marks, map_id), map_id, KEY)["version"] == 2
    keyed = _records(map_dir)
    assert _upgrade(str(map_dir), *salted) == 0  # rerun: verified, nothing rewritten
    assert "already keyed" in capsys.readouterr().out and _records(map_dir) == keyed
    assert (
        anonymize_night(
            tiny_tokenizer,
            [_night(tmp_path, 2)],
            tmp_path / "out2",
            "--id-map",
            str(map_dir),
            *salted,
        )
        == 0
    )
    assert (map_dir / "versions" / "000003.json").exists()


def test_refusals_are_one_line_and_leave_the_map_as_it_was(built, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    map_dir = _copy(built, tmp_path)
    _as_format_3(map_dir)
    before = _records(map_dir)
    (tmp_path / "other-salt").write_bytes(b"another-salt-of-enough-bytes-32!")
    assert _upgrade(str(map_dir), "--salt-file", str(tmp_path / "other-salt")) == 2
    assert "nothing was keyed" in _one_line(capsys)
    assert _upgrade(str(tmp_path / "no-map"), "--salt-file", str(tmp_path / "salt")) == 2
    assert "holds no id map version" in _one_line(capsys)
    assert _upgrade(str(map_dir)) == 2  # no salt: a random one could key nothing
    assert "needs the map's salt" in _one_line(capsys)
    monkeypatch.setenv("KVTRACE_SALT", SALT.decode())
    assert _upgrade(str(map_dir)) == 2
    assert "needs --id-map-marks DIR" in _one_line(capsys)
    assert _upgrade(str(map_dir), "--runner", "DirectRunner") == 2
    assert "unknown options: --runner" in _one_line(capsys)
    assert _records(map_dir) == before and not (tmp_path / "salt.id-map-marks").exists()
    assert _upgrade(str(map_dir), "--id-map-marks", str(tmp_path / "ops")) == 0  # from the env


def test_a_rolled_back_keyed_map_is_refused(built, tmp_path, capsys, monkeypatch):
    """Upgrading checks the mark as a commit does: it never anchors a rolled-back map."""
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    map_dir = _copy(built, tmp_path)
    salted = ["--salt-file", str(tmp_path / "salt")]
    assert _upgrade(str(map_dir), *salted) == 0  # anchored at version 2
    (map_dir / "versions" / "000002.json").unlink()
    (map_dir / "CURRENT").write_text('{"version": 1}\n')
    for folder in (map_dir / "segments").glob("000002-*"):
        shutil.rmtree(folder)
    capsys.readouterr()
    assert _upgrade(str(map_dir), *salted) == 2
    assert "at version 1, but version 2 of it was published" in _one_line(capsys)


def test_a_keyed_map_whose_versions_are_not_one_chain_is_neither_anchored_nor_bound(
    built, tmp_path, capsys, monkeypatch
):
    """Upgrade and rebind verify the history as a night opens the map: a version below the
    newest, rewritten and keyed again (it verifies on its own), breaks the chain."""
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    map_dir = _copy(built, tmp_path)
    salted = ["--salt-file", str(tmp_path / "salt")]
    assert _upgrade(str(map_dir), *salted) == 0  # anchored and bound at version 2
    first = map_dir / "versions" / "000001.json"
    record = json.loads(first.read_bytes())
    del record["mac"]
    first.write_bytes(map_record.keyed(record | {"chat_template_kwargs": {"other": 1}}, KEY))
    marks = tmp_path / "salt.id-map-marks"
    before = {p.name: p.read_bytes() for p in marks.iterdir()}
    capsys.readouterr()
    for action in ("upgrade", "rebind"):
        assert main(["id-map", action, str(map_dir), *salted]) == 2
        assert "do not form one chain" in _one_line(capsys)
    assert {p.name: p.read_bytes() for p in marks.iterdir()} == before


def test_a_map_gone_from_a_bound_place_is_refused_until_rebound(
    built, tiny_tokenizer, tmp_path, capsys, monkeypatch
):
    """The place remembers the map published there: a new map in its place (the old one's
    versions removed) is refused with the command to use, which frees the place on purpose."""
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    map_dir = _copy(built, tmp_path)
    salted = ["--salt-file", str(tmp_path / "salt")]
    assert _upgrade(str(map_dir), *salted) == 0  # anchored and bound here
    assert main(["id-map", "rebind", str(map_dir), *salted]) == 0  # the map found is its own
    map_id = json.loads(_records(map_dir)["000002.json"])["map_id"]
    assert f"bound to map {map_id}" in capsys.readouterr().out
    shutil.rmtree(map_dir)
    assert (
        anonymize_night(
            tiny_tokenizer,
            [_night(tmp_path, 2)],
            tmp_path / "out",
            "--id-map",
            str(map_dir),
            *salted,
        )
        == 1
    )
    assert f"kvtrace id-map rebind {map_dir}" in _one_line(capsys)
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert main(["id-map", "rebind", str(map_dir), *salted]) == 0
    assert "its place freed" in capsys.readouterr().out
    assert (
        anonymize_night(
            tiny_tokenizer,
            [_night(tmp_path, 2)],
            tmp_path / "out",
            "--id-map",
            str(map_dir),
            *salted,
        )
        == 0
    )


def test_a_map_whose_folder_of_marks_was_lost_is_refused_until_rebound(
    built, tiny_tokenizer, tmp_path, capsys, monkeypatch
):
    """A committed map meeting no mark (a new folder of marks, as a salt file named through a
    link gives) is refused in one line; `kvtrace id-map rebind` starts its marks on purpose."""
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    map_dir = _copy(built, tmp_path)
    salted = ["--salt-file", str(tmp_path / "salt")]
    night = [_night(tmp_path, 2)]
    capsys.readouterr()
    args = ["--id-map", str(map_dir), *salted]
    assert anonymize_night(tiny_tokenizer, night, tmp_path / "refused", *args) == 1
    said = capsys.readouterr().err
    assert "only a map's first commit finds no mark" in said and "id-map rebind" in said
    assert not (tmp_path / "refused").exists()
    assert main(["id-map", "rebind", str(map_dir), *salted]) == 0
    marks = anchor.marks_folder(SaltSource("file", str(tmp_path / "salt")), None)
    map_id = json.loads(_records(map_dir)["000002.json"])["map_id"]
    assert anchor.read_mark(anchor.mark_path(marks, map_id), map_id, KEY)["version"] == 2
    assert anonymize_night(tiny_tokenizer, night, tmp_path / "out", *args) == 0
