"""Nightly exports with a persisted id map: nights concatenate into one run, reruns change
nothing, a killed run leaves the map usable, mismatched runs are refused.

The unit tests; the whole CLI runs are in tests/e2e/test_id_map_nights.py."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.errors import IdMapError, JobStopped
from kvtrace.transforms.ids import id_map, map_record
from kvtrace.transforms.ids.dense_ids import NUMBERED
from kvtrace.transforms.ids.segments import SegmentFile

SALT = "nightly-salt-kept-in-a-secret-manager"


KEY = map_record.map_key(SALT.encode())


CHECKSUM = {"sha256": "0" * 64, "bytes": 1}


PARQUET_CHECKSUM = CHECKSUM | {"footer_sha256": "1" * 64}


TOKENIZER = {"tokenizer.json": "ab" * 32}


RUN = "0123456789ab"  # a run id, as new_run_id gives


def written(directory, *names: str) -> dict:
    """What a run wrote: block segment files (relative names) with checksums."""
    return {
        "blocks": [
            SegmentFile(f"{directory}/{name}", PARQUET_CHECKSUM, CHECKSUM) for name in names
        ],
        "sessions": [],
    }


def night(base: id_map.MapVersion, time_from_ms: int = 0, identity: str = "a" * 64) -> id_map.Night:
    """A night extending base: its start where base stands."""
    return id_map.Night(
        {
            "block_ids_from": base.next_id["blocks"],
            "sessions_from": base.next_id["sessions"],
            "time_from_ms": time_from_ms,
        },
        identity,
    )


def test_next_version_numbers_after_the_base_and_records_each_night():
    identity = id_map.MapIdentity(KEY.salt_fingerprint, 4, TOKENIZER, "scheme", {})
    base = id_map.empty_version(identity)
    assert (
        id_map.next_version(
            "m", base, written("m"), {"blocks": 0, "sessions": 0}, False, 64, None, night(base)
        )
        is None
    )  # no request
    first = id_map.next_version(
        "m",
        base,
        written("m", f"segments/000001-{RUN}/blocks-00000.parquet"),
        {"blocks": 7, "sessions": 0},
        False,
        64,
        1234,
        night(base),
    )
    assert (first.version, first.next_id, first.timestamp_origin_ms) == (
        1,
        {"blocks": 7, "sessions": 0},
        1234,
    )
    assert first.history[-1] == {
        "version": 1,
        "added": {"blocks": 7, "sessions": 0},
        "compacted": False,
        "night": "a" * 64,
        "start": night(base).start,
    }
    assert first.previous_sha256 is None  # born with the map, its id from its first night:
    assert (
        first.map_id
        == id_map.map_id_of(base, night(base), first.checksums)
        != id_map.map_id_of(base, night(base, 0, "c" * 64), first.checksums)
    )  # another night's
    other_keys = {name: sum_ | {"sha256": "2" * 64} for name, sum_ in first.checksums.items()}
    assert id_map.map_id_of(base, night(base), other_keys) != first.map_id  # a night that
    # publishes the same bytes from other keys (its segments' digests) is another map
    stored = id_map.version_bytes(first, KEY)
    first = replace(first, record_sha256=hashlib.sha256(stored).hexdigest())  # as opened
    second = id_map.next_version(
        "m",
        first,
        written("m", f"segments/000002-{RUN}/blocks-00003.parquet"),
        {"blocks": 2, "sessions": 0},
        False,
        64,
        99,
        night(first, 60_000, "b" * 64),
    )
    assert second.timestamp_origin_ms == 1234  # the first origin stays
    assert (second.map_id, second.previous_sha256) == (first.map_id, first.record_sha256)
    assert second.segments("blocks") == 2 and second.next_id["blocks"] == 9
    assert second.history[-1]["start"] == {
        "block_ids_from": 7,
        "sessions_from": 0,
        "time_from_ms": 60_000,
    }
    read = map_record.read_record(id_map.version_bytes(second, KEY), "x", KEY)
    assert id_map.MapVersion.from_record(read) == second
    # A rerun of a night the map recorded adds nothing; another night of known ids only is
    # recorded, so the gate can confirm its start.
    assert (
        id_map.next_version(
            "m",
            second,
            written("m"),
            {"blocks": 0, "sessions": 0},
            False,
            64,
            99,
            night(second, 0, "a" * 64),
        )
        is None
    )
    known = id_map.next_version(
        "m",
        second,
        written("m"),
        {"blocks": 0, "sessions": 0},
        False,
        64,
        99,
        night(second, 120_000, "c" * 64),
    )
    assert known.version == 3 and known.next_id == second.next_id
    compacted = id_map.next_version(
        "m",
        second,
        written("m", f"segments/000003-{RUN}/blocks-00001.parquet"),
        {"blocks": 0, "sessions": 0},
        True,
        128,
        99,
        night(second),
    )
    assert compacted.files["blocks"] == [f"segments/000003-{RUN}/blocks-00001.parquet"]
    assert set(compacted.checksums) == {
        f"segments/000003-{RUN}/blocks-00001.parquet",
        f"segments/000003-{RUN}/blocks-00001.index.npz",
    }
    assert compacted.hash_shards == 128


def test_a_rerun_is_given_the_start_recorded_for_its_night():
    identity = id_map.MapIdentity(KEY.salt_fingerprint, 4, TOKENIZER, "scheme", {})
    base = id_map.empty_version(identity)
    first = id_map.next_version(
        "m",
        base,
        written("m"),
        {"blocks": 7, "sessions": 2},
        False,
        64,
        0,
        night(base, 0, "a" * 64),
    )
    second = id_map.next_version(
        "m",
        first,
        written("m"),
        {"blocks": 3, "sessions": 1},
        False,
        64,
        0,
        night(first, 60_000, "b" * 64),
    )
    # A compacting rerun of night "b" records it again at the map's current start: a rerun
    # is given the first start recorded, the original's.
    again = id_map.next_version(
        "m",
        second,
        written("m"),
        {"blocks": 0, "sessions": 0},
        True,
        64,
        0,
        night(second, 60_000, "b" * 64),
    )
    assert id_map.recorded_start(again, "b" * 64) == {
        "block_ids_from": 7,
        "sessions_from": 2,
        "time_from_ms": 60_000,
    }
    assert id_map.recorded_start(again, "a" * 64)["block_ids_from"] == 0
    assert id_map.recorded_start(again, "c" * 64) is None
    assert id_map.recorded_start(again, "c" * 64, "b" * 64)["time_from_ms"] == 60_000
    assert id_map.files_identity({"sha256": {"stats.json": "1" * 64}}) != id_map.files_identity(
        {"sha256": {"stats.json": "2" * 64}}
    )


def test_a_night_not_beginning_where_the_map_stands_is_not_recorded():
    identity = id_map.MapIdentity(KEY.salt_fingerprint, 4, TOKENIZER, "scheme", {})
    base = id_map.empty_version(identity)
    first = id_map.next_version(
        "m", base, written("m"), {"blocks": 7, "sessions": 2}, False, 64, 0, night(base)
    )
    with pytest.raises(JobStopped, match="does not begin where the id map"):
        id_map.next_version(
            "m",
            first,
            written("m"),
            {"blocks": 1, "sessions": 0},
            False,
            64,
            0,
            night(base, 0, "b" * 64),
        )


def test_a_map_of_an_older_format_is_refused_with_what_to_do():
    identity = id_map.MapIdentity(KEY.salt_fingerprint, 4, TOKENIZER, "scheme", {})
    old = {**id_map.empty_version(identity).record(), "format_version": 1}
    with pytest.raises(id_map.IdMapError, match="format version 1.*Start a new map"):
        map_record.read_record(map_record.record_bytes(old), "versions/000001.json", KEY)


@pytest.mark.parametrize(
    "checksum", [PARQUET_CHECKSUM | {"x": 1}, PARQUET_CHECKSUM | {"bytes": "1"}, CHECKSUM]
)
def test_a_commit_never_writes_a_record_its_reader_refuses(tmp_path, checksum):
    """Whatever a version was made from, publish commits only a record read_record reads: one
    whose checksums are not of the form kvtrace writes (a key it never writes, a size as a
    string, a segment without its footer's digest) is refused in one line, nothing written."""
    identity = id_map.MapIdentity("f" * 16, 4, {}, "scheme", {})
    empty = id_map.empty_version(identity)
    name = "segments/000001-a1a1a1a1a1a1/blocks-00000.parquet"
    new = id_map.next_version(
        str(tmp_path),
        empty,
        {"blocks": [SegmentFile(f"{tmp_path}/{name}", checksum, CHECKSUM)], "sessions": []},
        {"blocks": 1, "sessions": 0},
        False,
        64,
        0,
        night(empty),
    )
    (tmp_path / "segments" / "000001-a1a1a1a1a1a1").mkdir(parents=True)
    with pytest.raises(
        JobStopped, match="version 1 of the id map .* is not one kvtrace reads"
    ) as refused:
        id_map.publish(str(tmp_path), empty, new, KEY)
    assert "\n" not in str(refused.value)
    assert id_map.current_version_number(str(tmp_path)) == 0
    assert not (tmp_path / "versions").exists() or not any((tmp_path / "versions").iterdir())


def test_cleanup_keeps_published_and_live_segments(tmp_path):
    identity = id_map.MapIdentity("f" * 16, 4, {}, "scheme", {})
    published = id_map.next_version(
        str(tmp_path),
        id_map.empty_version(identity),
        written(tmp_path, "segments/000001-a1a1a1a1a1a1/blocks-00000.parquet"),
        {"blocks": 1, "sessions": 0},
        False,
        64,
        0,
        night(id_map.empty_version(identity)),
    )
    (tmp_path / "segments" / "000001-a1a1a1a1a1a1").mkdir(parents=True)
    id_map.publish(str(tmp_path), id_map.empty_version(identity), published, KEY)
    for folder in ("000001-a1a1a1a1a1a1", "000001-loser", "000002-live"):
        (tmp_path / "segments" / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / "segments" / folder / "blocks-00000.parquet").write_bytes(b"x")
    for folder in ("000001-killed", "000002-starting"):  # killed before its first file; live
        (tmp_path / "segments" / folder).mkdir()
    removed = id_map.discard_abandoned(str(tmp_path), published, KEY)
    segments = tmp_path / "segments"
    assert removed == [
        str(segments / "000001-killed"),
        str(segments / "000001-loser"),
        str(segments / "000001-loser" / "blocks-00000.parquet"),
    ]
    assert sorted(p.name for p in segments.iterdir()) == [
        "000001-a1a1a1a1a1a1",
        "000002-live",
        "000002-starting",
    ]
    left = {p.parent.name for p in (tmp_path / "segments").rglob("*.parquet")}
    assert left == {"000001-a1a1a1a1a1a1", "000002-live"}


def test_cleanup_racing_another_runs_cleanup_deletes_what_is_left(tmp_path, monkeypatch):
    """Every run clears the same leftovers: a file another run deleted after this one listed it
    is gone as wanted, never this run's failure."""
    identity = id_map.MapIdentity("f" * 16, 4, {}, "scheme", {})
    segments = tmp_path / "segments"
    for name in ("blocks-00000.parquet", "blocks-00000.index.npz"):
        (segments / "000001-killed").mkdir(parents=True, exist_ok=True)
        (segments / "000001-killed" / name).write_bytes(b"x")
    delete = id_map.storage.delete

    def after_another_run(paths: list[str]) -> None:
        for path in paths:
            os.remove(path)  # the other run's cleanup, first
        delete(paths)

    monkeypatch.setattr(id_map.storage, "delete", after_another_run)
    decided = replace(id_map.empty_version(identity), version=1)  # lists no file of it
    removed = id_map.discard_abandoned(str(tmp_path), decided, KEY)
    assert removed[0] == str(segments / "000001-killed") and len(removed) == 3
    assert not segments.joinpath("000001-killed").exists()


def test_a_folder_holding_what_no_map_holds_is_refused_before_it_is_opened(tmp_path):
    """A folder of someone else's is no map: refused in one line, nothing in it touched."""
    identity = id_map.MapIdentity("f" * 16, 4, {}, "scheme", {})
    (tmp_path / "versions").mkdir()
    (tmp_path / "CURRENT.tmp-0123456789abcdef").write_bytes(b"")  # a killed commit's
    assert id_map.open_map(str(tmp_path), identity, KEY).version == 0
    (tmp_path / "thesis.tmp-final").mkdir()
    with pytest.raises(IdMapError, match="holds files kvtrace did not write") as refused:
        id_map.open_map(str(tmp_path), identity, KEY)
    assert "thesis.tmp-final" in str(refused.value) and "\n" not in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "CURRENT.tmp-0123456789abcdef",
        "thesis.tmp-final",
        "versions",
    ]


