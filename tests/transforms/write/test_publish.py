"""The one write protocol (transforms/write/publish.py) for a single file and a folder: the
location checked and locked before the work, the output published whole when the work ends,
nothing of a failed run at the output's name."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from test_dead_letter_run import _staged_run

from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.write import publish
from kvtrace.transforms.write.publish import (
    DeadLetterRun,
    OutputRefused,
    file_output,
    folder_output,
    output_lock,
    recover_letters,
    restore_interrupted,
    staging_folder,
)


def _beside(path) -> list[str]:
    return sorted(os.listdir(path.parent))


def test_a_file_is_published_whole_when_the_work_ends(tmp_path):
    out = tmp_path / "requests.jsonl"
    with file_output(str(out)) as staged:
        with staged.create() as handle:
            handle.write(b"half")
            assert not out.exists()  # while it is written, only the staging path holds it
            handle.write(b" and whole\n")
    assert out.read_bytes() == b"half and whole\n"
    assert _beside(out) == ["requests.jsonl"]  # the lock goes with the run


def test_a_failed_run_leaves_the_previous_file_and_no_staged_copy(tmp_path):
    out = tmp_path / "page.html"
    out.write_bytes(b"previous")
    with pytest.raises(RuntimeError), file_output(str(out)) as staged:
        with staged.create() as handle:
            handle.write(b"new but unfinished")
            raise RuntimeError("the work failed")
    assert out.read_bytes() == b"previous"
    assert _beside(out) == ["page.html"]


def test_an_existing_file_is_refused_unless_it_is_to_be_overwritten(tmp_path):
    out = tmp_path / "trace.jsonl"
    out.write_bytes(b"someone's")
    with pytest.raises(OutputRefused, match="exists; --overwrite replaces it"):
        with file_output(str(out), overwrite=False):
            pytest.fail("the work must not start")
    with file_output(str(out), overwrite=True) as staged:
        staged.write(b"ours\n")
    assert out.read_bytes() == b"ours\n"


@pytest.mark.parametrize("make", [lambda p: p.mkdir(), lambda p: p.symlink_to("/etc/hostname")])
def test_a_folder_or_a_link_in_the_files_place_is_refused(tmp_path, make):
    out = tmp_path / "out.jsonl"
    make(out)
    with pytest.raises(OutputRefused):
        with file_output(str(out)):
            pytest.fail("the work must not start")


def test_a_second_run_on_the_same_file_is_refused_at_once(tmp_path):
    out = tmp_path / "x.jsonl"
    with file_output(str(out)):
        with pytest.raises(JobStopped, match="another kvtrace run"):
            with file_output(str(out)):
                pytest.fail("the work must not start")


def test_a_killed_runs_staged_file_is_cleared_by_the_next_run(tmp_path):
    out = tmp_path / "x.jsonl"
    killed = staging_folder(str(out), "0123456789ab")
    with open(killed, "wb") as handle:
        handle.write(b"half")
    with output_lock(str(out)):
        assert not os.path.exists(killed)


def test_a_folder_is_published_whole_and_withdrawn_when_there_is_nothing(tmp_path):
    out = tmp_path / "analysis"
    with folder_output(str(out), "analyze") as staged:
        assert not out.exists()  # published only when the work ends
        with open(os.path.join(staged.path, "a.txt"), "wb") as handle:
            handle.write(b"1")
    assert sorted(os.listdir(out)) == ["a.txt"]
    with folder_output(str(out), "analyze") as staged:  # its own earlier output is replaced
        staged.withdraw()
    assert (out / "a.txt").read_bytes() == b"1"
    assert _beside(out) == ["analysis"]


def test_a_published_folder_is_marked_with_what_its_run_published(tmp_path):
    """The mark is on the folder (the swap keeps it), not a file in it: the folder lists only
    the run's files; a copy of them without the mark is nobody's output."""
    out = tmp_path / "analysis"
    for text in ("1", "2"):  # the second run replaces its own output: the mark says so
        with folder_output(str(out), "analyze") as staged:
            for name in ("b.txt", "a.txt"):
                with open(os.path.join(staged.path, name), "w") as handle:
                    handle.write(text)
    assert sorted(os.listdir(out)) == ["a.txt", "b.txt"]
    assert json.loads(os.getxattr(out, publish.OUTPUT_MARK)) == {
        "writer": "analyze",
        "files": ["a.txt", "b.txt"],
    }
    assert publish.folder_writer(str(out)) == "analyze"
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in os.listdir(out):  # its files, as most copies take them
        shutil.copyfile(out / name, copy / name)
    assert publish.folder_writer(str(copy)) == ""
    with pytest.raises(OutputRefused, match=r"kvtrace did not write \(a.txt, b.txt\)"):
        with folder_output(str(copy), "analyze"):
            pytest.fail("the work must not start")


def test_a_folder_holding_what_the_command_does_not_write_is_refused(tmp_path):
    out = tmp_path / "analysis"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputRefused, match="notes.txt"):
        with folder_output(str(out), "analyze"):
            pytest.fail("the work must not start")
    (out / "notes.txt").unlink()
    (out / "analysis.txt").write_text("mine")  # a name analyze writes: unmarked, still mine
    with pytest.raises(OutputRefused, match="analysis.txt"):
        with folder_output(str(out), "analyze"):
            pytest.fail("the work must not start")


def _publish_output(staging: str, tmp_path) -> None:
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    os.rename(staging, tmp_path / "out")


def test_each_runs_letters_are_published_under_its_own_name(tmp_path):
    for run_id in ("aaaaaaaaaaaa", "bbbbbbbbbbbb"):
        run, staging = _staged_run(tmp_path, "dead", run_id)
        _publish_output(staging, tmp_path)
        assert not os.path.exists(run.published)  # staged, hidden, until the run settles
        assert run.settle(run_succeeded=True)
    assert sorted(os.listdir(tmp_path / "dead")) == [
        "rejected-aaaaaaaaaaaa.jsonl",
        "rejected-bbbbbbbbbbbb.jsonl",
    ]
    assert (tmp_path / "dead" / "rejected-aaaaaaaaaaaa.jsonl").read_text() == "aaaaaaaaaaaa\n"


def test_a_failed_runs_letters_follow_its_output_not_its_exit(tmp_path):
    """Failed after publishing its output (a full disk while tidying up): its letters are
    published; failed before: they go with the run."""
    after, staging = _staged_run(tmp_path, "dead", "aaaaaaaaaaaa")
    _publish_output(staging, tmp_path)
    assert after.settle(run_succeeded=False)
    before, _ = _staged_run(tmp_path, "dead", "bbbbbbbbbbbb")
    assert not before.settle(run_succeeded=False)
    assert os.listdir(tmp_path / "dead") == ["rejected-aaaaaaaaaaaa.jsonl"]


def test_a_killed_runs_letters_follow_its_output(tmp_path):
    """Killed after publishing its output: the next run publishes its letters; killed before:
    they go, as its output never came."""
    published, staging = _staged_run(tmp_path, "dead", "aaaaaaaaaaaa")
    os.rename(staging, tmp_path / "out")  # the output published, then the kill
    unpublished, _ = _staged_run(tmp_path, "dead", "bbbbbbbbbbbb")  # killed before its output
    restore_interrupted(str(tmp_path / "out"))  # as the next run's lock does first
    assert recover_letters(str(tmp_path / "dead"), str(tmp_path / "out")) == []  # settled
    assert os.listdir(tmp_path / "dead") == ["rejected-aaaaaaaaaaaa.jsonl"]


def test_a_killed_runs_letters_are_not_published_for_a_folder_that_only_has_its_inode(tmp_path):
    """The staging folder of a run killed before publishing, its inode given to the next
    folder at the output (ext4 reuses inodes): the next run's lock settles the pointer while
    the folder still stands (never published: dropped), so no later folder meets it."""
    killed, staging = _staged_run(tmp_path, "dead", "aaaaaaaaaaaa")
    with output_lock(str(tmp_path / "out")):
        os.makedirs(tmp_path / "out")  # whatever inode it is given
    assert recover_letters(str(tmp_path / "dead"), str(tmp_path / "out")) == []
    assert not [name for name in os.listdir(tmp_path / "dead") if name.startswith("rejected-")]


def test_letters_of_another_output_are_left_alone(tmp_path):
    other = DeadLetterRun(str(tmp_path / "dead"), str(tmp_path / "other"), "cccccccccccc")
    os.makedirs(staging_folder(str(tmp_path / "other"), "cccccccccccc"))
    other.begin(staging_folder(str(tmp_path / "other"), "cccccccccccc"))
    assert recover_letters(str(tmp_path / "dead"), str(tmp_path / "out")) == []
    assert os.listdir(tmp_path / "dead") == [os.path.basename(other.staging)]


def test_a_lock_file_its_holder_removed_is_no_lock(tmp_path, monkeypatch):
    """A run that opened the lock file just before its holder removed it must not count the
    removed file as the lock (the next run would lock the new one beside it): it retries."""
    out, lock = str(tmp_path / "x.jsonl"), tmp_path / ".x.jsonl.kvtrace-lock"
    locked = []

    def flock(handle: int, operation: int) -> None:
        if not locked:
            os.unlink(lock)  # the holder finishes between this run's open and its flock
        locked.append(os.fstat(handle).st_ino)
        real_flock(handle, operation)

    real_flock = publish.fcntl.flock
    monkeypatch.setattr(publish.fcntl, "flock", flock)
    with output_lock(out):
        assert len(locked) == 2 and os.stat(lock).st_ino == locked[-1]
    assert not lock.exists()


def test_the_lock_file_is_never_created_through_a_link(tmp_path):
    """O_NOFOLLOW: a link planted by the lock's name is refused in one line, its target never
    made."""
    victim = tmp_path / "elsewhere"
    (tmp_path / ".x.jsonl.kvtrace-lock").symlink_to(victim)
    with pytest.raises(OutputRefused, match="symbolic link"):
        with output_lock(str(tmp_path / "x.jsonl")):
            pass
    assert not victim.exists()


def test_a_file_that_appears_during_the_run_is_kept_without_overwrite(tmp_path):
    """Without overwrite the publish is link(2), which refuses an existing name in the step
    that makes it: a file written at the output while the run worked is kept, nothing staged
    is left."""
    out = tmp_path / "x.jsonl"
    with pytest.raises(OutputRefused, match="appeared while the run worked"):
        with file_output(str(out), overwrite=False) as staged:
            out.write_bytes(b"someone else's")
            staged.write(b"ours\n")
    assert out.read_bytes() == b"someone else's"
    assert _beside(out) == ["x.jsonl"]


def test_without_overwrite_a_new_file_is_published(tmp_path):
    out = tmp_path / "x.jsonl"
    with file_output(str(out), overwrite=False) as staged:
        staged.write(b"ours\n")
    assert out.read_bytes() == b"ours\n" and _beside(out) == ["x.jsonl"]


@pytest.mark.parametrize("earlier", [False, True])
def test_a_private_folder_is_owner_only_from_staging_through_the_swap(
    tmp_path, monkeypatch, earlier
):
    """publish_folder(private=True) never opens the folder: its mode at the swap (a kill
    there leaves it as it is) and after it is 0700."""
    out, staging = tmp_path / "hashes", tmp_path / ".hashes.kvtrace-staging-1"
    if earlier:
        out.mkdir(mode=0o700)
    staging.mkdir(mode=0o700)
    (staging / "a").write_text("")
    seen = []
    rename, exchange = os.rename, publish._exchange

    def noting(swap):
        def swapped(first, second, *rest):
            seen.append(os.stat(first).st_mode & 0o777)
            return swap(first, second, *rest)

        return swapped

    monkeypatch.setattr(publish.os, "rename", noting(rename))
    monkeypatch.setattr(publish, "_exchange", noting(exchange))
    publish.publish_folder(str(staging), str(out), frozenset({"a"}), private=True)
    assert seen and set(seen) == {0o700}
    assert out.stat().st_mode & 0o777 == 0o700 and os.listdir(out) == ["a"]


def test_the_current_folder_as_output_is_staged_beside_it(tmp_path, monkeypatch):
    """`.` is placed (its real path), so the run stages beside it, never inside."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with folder_output(".", "analyze") as staged:
        assert os.path.dirname(staged.path) == str(tmp_path)
        with open(os.path.join(staged.path, "a.txt"), "w") as handle:
            handle.write("a")
    assert os.listdir(work) == ["a.txt"]


def test_a_private_output_is_owner_only_over_a_file_others_could_read(tmp_path):
    """What derives from a private file is published owner-only, file or folder, and stays so
    over an existing output others could read (the staged copy's mode is what the rename keeps)."""
    output = tmp_path / "report.json"
    output.write_bytes(b"{}")
    os.chmod(output, 0o644)
    with publish.file_output(str(output), private=True) as staged:
        staged.write(b'{"measured": 1}')
    assert os.stat(output).st_mode & 0o777 == 0o600
    with publish.folder_output(str(tmp_path / "analysis"), "analyze", private=True) as folder:
        assert os.stat(folder.path).st_mode & 0o077 == 0
    assert os.stat(tmp_path / "analysis").st_mode & 0o777 == 0o700
