"""What the write protocol keeps beside an output (its lock, its staging names) and how it
names a run's letters: nothing is removed by its name alone, and a place is keyed by what it
is, not how it is spelled."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.ids.id_map import new_run_id
from kvtrace.transforms.write import publish
from kvtrace.transforms.write.publish import (
    FILE,
    FOLDER,
    Location,
    OutputRefused,
    lock_path,
    output_lock,
    plan_locations,
    staging_folder,
    staging_leftover,
)


def test_a_file_by_the_locks_name_is_locked_as_it_stands_and_kept(tmp_path):
    out = tmp_path / "X"
    report = tmp_path / ".X.kvtrace-lock"
    report.write_bytes(b'{"report": 1}')
    with output_lock(str(out)):
        with pytest.raises(publish.JobStopped):  # it is the lock all the same
            with output_lock(str(out)):
                pass
    assert report.read_bytes() == b'{"report": 1}'


def test_a_lock_kvtrace_made_goes_with_its_run(tmp_path):
    out = tmp_path / "X"
    with output_lock(str(out)):
        assert os.path.exists(lock_path(str(out)))
    assert not os.listdir(tmp_path)


def test_only_an_exact_staging_name_of_the_running_user_is_a_leftover(tmp_path):
    run = new_run_id()
    for name in (
        f".X.kvtrace-staging-{run}",
        f".X.kvtrace-staging-{run}.previous",
        ".X.kvtrace-staging-notes.json",
        f".X.kvtrace-staging-{run}x",
        f".Y.kvtrace-staging-{run}",
    ):
        (tmp_path / name).write_bytes(b"")
    assert sorted(n for n in os.listdir(tmp_path) if staging_leftover(str(tmp_path), n, "X")) == [
        f".X.kvtrace-staging-{run}",
        f".X.kvtrace-staging-{run}.previous",
    ]
    with output_lock(str(tmp_path / "X")):
        pass  # the previous output put back, the killed run's staging cleared, nothing else
    assert sorted(os.listdir(tmp_path)) == sorted(
        [
            ".X.kvtrace-staging-notes.json",
            f".X.kvtrace-staging-{run}x",
            f".Y.kvtrace-staging-{run}",
            "X",
        ]
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away takes root")
def test_another_users_file_by_a_staging_name_is_not_a_leftover(tmp_path):
    leftover = tmp_path / os.path.basename(staging_folder(str(tmp_path / "X"), new_run_id()))
    leftover.write_bytes(b"theirs")
    os.chown(leftover, 65534, 65534)
    with output_lock(str(tmp_path / "X")):
        pass
    assert leftover.read_bytes() == b"theirs"


def test_a_location_by_a_staging_name_is_refused(tmp_path):
    name = os.path.basename(staging_folder(str(tmp_path / "X"), new_run_id()))
    with pytest.raises(OutputRefused, match="stages its outputs under"):
        plan_locations([], [Location("--json", str(tmp_path / name))])
    plan_locations([], [Location("--json", str(tmp_path / ".X.kvtrace-staging-notes.json"))])


def test_a_location_that_is_anothers_lock_is_refused(tmp_path):
    out = tmp_path / "X"
    with pytest.raises(OutputRefused, match="lock file"):
        plan_locations(
            [],
            [
                Location("--json", lock_path(str(out))),
                Location("--output", str(out), FOLDER, writer="analyze"),
            ],
        )


@settings(max_examples=30, deadline=None)
@given(
    st.binary(min_size=1, max_size=20).filter(
        lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")
    )
)
def test_a_letters_key_is_the_places_whatever_its_bytes_or_spelling(name):
    import tempfile

    with tempfile.TemporaryDirectory() as base:
        os.mkdir(os.path.join(base, "real"))
        os.symlink("real", os.path.join(base, "link"))
        decoded = os.fsdecode(name)
        key = publish.output_key(os.path.join(base, "real", decoded))
        assert key == publish.output_key(os.path.join(base, "link", decoded))
        assert key != publish.output_key(os.path.join(base, "real", decoded + "2"))
        assert key != publish.output_key(os.path.join(base, decoded))


def _manifest(folder, **fields) -> None:
    (folder / "manifest.json").write_text(json.dumps({"format": "mooncake-trace", **fields}))


def test_a_manifest_kvtraces_readers_refuse_makes_no_output(tmp_path):
    _manifest(tmp_path)
    assert publish.folder_writer(str(tmp_path)) == ""
    plan_locations([], [Location("--json", str(tmp_path / "me" / "a.json"))])
    _manifest(tmp_path, sha256={}, records={"exported": 0})
    assert publish.folder_writer(str(tmp_path)) == "anonymize"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away takes root")
def test_another_users_manifest_makes_no_output(tmp_path):
    _manifest(tmp_path, sha256={}, records={"exported": 0})
    os.chown(tmp_path / "manifest.json", 65534, 65534)
    assert publish.folder_writer(str(tmp_path)) == ""
    plan_locations([], [Location("--json", str(tmp_path / "me" / "a.json"))])


def test_a_file_added_after_the_last_check_is_never_removed_with_the_previous(
    tmp_path, monkeypatch
):
    out = tmp_path / "analysis"
    with publish.folder_output(str(out), "analyze") as staged:
        with open(os.path.join(staged.path, "a.txt"), "wb") as handle:
            handle.write(b"first")
    real, checks = publish.check_output, []

    def someone_writes_after_the_check(output, own=frozenset(), flag="--output"):
        real(output, own, flag)
        checks.append(output)
        if len(checks) == 2:  # the check at the swap (the first is before the work)
            (out / "notes.txt").write_bytes(b"mine")

    monkeypatch.setattr(publish, "check_output", someone_writes_after_the_check)
    with pytest.raises(OutputRefused, match="gained files kvtrace did not write"):
        with publish.folder_output(str(out), "analyze") as staged:
            with open(os.path.join(staged.path, "a.txt"), "wb") as handle:
                handle.write(b"second")
    assert (out / "notes.txt").read_bytes() == b"mine"
    assert (out / "a.txt").read_bytes() == b"first"  # the previous output, put back whole


@pytest.mark.parametrize("pattern", ["D/*/../t*.jsonl", "E/*/t*.jsonl"])
def test_a_globs_folders_are_placed_as_the_kernel_walks_them(tmp_path, pattern):
    (tmp_path / "D" / "sub").mkdir(parents=True)
    (tmp_path / "E").mkdir()
    (tmp_path / "E" / "l").symlink_to(tmp_path / "D")
    with pytest.raises(OutputRefused, match="next run would read its own output"):
        plan_locations(
            [str(tmp_path / pattern)], [Location("--json", str(tmp_path / "D" / "t2.jsonl"))]
        )
    plan_locations([str(tmp_path / pattern)], [Location("--json", str(tmp_path / "D" / "r.json"))])


def test_nothing_is_written_inside_a_private_folder_kvtrace_made(tmp_path):
    from kvtrace.transforms import storage

    storage.make_folder(str(tmp_path / "letters"), private=True)
    if not storage.is_private_folder(str(tmp_path / "letters")):
        pytest.skip("no extended attributes here")
    with pytest.raises(OutputRefused, match="private folder of kvtrace's"):
        plan_locations([], [Location("--json", str(tmp_path / "letters" / "rejected-x.jsonl"))])
    plan_locations(
        [], [Location("--dead-letter", str(tmp_path / "letters"), FOLDER, private=True)]
    )  # its own runs write it still
    with publish.folder_output(str(tmp_path / "out"), "analyze"):
        pass  # staged in a private folder, published for all to read
    assert not storage.is_private_folder(str(tmp_path / "out"))


@pytest.mark.parametrize("name", [".X.kvtrace-lock", ".a b.jsonl.kvtrace-lock", ".\n.kvtrace-lock"])
def test_a_lock_name_is_never_an_output(tmp_path, name):
    """A folder by an output's lock name would be opened as that output's lock (EISDIR): every
    run of it stopped; a file published there is a new inode, which the next run of that
    output locks beside the holder's. Refused at the plan, in words that say why (a file that
    stands there is a lock as it stands: kept, test above)."""
    for writer in ("analyze", ""):
        folder = Location("--output", str(tmp_path / name), FOLDER, writer=writer)
        with pytest.raises(OutputRefused, match="locks an output by"):
            plan_locations([], [folder])
    with pytest.raises(OutputRefused, match="locks an output by"):
        plan_locations([], [Location("--json", str(tmp_path / name), FILE)])


def test_a_users_folder_others_may_write_is_refused_for_private_files_before_the_work(tmp_path):
    """kvtrace changes no folder it did not make: one other users may write cannot hold its
    private files, said at the plan; one only its owner writes is taken as it stands."""
    from kvtrace.transforms import storage

    shared, own = tmp_path / "shared", tmp_path / "own"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    own.mkdir(mode=0o755)
    with pytest.raises(OutputRefused, match="--dead-letter .* may be written by other users"):
        plan_locations([], [Location("--dead-letter", str(shared), FOLDER, private=True)])
    plan_locations([], [Location("--dead-letter", str(own), FOLDER, private=True)])
    assert shared.stat().st_mode & 0o777 == 0o777 and not storage.is_private_folder(str(own))