def test_a_second_writer_is_refused_at_publish_time(tmp_path):
    identity = id_map.MapIdentity("f" * 16, 4, {}, "scheme", {})

    def version(base):
        return id_map.next_version(
            str(tmp_path),
            base,
            written(tmp_path),
            {"blocks": 1, "sessions": 0},
            False,
            64,
            0,
            night(base),
        )

    empty = id_map.empty_version(identity)
    id_map.publish(str(tmp_path), empty, version(empty), KEY)  # the other run, first to finish
    with pytest.raises(JobStopped, match="extended by another run"):
        id_map.publish(str(tmp_path), empty, version(empty), KEY)
    assert id_map.current_version_number(str(tmp_path)) == 1


def test_segment_files_group_by_the_shard_their_name_holds_in_path_order():
    def segment(path: str) -> SegmentFile:
        return SegmentFile(path, {}, {})

    files = [
        segment("m/segments/000002-b/blocks-00003.parquet"),
        segment("m/segments/000001-a/blocks-00003.parquet"),
        segment("m/segments/000001-a/blocks-00000.parquet"),
    ]
    grouped = id_map.segment_files_by_shard(files)
    assert {shard: [f.path for f in group] for shard, group in grouped.items()} == {
        0: ["m/segments/000001-a/blocks-00000.parquet"],
        3: ["m/segments/000001-a/blocks-00003.parquet", "m/segments/000002-b/blocks-00003.parquet"],
    }


