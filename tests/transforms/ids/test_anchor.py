"""The id map's version is anchored in a folder of marks (beside the salt file, or given): a commit
refuses a map behind its mark or no longer holding the marked record (rolled back, restored from
an older backup, replaced), whatever holds the salt, and a mark changed without the salt is
refused itself."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.errors import IdMapError, JobStopped
from kvtrace.transforms.ids import anchor, exclusive
from kvtrace.transforms.ids.exclusive import TEMP_MARK
from kvtrace.transforms.ids.map_record import keyed, map_key

SALT = b"anchor-test-salt-of-32-bytes!!!!"
KEY = map_key(SALT)
MAP_ID = "a" * 32


def chain(*tags: str) -> dict[int, bytes]:
    """Records 1..n as the walk reads them: each names the sha256 of the one before it."""
    records: dict[int, bytes] = {}
    for number, tag in enumerate(tags, 1):
        previous = hashlib.sha256(records[number - 1]).hexdigest() if records else None
        records[number] = (json.dumps({"tag": tag, "previous_sha256": previous}) + "\n").encode()
    return records


RECORDS = chain("one", "two", "three")


def _salt(folder: Path) -> SaltSource:
    (folder / "salt").write_bytes(SALT)
    return SaltSource("file", str(folder / "salt"))


def _marks(folder: Path) -> str:
    return anchor.marks_folder(_salt(folder), None)


def _check(
    marks: str, directory: str, version: int, records=RECORDS, map_id: str | None = MAP_ID
) -> None:
    anchor.check_anchor(marks, directory, version, map_id, records.__getitem__, KEY)


def _advance(
    marks: str, directory: str, version: int, records=RECORDS, map_id: str = MAP_ID
) -> None:
    anchor.advance_anchor(marks, directory, map_id, version, records[version], KEY)


def _mark(marks: str, map_id: str = MAP_ID) -> dict:
    return anchor.read_mark(anchor.mark_path(marks, map_id), map_id, KEY)


def test_a_map_at_or_past_its_mark_is_extended_and_one_behind_it_is_refused(tmp_path):
    marks, directory = _marks(tmp_path), str(tmp_path / "map")
    _check(marks, directory, 0, map_id=None)  # a first commit: no mark yet
    _advance(marks, directory, 2)
    _check(marks, directory, 2)
    _check(marks, directory, 3)  # a later version descending from the marked record
    with pytest.raises(JobStopped, match="at version 1, but version 2 of it was published"):
        _check(marks, directory, 1)
    with pytest.raises(JobStopped, match="rolled back or replaced"):  # another map's version 2
        _check(marks, directory, 2, RECORDS | {2: b"another map's record two\n"})
    _advance(marks, directory, 1)  # never backwards
    assert _mark(marks)["version"] == 2


def test_a_newest_record_that_does_not_descend_from_the_marked_one_is_refused(tmp_path):
    """Another history holding a copy of the marked record at its number (round 4): the walk
    from the newest record finds another record before it, and refuses."""
    marks, directory = _marks(tmp_path), str(tmp_path / "map")
    _advance(marks, directory, 2)
    other = chain("other one", "other two", "other three", "other four")
    with pytest.raises(JobStopped, match="does not descend from it"):
        _check(marks, directory, 4, other | {2: RECORDS[2]})
    longer = chain("one", "two", "three", "four", "five")  # the same history, further on
    _check(marks, directory, 5, longer)


def test_the_walk_reads_only_the_versions_between_the_mark_and_the_current_one(tmp_path):
    marks, directory = _marks(tmp_path), str(tmp_path / "map")
    records = chain(*map(str, range(10)))
    _advance(marks, directory, 7, records)
    read: list[int] = []
    anchor.check_anchor(marks, directory, 10, MAP_ID, lambda n: read.append(n) or records[n], KEY)
    assert read == [10, 9, 8, 7]


def test_every_spelling_and_copy_of_a_map_meets_the_mark_named_by_its_id(tmp_path):
    marks = _marks(tmp_path)
    _advance(marks, str(tmp_path / "map"), 2)
    assert anchor.mark_path(marks, MAP_ID) == f"{marks}/map-{MAP_ID}.json"
    with pytest.raises(JobStopped, match="at version 1, but version 2"):  # a copy elsewhere
        _check(marks, str(tmp_path / "elsewhere" / "copy"), 1)


def test_another_map_where_a_marked_map_was_is_refused_until_the_place_is_rebound(tmp_path):
    marks, directory = _marks(tmp_path), str(tmp_path / "map")
    _advance(marks, directory, 2)
    for newcomer in ("b" * 32, None):  # another map, or one from before ids
        with pytest.raises(JobStopped, match="kvtrace id-map rebind") as caught:
            _check(marks, directory, 1, chain("b"), map_id=newcomer)
        assert "\n" not in str(caught.value)
    anchor.rebind(marks, directory, "b" * 32, KEY)
    _advance(marks, directory, 1, chain("b"), map_id="b" * 32)  # as id_map.rebind_map marks it
    _check(marks, directory, 1, chain("b"), map_id="b" * 32)
    anchor.rebind(marks, directory, None, KEY)  # no map there: the place freed
    _check(marks, directory, 0, map_id=None)  # for a new map's first commit


@pytest.mark.parametrize(
    "pwd, spelled",
    [
        ("{tmp}/current", "{tmp}/current/map"),  # `cd current`: the link kept, as shells do
        ("{tmp}/release-1", "{tmp}/release-1/map"),  # `cd release-1`
        ("{tmp}/current/../current", "{tmp}/release-1/map"),  # `..`: not lexically foldable
        ("{tmp}/empty", "{tmp}/release-1/map"),  # stale: names another folder
        ("{tmp}/nothing", "{tmp}/release-1/map"),  # stale: names nothing
        ("current", "{tmp}/release-1/map"),  # not absolute
        ("", "{tmp}/release-1/map"),  # unset
    ],
)
def test_a_relative_map_is_spelled_from_the_working_folder_as_the_user_reached_it(
    tmp_path, monkeypatch, pwd, spelled
):
    (tmp_path / "release-1").mkdir()
    (tmp_path / "empty").mkdir()
    (tmp_path / "current").symlink_to(tmp_path / "release-1")
    monkeypatch.chdir(tmp_path / "current")  # the kernel's working folder: release-1
    monkeypatch.setenv("PWD", pwd.format(tmp=tmp_path))
    assert anchor.map_spelling("map/") == spelled.format(tmp=tmp_path)
    assert anchor.map_location("map") == str(tmp_path / "release-1" / "map")


def test_a_link_in_the_maps_path_repointed_leaves_its_spelling_bound_to_the_map(tmp_path):
    marks = _marks(tmp_path)
    (tmp_path / "live").mkdir()
    (tmp_path / "empty").mkdir()
    (tmp_path / "current").symlink_to(tmp_path / "live")
    spelled = str(tmp_path / "current" / "map")
    _advance(marks, spelled, 2)
    (tmp_path / "current").unlink()
    (tmp_path / "current").symlink_to(tmp_path / "empty")  # another place, the same spelling
    with pytest.raises(JobStopped, match="a link in its path leads elsewhere"):
        _check(marks, spelled, 0, map_id=None)  # no map there: not a new map from id 0
    _check(marks, str(tmp_path / "empty" / "map"), 0, map_id=None)  # another spelling: free
    anchor.rebind(marks, spelled, None, KEY)  # a new map there, on purpose
    _check(marks, spelled, 0, map_id=None)
    _advance(marks, spelled, 1, chain("b"), map_id="b" * 32)
    with pytest.raises(JobStopped, match="kvtrace id-map rebind"):  # both now bound to it
        _check(marks, str(tmp_path / "empty" / "map"), 0, map_id=None)


def test_marks_hold_the_place_by_its_digest_so_their_size_does_not_grow_with_its_path(tmp_path):
    marks = _marks(tmp_path)
    deep = os.fsdecode(os.fsencode(str(tmp_path)) + (b"/" + b"\xe9" * 250) * 16 + b"/map")
    _advance(marks, deep, 1)
    sizes = [os.path.getsize(os.path.join(marks, name)) for name in os.listdir(marks)]
    assert len(sizes) == 2 and max(sizes) < 512 < anchor.MAX_MARK_BYTES  # ~24 KB escaped
    _check(marks, deep, 1)
    with pytest.raises(JobStopped, match="kvtrace id-map rebind"):
        _check(marks, deep, 1, map_id="b" * 32)


def test_a_place_file_holding_its_path_as_written_before_digests_still_binds(tmp_path):
    marks, directory = _marks(tmp_path), str(tmp_path / "map")
    os.makedirs(marks)
    Path(anchor.place_path(marks, directory)).write_bytes(
        keyed(
            {
                "format": anchor.PLACE_FORMAT,
                "place": anchor.map_location(directory),
                "map_id": MAP_ID,
            },
            KEY,
        )
    )
    _check(marks, directory, 0, map_id=MAP_ID)
    with pytest.raises(JobStopped, match="kvtrace id-map rebind"):
        _check(marks, directory, 0, map_id=None)


def test_marks_are_named_from_the_places_bytes_whatever_their_encoding(tmp_path):
    marks = _marks(tmp_path)
    odd = os.fsdecode(os.fsencode(str(tmp_path)) + b"/night\xff")
    _advance(marks, odd, 1)
    assert anchor.read_location(anchor.place_path(marks, odd), odd, KEY)["map_id"] == MAP_ID
    _check(marks, odd, 1)


def test_a_mark_is_replaced_under_its_folder_s_lock(tmp_path, monkeypatch):
    marks, directory = _marks(tmp_path), str(tmp_path / "map")
    _advance(marks, directory, 1)
    monkeypatch.setattr(exclusive, "LOCK_WAIT_S", 0.0)
    with exclusive.folder_lock(marks):  # another run replacing the mark
        _advance(marks, directory, 1)  # at it: no lock needed
        with pytest.raises(JobStopped, match="held the lock of") as caught:
            _advance(marks, directory, 2)
    assert "\n" not in str(caught.value)
    assert _mark(marks)["version"] == 1
    _advance(marks, directory, 2)  # the lock released
    assert _mark(marks)["version"] == 2


def test_a_mark_of_the_committed_version_with_another_record_is_refused(tmp_path):
    marks, directory = _marks(tmp_path), str(tmp_path / "map")
    _advance(marks, directory, 2)
    with pytest.raises(JobStopped, match="names another record for version 2"):
        _advance(marks, directory, 2, RECORDS | {2: b"another map's record two\n"})
    assert _mark(marks)["record_sha256"] == hashlib.sha256(RECORDS[2]).hexdigest()


def test_marks_are_owner_only_beside_the_salt_one_per_map(tmp_path):
    marks = _marks(tmp_path)
    assert marks == str(tmp_path / "salt.id-map-marks")
    assert anchor.place_path(marks, str(tmp_path / "a") + "/") == anchor.place_path(
        marks, str(tmp_path / "a")
    )
    _advance(marks, str(tmp_path / "a"), 1)
    for name in os.listdir(marks):
        assert stat.S_IMODE(os.stat(os.path.join(marks, name)).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(marks).st_mode) == 0o700
    with pytest.raises(JobStopped, match="only a map's first commit finds no mark"):
        _check(marks, str(tmp_path / "b"), 1, {1: b"b's own record one\n"}, "b" * 32)


def test_a_mark_left_half_written_by_a_killed_run_is_removed_by_the_next(tmp_path):
    marks, directory = _marks(tmp_path), str(tmp_path / "map")
    _advance(marks, directory, 1)
    path = anchor.mark_path(marks, MAP_ID)
    stale = Path(f"{path}{TEMP_MARK}0a1b2c3d4e5f6a7b")  # nobody holds it: its writer is gone
    stale.write_bytes(b'{"format":')
    _advance(marks, directory, 2)
    assert not stale.exists() and sorted(os.listdir(marks)) == sorted(
        os.path.basename(p) for p in (path, anchor.place_path(marks, directory))
    )
    assert _mark(marks)["version"] == 2


def test_a_temp_file_a_living_writer_holds_stays(tmp_path):
    """A commit's temp file is held while it is written (storage.held): another run's cleanup
    leaves it, whatever host or PID namespace the writer is in."""
    marks, directory = _marks(tmp_path), str(tmp_path / "map")
    _advance(marks, directory, 1)
    path = anchor.mark_path(marks, MAP_ID)
    with exclusive._held_temp(path) as staged:
        _advance(marks, directory, 2)
        assert os.path.isfile(staged)
    assert exclusive.remove_stale_temp_files(marks, anchor.MARKS_FILES) == [
        os.path.basename(staged)
    ]


@pytest.mark.parametrize(
    "salt",
    [
        SaltSource("env", "KVTRACE_SALT"),
        SaltSource("gcp-secret", "projects/p/secrets/s/versions/1"),
    ],
)
def test_a_salt_that_is_not_a_file_needs_its_folder_of_marks_named(salt):
    with pytest.raises(IdMapError, match="needs --id-map-marks DIR") as caught:
        anchor.marks_folder(salt, None)
    assert "\n" not in str(caught.value) and salt.describe() in str(caught.value)
    assert anchor.marks_folder(salt, "gs://ops-only/marks/") == "gs://ops-only/marks"


def test_a_folder_of_marks_given_is_used_whatever_the_salt(tmp_path):
    assert anchor.marks_folder(_salt(tmp_path), str(tmp_path / "ops")) == str(tmp_path / "ops")


@pytest.fixture(scope="module")
def marked_at_2(tmp_path_factory) -> str:
    """A folder of marks at version 2, built once: each example alters one file and restores it."""
    marks = _marks(tmp_path_factory.mktemp("mark"))
    _advance(marks, "map", 2)
    return marks


@settings(max_examples=150, deadline=None)
@given(data=st.data(), which=st.sampled_from(["mark", "place"]))
def test_a_mark_changed_in_any_byte_without_the_salt_is_refused(marked_at_2, data, which):
    marks = marked_at_2
    directory = "map"  # one length in every example: the place is named absolute (the cwd's)
    path = (
        anchor.mark_path(marks, MAP_ID) if which == "mark" else anchor.place_path(marks, directory)
    )
    original = Path(path).read_bytes()
    raw = bytearray(original)
    start = data.draw(st.integers(0, len(raw) - 1), label="at")
    span = data.draw(st.integers(0, 8), label="span")
    raw[start : start + span] = data.draw(
        st.binary(max_size=8).filter(lambda b: b != raw[start : start + span]), label="put"
    )
    Path(path).write_bytes(bytes(raw))
    try:
        with pytest.raises(JobStopped, match="does not verify with this run's salt") as caught:
            _check(marks, directory, 2)
    finally:
        Path(path).write_bytes(original)
    assert "\n" not in str(caught.value)


def test_a_mark_of_another_map_or_salt_is_refused(tmp_path):
    marks, mine = _marks(tmp_path), str(tmp_path / "map")
    path = anchor.mark_path(marks, MAP_ID)
    os.makedirs(marks)
    Path(path).write_bytes(anchor.mark_bytes(mine, "b" * 32, 1, RECORDS[1], KEY))  # moved
    with pytest.raises(JobStopped, match="names another map"):
        _check(marks, mine, 1)
    Path(path).write_bytes(
        anchor.mark_bytes(mine, MAP_ID, 1, RECORDS[1], map_key(b"another-salt-of-enough-bytes-32!"))
    )
    with pytest.raises(JobStopped, match="does not verify"):
        _check(marks, mine, 1)


def test_a_committed_map_whose_folder_of_marks_holds_no_mark_of_it_is_refused(tmp_path):
    """Each commit marks its version, so only a first commit (version 0) finds no mark: a map
    with a version and no mark is refused in one line, whatever the folder is called (the
    salt file named through a link names another default folder), until rebound on purpose."""
    marks, directory = _marks(tmp_path), str(tmp_path / "map")
    _advance(marks, directory, 2)
    os.symlink(tmp_path / "salt", tmp_path / "linked")
    linked = anchor.marks_folder(SaltSource("file", str(tmp_path / "linked")), None)
    assert linked != marks
    for version in (1, 2, 3):  # rolled back, as marked, or later: none is told apart
        with pytest.raises(JobStopped, match="kvtrace id-map rebind") as caught:
            _check(linked, directory, version)
        assert "\n" not in str(caught.value) and "rolled back" in str(caught.value)
    _check(linked, directory, 0, map_id=None)  # a new map's first commit
    anchor.check_anchor(linked, directory, 1, MAP_ID, RECORDS.__getitem__, KEY, anew=True)
    _check(marks, directory, 2)  # its own folder still anchors it
