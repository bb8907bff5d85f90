"""The id map's version is anchored in a folder of marks (beside the salt file, or given): a commit
refuses a map behind its mark or no longer holding the marked record (rolled back, restored from
an older backup, replaced), whatever holds the salt, and a mark changed without the salt is
refused itself.

The whole CLI runs; the unit tests are in tests/transforms/ids/test_anchor.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from helpers import anonymize_night, chat, write_jsonl
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.ids import anchor
from kvtrace.transforms.ids.map_record import map_key

SALT = b"anchor-test-salt-of-32-bytes!!!!"


KEY = map_key(SALT)


MAP_ID = "a" * 32


def _salt(folder: Path) -> SaltSource:
    (folder / "salt").write_bytes(SALT)
    return SaltSource("file", str(folder / "salt"))


def _mark(marks: str, map_id: str = MAP_ID) -> dict:
    return anchor.read_mark(anchor.mark_path(marks, map_id), map_id, KEY)


def _night(folder: Path, day: int) -> Path:
    records = [
        chat(
            i + 3 * day,
            day * 86_400_000 + 1_000 + 611 * i,
            f"user-{day}-{i % 5}",
            rotate=(i + day) % 4,
        )
        for i in range(20)
    ]
    return write_jsonl(folder / f"night{day}.jsonl", records)


@pytest.mark.slow  # four nights
def test_a_map_restored_from_an_older_backup_is_not_extended(tiny_tokenizer, tmp_path, capsys):
    """What the error messages' 'restore from a backup' could do with an older backup: refused
    at the commit in one line, nothing published; the newest version restored, the night runs."""
    salt = _salt(tmp_path)
    common = ["--salt-file", salt.where, "--hash-shards", "2"]
    map_dir = tmp_path / "map"
    nights = [_night(tmp_path, day) for day in range(3)]
    assert (
        anonymize_night(
            tiny_tokenizer, [nights[0]], tmp_path / "out0", "--id-map", str(map_dir), *common
        )
        == 0
    )
    shutil.copytree(map_dir, tmp_path / "backup1")
    assert (
        anonymize_night(
            tiny_tokenizer, [nights[1]], tmp_path / "out1", "--id-map", str(map_dir), *common
        )
        == 0
    )
    shutil.copytree(map_dir, tmp_path / "backup2")
    shutil.rmtree(map_dir)
    shutil.copytree(tmp_path / "backup1", map_dir)
    capsys.readouterr()
    assert (
        anonymize_night(
            tiny_tokenizer, [nights[2]], tmp_path / "out2", "--id-map", str(map_dir), *common
        )
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "at version 1, but version 2" in err, err
    assert not (tmp_path / "out2" / "manifest.json").exists()
    assert not (map_dir / "versions" / "000002.json").exists()
    shutil.rmtree(map_dir)
    shutil.copytree(tmp_path / "backup2", map_dir)
    assert (
        anonymize_night(
            tiny_tokenizer, [nights[2]], tmp_path / "out2", "--id-map", str(map_dir), *common
        )
        == 0
    )
    map_id = json.loads((map_dir / "versions" / "000003.json").read_bytes())["map_id"]
    assert _mark(anchor.marks_folder(salt, None), map_id)["version"] == 3


def _rolled_back_night_refused(tokenizer: str, tmp_path: Path, capsys, salted: list[str]) -> None:
    """Two nights, the map restored to its first version, a third night: refused in one line
    at the commit, nothing published, the map not extended."""
    map_dir = tmp_path / "map"
    mapped = ["--id-map", str(map_dir), "--hash-shards", "2", *salted]
    nights = [_night(tmp_path, day) for day in range(3)]
    assert anonymize_night(tokenizer, [nights[0]], tmp_path / "out0", *mapped) == 0
    shutil.copytree(map_dir, tmp_path / "backup1")
    assert anonymize_night(tokenizer, [nights[1]], tmp_path / "out1", *mapped) == 0
    shutil.rmtree(map_dir)
    shutil.copytree(tmp_path / "backup1", map_dir)
    capsys.readouterr()
    assert anonymize_night(tokenizer, [nights[2]], tmp_path / "out2", *mapped) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "at version 1, but version 2" in err, err
    assert not (tmp_path / "out2" / "manifest.json").exists()
    assert not (map_dir / "versions" / "000002.json").exists()


@pytest.mark.slow  # three nights a salt source
@pytest.mark.parametrize("source", ["file", "file with --id-map-marks", "environment"])
def test_a_rolled_back_map_is_refused_whatever_holds_the_salt(
    tiny_tokenizer, tmp_path, capsys, monkeypatch, source
):
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    given = tmp_path / "ops" / "marks"
    salt_file = ["--salt-file", _salt(tmp_path).where]
    salted, marks = {
        "file": (salt_file, tmp_path / "salt.id-map-marks"),
        "file with --id-map-marks": ([*salt_file, "--id-map-marks", str(given)], given),
        "environment": (["--id-map-marks", str(given)], given),
    }[source]
    if source == "environment":
        monkeypatch.setenv("KVTRACE_SALT", SALT.decode())
    _rolled_back_night_refused(tiny_tokenizer, tmp_path, capsys, salted)
    assert len(os.listdir(marks)) == 2  # the map's mark and its place, where the run was told


@pytest.mark.parametrize("salted", [[], ["--salt-secret", "projects/p/secrets/s/versions/1"]])
def test_an_id_map_without_a_place_for_its_marks_is_refused_before_any_work(
    tiny_tokenizer, tmp_path, capsys, monkeypatch, salted
):
    """A salt from the environment or a secret manager has no folder beside it: the run names
    one or is refused at once, in one line, before the salt is fetched or the map made."""
    monkeypatch.setenv("KVTRACE_SALT", SALT.decode())
    night = _night(tmp_path, 0)
    assert (
        anonymize_night(
            tiny_tokenizer, [night], tmp_path / "out", "--id-map", str(tmp_path / "map"), *salted
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs --id-map-marks DIR" in err, err
    assert not (tmp_path / "map").exists() and not (tmp_path / "out").exists()


def test_a_folder_of_marks_inside_the_map_is_refused(tiny_tokenizer, tmp_path, capsys):
    """Marks the map's own folder holds would be rolled back with it."""
    night = _night(tmp_path, 0)
    assert (
        anonymize_night(
            tiny_tokenizer,
            [night],
            tmp_path / "out",
            "--id-map",
            str(tmp_path / "map"),
            "--salt-file",
            _salt(tmp_path).where,
            "--id-map-marks",
            str(tmp_path / "map" / "marks"),
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "overlap" in err, err
    assert not (tmp_path / "map").exists()