def test_segments_settle_in_a_folder_their_content_names_whatever_run_wrote_them(tmp_path):
    rows = np.array([(1, 2, 0), (3, 4, 1)], dtype=NUMBERED)
    settled = []
    for run in ("0123456789ab", "ba9876543210"):
        directory = tmp_path / run
        shard = id_map.write_segment_shard(str(directory), 1, run, "blocks", 0, [], [rows])
        moved = id_map.settle_segments(str(directory), 1, {"blocks": [shard], "sessions": []})
        settled.append(
            (
                moved["blocks"][0]._replace(
                    path=id_map.relative(str(directory), moved["blocks"][0].path)
                ),
                sorted(str(p.relative_to(directory)) for p in directory.rglob("*")),
            )
        )
    assert settled[0] == settled[1]  # same name, same checksums, nothing else left
    assert settled[0][0].path.split("/")[1] != "000001-0123456789ab"
    other = id_map.write_segment_shard(str(tmp_path / "x"), 1, RUN, "blocks", 0, [], [rows[:1]])
    moved = id_map.settle_segments(str(tmp_path / "x"), 1, {"blocks": [other], "sessions": []})
    assert moved["blocks"][0].path.split("/")[-2] != settled[0][0].path.split("/")[1]


def _map_of_nights(directory: Path, *nights: str) -> list[bytes]:
    """A map of one version per night (no ids added: records only), as commits write it."""
    base = id_map.empty_version(
        id_map.MapIdentity(KEY.salt_fingerprint, 4, TOKENIZER, "scheme", {})
    )
    records = []
    for tag in nights:
        new = id_map.next_version(
            str(directory),
            base,
            written(directory),
            {"blocks": 0, "sessions": 0},
            False,
            64,
            99,
            night(base, 0, tag * 64),
        )
        records.append(id_map.publish(str(directory), base, new, KEY))
        base = replace(new, record_sha256=hashlib.sha256(records[-1]).hexdigest())
    return records


