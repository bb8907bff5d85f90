"""The id map's version is anchored in a folder of marks (beside the salt file, or given): a commit
refuses a map behind its mark or no longer holding the marked record (rolled back, restored from
an older backup, replaced), whatever holds the salt, and a mark changed without the salt is
refused itself."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import stat
from pathlib import Path

import pytest
from conftest import anonymize_night, chat, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.encode.salt import SaltSource
from transforms.errors import IdMapError, JobStopped
from transforms.ids import anchor, exclusive
from transforms.ids.exclusive import TEMP_MARK
from transforms.ids.map_record import map_key

SALT = b"anchor-test-salt-of-32-bytes!!!!"
KEY = map_key(SALT)
RECORDS = {1: b"record one\n", 2: b"record two\n", 3: b"record three\n"}


def _salt(folder: Path) -> SaltSource:
    (folder / "salt").write_bytes(SALT)
    return SaltSource("file", str(folder / "salt"))


def _marks(folder: Path) -> str:
    return anchor.marks_folder(_salt(folder), None)


def _check(path: str | None, directory: str, version: int, records=RECORDS) -> None:
    anchor.check_anchor(path, directory, version, records.__getitem__, KEY)


def test_a_map_at_or_past_its_mark_is_extended_and_one_behind_it_is_refused(tmp_path):
    path = anchor.mark_path(_marks(tmp_path), str(tmp_path / "map"))
    directory = str(tmp_path / "map")
    _check(path, directory, 1)  # no mark yet: not anchored
    anchor.advance_anchor(path, directory, 2, RECORDS[2], KEY)
    _check(path, directory, 2)
    _check(path, directory, 3)  # a later version holding the marked record
    with pytest.raises(JobStopped, match="at version 1, but version 2 of it was published"):
        _check(path, directory, 1)
    with pytest.raises(JobStopped, match="rolled back or replaced"):  # another map's version 2
        _check(path, directory, 2, RECORDS | {2: b"another map's record two\n"})
    anchor.advance_anchor(path, directory, 1, RECORDS[1], KEY)  # never backwards
    assert anchor.read_mark(path, directory, KEY)["version"] == 2


def test_a_mark_is_replaced_under_its_folder_s_lock(tmp_path, monkeypatch):
    directory = str(tmp_path / "map")
    path = anchor.mark_path(_marks(tmp_path), directory)
    anchor.advance_anchor(path, directory, 1, RECORDS[1], KEY)
    monkeypatch.setattr(exclusive, "LOCK_WAIT_S", 0.0)
    with exclusive.folder_lock(os.path.dirname(path)):  # another run replacing the mark
        anchor.advance_anchor(path, directory, 1, RECORDS[1], KEY)  # at it: no lock needed
        with pytest.raises(JobStopped, match="held the lock of") as caught:
            anchor.advance_anchor(path, directory, 2, RECORDS[2], KEY)
    assert "\n" not in str(caught.value)
    assert anchor.read_mark(path, directory, KEY)["version"] == 1
    anchor.advance_anchor(path, directory, 2, RECORDS[2], KEY)  # the lock released
    assert anchor.read_mark(path, directory, KEY)["version"] == 2


def test_a_mark_of_the_committed_version_with_another_record_is_refused(tmp_path):
    directory = str(tmp_path / "map")
    path = anchor.mark_path(_marks(tmp_path), directory)
    anchor.advance_anchor(path, directory, 2, RECORDS[2], KEY)
    with pytest.raises(JobStopped, match="names another record for version 2"):
        anchor.advance_anchor(path, directory, 2, b"another map's record two\n", KEY)
    assert anchor.read_mark(path, directory, KEY)["record_sha256"] == hashlib.sha256(
        RECORDS[2]).hexdigest()


def test_marks_are_owner_only_beside_the_salt_one_per_map(tmp_path):
    marks = _marks(tmp_path)
    first, second = (anchor.mark_path(marks, str(tmp_path / name)) for name in ("a", "b"))
    assert first != second and first.startswith(str(tmp_path / "salt.id-map-marks") + "/")
    assert anchor.mark_path(marks, str(tmp_path / "a") + "/") == first
    anchor.advance_anchor(first, str(tmp_path / "a"), 1, RECORDS[1], KEY)
    assert stat.S_IMODE(os.stat(first).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "salt.id-map-marks").st_mode) == 0o700
    _check(second, str(tmp_path / "b"), 1, {1: b"b's own record one\n"})  # b has no mark


def test_a_mark_left_half_written_by_a_killed_run_is_removed_by_the_next(tmp_path):
    directory = str(tmp_path / "map")
    path = anchor.mark_path(_marks(tmp_path), directory)
    anchor.advance_anchor(path, directory, 1, RECORDS[1], KEY)
    dead = 2**22 + 12345  # above the largest pid_max Linux allows: no process has it
    stale = Path(f"{path}{TEMP_MARK}{socket.gethostname()}-{dead}-0a1b2c3d")
    stale.write_bytes(b'{"format":')
    anchor.advance_anchor(path, directory, 2, RECORDS[2], KEY)
    assert not stale.exists() and os.listdir(os.path.dirname(path)) == [os.path.basename(path)]
    assert anchor.read_mark(path, directory, KEY)["version"] == 2


@pytest.mark.parametrize("salt", [SaltSource("env", "KVTRACE_SALT"),
                                  SaltSource("gcp-secret", "projects/p/secrets/s/versions/1")])
def test_a_salt_that_is_not_a_file_needs_its_folder_of_marks_named(salt):
    with pytest.raises(IdMapError, match="needs --id-map-marks DIR") as caught:
        anchor.marks_folder(salt, None)
    assert "\n" not in str(caught.value) and salt.describe() in str(caught.value)
    assert anchor.marks_folder(salt, "gs://ops-only/marks/") == "gs://ops-only/marks"


def test_a_folder_of_marks_given_is_used_whatever_the_salt(tmp_path):
    assert anchor.marks_folder(_salt(tmp_path), str(tmp_path / "ops")) == str(tmp_path / "ops")


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_mark_changed_in_any_byte_without_the_salt_is_refused(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("mark")
    directory = "map"  # one length in every example: the mark names it absolute (the cwd's)
    path = anchor.mark_path(_marks(folder), directory)
    anchor.advance_anchor(path, directory, 2, RECORDS[2], KEY)
    raw = bytearray(Path(path).read_bytes())
    start = data.draw(st.integers(0, len(raw) - 1), label="at")
    span = data.draw(st.integers(0, 8), label="span")
    raw[start:start + span] = data.draw(st.binary(max_size=8).filter(
        lambda b: b != raw[start:start + span]), label="put")
    Path(path).write_bytes(bytes(raw))
    with pytest.raises(JobStopped, match="does not verify with this run's salt") as caught:
        _check(path, directory, 2)
    assert "\n" not in str(caught.value)


def test_a_mark_of_another_map_or_salt_is_refused(tmp_path):
    mine, other = str(tmp_path / "map"), str(tmp_path / "other")
    path = anchor.mark_path(_marks(tmp_path), mine)
    os.makedirs(os.path.dirname(path))
    Path(path).write_bytes(anchor.mark_bytes(other, 1, RECORDS[1], KEY))  # moved in place
    with pytest.raises(JobStopped, match="names another map"):
        _check(path, mine, 1)
    Path(path).write_bytes(anchor.mark_bytes(mine, 1, RECORDS[1],
                                             map_key(b"another-salt-of-enough-bytes-32!")))
    with pytest.raises(JobStopped, match="does not verify"):
        _check(path, mine, 1)


def _night(folder: Path, day: int) -> Path:
    records = [chat(i + 3 * day, day * 86_400_000 + 1_000 + 611 * i, f"user-{day}-{i % 5}",
                    rotate=(i + day) % 4) for i in range(20)]
    return write_jsonl(folder / f"night{day}.jsonl", records)


@pytest.mark.slow  # four nights
def test_a_map_restored_from_an_older_backup_is_not_extended(tiny_tokenizer, tmp_path, capsys):
    """What the error messages' 'restore from a backup' could do with an older backup: refused
    at the commit in one line, nothing published; the newest version restored, the night runs."""
    salt = _salt(tmp_path)
    common = ["--salt-file", salt.where, "--hash-shards", "2"]
    map_dir = tmp_path / "map"
    nights = [_night(tmp_path, day) for day in range(3)]
    assert anonymize_night(tiny_tokenizer, [nights[0]], tmp_path / "out0", "--id-map",
                           str(map_dir), *common) == 0
    shutil.copytree(map_dir, tmp_path / "backup1")
    assert anonymize_night(tiny_tokenizer, [nights[1]], tmp_path / "out1", "--id-map",
                           str(map_dir), *common) == 0
    shutil.copytree(map_dir, tmp_path / "backup2")
    shutil.rmtree(map_dir)
    shutil.copytree(tmp_path / "backup1", map_dir)
    capsys.readouterr()
    assert anonymize_night(tiny_tokenizer, [nights[2]], tmp_path / "out2", "--id-map",
                           str(map_dir), *common) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "at version 1, but version 2" in err, err
    assert not (tmp_path / "out2" / "manifest.json").exists()
    assert not (map_dir / "versions" / "000002.json").exists()
    shutil.rmtree(map_dir)
    shutil.copytree(tmp_path / "backup2", map_dir)
    assert anonymize_night(tiny_tokenizer, [nights[2]], tmp_path / "out2", "--id-map",
                           str(map_dir), *common) == 0
    assert anchor.read_mark(anchor.mark_path(anchor.marks_folder(salt, None), str(map_dir)),
                            str(map_dir),
                            KEY)["version"] == 3


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
def test_a_rolled_back_map_is_refused_whatever_holds_the_salt(tiny_tokenizer, tmp_path, capsys,
                                                              monkeypatch, source):
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    given = tmp_path / "ops" / "marks"
    salt_file = ["--salt-file", _salt(tmp_path).where]
    salted, marks = {"file": (salt_file, tmp_path / "salt.id-map-marks"),
                     "file with --id-map-marks": ([*salt_file, "--id-map-marks", str(given)], given),
                     "environment": (["--id-map-marks", str(given)], given)}[source]
    if source == "environment":
        monkeypatch.setenv("KVTRACE_SALT", SALT.decode())
    _rolled_back_night_refused(tiny_tokenizer, tmp_path, capsys, salted)
    assert len(os.listdir(marks)) == 1  # the map's mark, where the run was told to keep it


@pytest.mark.parametrize("salted", [[], ["--salt-secret", "projects/p/secrets/s/versions/1"]])
def test_an_id_map_without_a_place_for_its_marks_is_refused_before_any_work(
        tiny_tokenizer, tmp_path, capsys, monkeypatch, salted):
    """A salt from the environment or a secret manager has no folder beside it: the run names
    one or is refused at once, in one line, before the salt is fetched or the map made."""
    monkeypatch.setenv("KVTRACE_SALT", SALT.decode())
    night = _night(tmp_path, 0)
    assert anonymize_night(tiny_tokenizer, [night], tmp_path / "out", "--id-map",
                           str(tmp_path / "map"), *salted) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs --id-map-marks DIR" in err, err
    assert not (tmp_path / "map").exists() and not (tmp_path / "out").exists()


def test_a_folder_of_marks_inside_the_map_is_refused(tiny_tokenizer, tmp_path, capsys):
    """Marks the map's own folder holds would be rolled back with it."""
    night = _night(tmp_path, 0)
    assert anonymize_night(tiny_tokenizer, [night], tmp_path / "out", "--id-map",
                           str(tmp_path / "map"), "--salt-file", _salt(tmp_path).where,
                           "--id-map-marks", str(tmp_path / "map" / "marks")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "overlap" in err, err
    assert not (tmp_path / "map").exists()