def test_a_maps_history_is_verified_whole_from_version_one_to_its_newest(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    records = _map_of_nights(ours, "a", "b", "c")
    assert id_map.verified_newest(str(ours), KEY)[1] == records[-1]
    _map_of_nights(theirs, "d", "e")
    nights = [entry["night"] for entry in id_map.recorded_history(str(ours), KEY)]
    assert nights == ["a" * 64, "b" * 64, "c" * 64]  # the newest record's: every night
    for spliced in (2, 1):  # each record verifies on its own, but follows no record of ours
        shutil.copy(
            theirs / "versions" / f"00000{spliced}.json", ours / "versions" / f"00000{spliced}.json"
        )
        with pytest.raises(IdMapError, match="do not form one chain") as caught:
            id_map.verified_newest(str(ours), KEY)
        assert "\n" not in str(caught.value)
        with pytest.raises(IdMapError, match="do not form one chain"):  # the run's open
            id_map.open_map(
                str(ours),
                id_map.empty_version(
                    id_map.MapIdentity(KEY.salt_fingerprint, 4, TOKENIZER, "scheme", {})
                ).identity,
                KEY,
            )
        # the gate confirms nights by the newest record, which names ours only
        assert [e["night"] for e in id_map.recorded_history(str(ours), KEY)] == nights


@pytest.mark.parametrize(
    "name", ["999999999999.json", "1.json", "0000001.json", "000000.json", "00001a.json"]
)
def test_a_version_name_kvtrace_never_writes_is_refused_before_it_is_read_as_a_number(
    tmp_path, name
):
    _map_of_nights(tmp_path, "a")
    (tmp_path / "versions" / name).write_bytes(b"")
    with pytest.raises(IdMapError, match="no version kvtrace writes") as refused:
        id_map.current_version_number(str(tmp_path))
    assert name in str(refused.value) and "\n" not in str(refused.value)


def test_a_stray_name_is_shown_escaped_and_cut_in_one_line(tmp_path):
    _map_of_nights(tmp_path, "a")
    (tmp_path / "versions" / ("0\n\x1b[2J" + "9" * 200 + ".json")).write_bytes(b"")
    with pytest.raises(IdMapError, match=r"versions/0\\u000a\\u001b\[2J9+,") as refused:
        id_map.current_version_number(str(tmp_path))
    assert "\n" not in str(refused.value) and "9" * 81 not in str(refused.value)


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(1, map_record.MAX_VERSION), max_size=8))
def test_the_first_missing_versions_are_found_in_the_gaps(present):
    committed = sorted(present)
    below = range(1, committed[-1] + 1) if committed else range(0)
    expected = [v for v in below if v not in present][: id_map.LOST_NAMED]
    assert id_map._missing_versions(committed) == expected


def test_something_other_than_a_file_in_place_of_current_is_refused_in_one_line(tmp_path):
    _map_of_nights(tmp_path, "a", "b")
    (tmp_path / "CURRENT").unlink()
    os.mkfifo(tmp_path / "CURRENT")  # an open would wait for a writer forever
    with pytest.raises(IdMapError, match="CURRENT is not a file kvtrace wrote") as refused:
        id_map.current_version_number(str(tmp_path))
    assert "\n" not in str(refused.value)
    (tmp_path / "CURRENT").unlink()
    (tmp_path / "CURRENT").write_bytes(b"not json")  # a hint whose bytes name no version
    assert id_map.current_version_number(str(tmp_path)) == 2


@pytest.mark.parametrize("folder", ["x-0123456789ab", "1-0123456789ab", "000001"])
def test_a_segment_folder_kvtrace_never_names_is_refused_in_one_line(tmp_path, folder):
    _map_of_nights(tmp_path, "a")
    (tmp_path / "segments" / folder).mkdir(parents=True)
    (tmp_path / "segments" / folder / id_map.COMMITTED_MARK).write_bytes(b"")
    with pytest.raises(IdMapError, match="no segment folder kvtrace writes") as refused:
        id_map.current_version_number(str(tmp_path))
    assert "\n" not in str(refused.value)


def test_a_run_that_committed_nothing_leaves_no_map_folder_it_made(tmp_path):
    """A new map's folders, made by the run's first segment file, go with its segment folder
    when the run ends without a commit; an existing map's folder stays."""
    directory = str(tmp_path / "map")
    with pytest.raises(JobStopped), id_map.run_segments(directory, 1, "run"):
        written = Path(id_map.segment_path(id_map.map_folder(directory), 1, "run", "blocks", 0))
        written.parent.mkdir(parents=True)
        written.write_bytes(b"rows")
        raise JobStopped("refused at the commit")
    assert not os.path.exists(directory)
    (tmp_path / "kept").mkdir()
    with id_map.run_segments(str(tmp_path / "kept"), 1, "run"):
        pass
    assert os.listdir(tmp_path / "kept") == []


def _map_with_a_segment(directory: Path) -> id_map.MapVersion:
    """A committed version 1 listing one segment file and its index, each 1 byte."""
    name = f"segments/000001-{RUN}/blocks-00000.parquet"
    empty = id_map.empty_version(id_map.MapIdentity(KEY.salt_fingerprint, 4, TOKENIZER, "s", {}))
    new = id_map.next_version(
        str(directory),
        empty,
        written(directory, name),
        {"blocks": 1, "sessions": 0},
        False,
        64,
        0,
        night(empty),
    )
    for path in (name, id_map.relative_index(name)):
        (directory / path).parent.mkdir(parents=True, exist_ok=True)
        (directory / path).write_bytes(b"x")
    id_map.publish(str(directory), empty, new, KEY)
    return new


def test_a_map_holding_what_its_version_lists_is_not_refused(tmp_path):
    version = _map_with_a_segment(tmp_path)
    id_map.check_listed_files(str(tmp_path), version)
    (tmp_path / "segments" / f"000001-{RUN}" / id_map.COMMITTED_MARK).unlink()
    id_map.finish_interrupted_commit(str(tmp_path), version)  # a commit killed before its marks
    assert (tmp_path / "segments" / f"000001-{RUN}" / id_map.COMMITTED_MARK).is_file()


@pytest.mark.parametrize(
    "damage, what",
    [
        (lambda folder: shutil.rmtree(folder), "missing"),
        (lambda folder: (folder / "blocks-00000.parquet").unlink(), "missing"),
        (lambda folder: (folder / "blocks-00000.parquet").write_bytes(b"xy"), "2 bytes, not the 1"),
        (
            lambda folder: (
                shutil.move(folder, folder.with_name("moved"))
                and folder.symlink_to(folder.with_name("moved"))
            ),
            "not a folder",
        ),
    ],
    ids=["folder gone", "file gone", "file resized", "folder a link"],
)
def test_a_map_missing_what_its_version_lists_is_refused_and_nothing_is_made(
    tmp_path, damage, what
):
    version = _map_with_a_segment(tmp_path)
    folder = tmp_path / "segments" / f"000001-{RUN}"
    (folder / id_map.COMMITTED_MARK).unlink()  # so the roll-forward would mark it
    damage(folder)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for check in (id_map.check_listed_files, id_map.finish_interrupted_commit):
        with pytest.raises(IdMapError, match=f"damaged.*{what}") as refused:
            check(str(tmp_path), version)
        assert "\n" not in str(refused.value)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    "place",
    [
        lambda map_, other: map_ / "versions" / "000002.json",
        lambda map_, other: map_ / "segments" / f"000001-{RUN}" / id_map.COMMITTED_MARK,
        lambda map_, other: map_ / "segments" / "000002-live",
        lambda map_, other: map_ / "segments",
    ],
    ids=["a version", "a mark", "a segment folder", "segments"],
)
def test_a_link_in_the_map_is_refused_and_nothing_through_it_is_deleted(tmp_path, place):
    directory, other = tmp_path / "map", tmp_path / "other"
    version = _map_with_a_segment(directory)
    kept = other / "000000-other" / "blocks-00000.parquet"  # abandoned, were it the map's
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"x")
    link = place(directory, other)
    if link.exists():
        link.rename(link.with_name("moved"))
    link.symlink_to(other)
    with pytest.raises(IdMapError, match="damaged.*not a") as refused:
        id_map.current_version_number(str(directory))
    assert "\n" not in str(refused.value)
    with contextlib.suppress(IdMapError):  # cleanup walks segments/ only: refused or not, ...
        id_map.discard_abandoned(str(directory), version, KEY)
    assert kept.is_file()  # ... it deletes nothing through a link


def test_a_map_whose_versions_list_no_file_needs_no_segments_folder(tmp_path):
    _map_of_nights(tmp_path, "a")
    identity = id_map.MapIdentity(KEY.salt_fingerprint, 4, TOKENIZER, "scheme", {})
    version = id_map.open_map(str(tmp_path), identity, KEY)
    assert version.version == 1 and not (tmp_path / "segments").exists()
    id_map.check_listed_files(str(tmp_path), version)
    id_map.finish_interrupted_commit(str(tmp_path), version)
    assert not (tmp_path / "segments").exists()
