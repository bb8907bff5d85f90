"""The one write protocol (transforms/write/publish.py) for a single file and a folder: the
location checked and locked before the work, the output published whole when the work ends,
nothing of a failed run at the output's name."""

from __future__ import annotations

import os

import pytest

from transforms.errors import JobStopped
from transforms.write.publish import (OutputRefused, file_output, folder_output, output_lock,
                                      staging_folder)


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
    assert _beside(out) == [".requests.jsonl.kvtrace-lock", "requests.jsonl"]


def test_a_failed_run_leaves_the_previous_file_and_no_staged_copy(tmp_path):
    out = tmp_path / "page.html"
    out.write_bytes(b"previous")
    with pytest.raises(RuntimeError), file_output(str(out)) as staged:
        with staged.create() as handle:
            handle.write(b"new but unfinished")
            raise RuntimeError("the work failed")
    assert out.read_bytes() == b"previous"
    assert _beside(out) == [".page.html.kvtrace-lock", "page.html"]


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
    killed = staging_folder(str(out), "deadbeef")
    with open(killed, "wb") as handle:
        handle.write(b"half")
    with output_lock(str(out)):
        assert not os.path.exists(killed)


def test_a_folder_is_published_whole_and_withdrawn_when_there_is_nothing(tmp_path):
    out = tmp_path / "analysis"
    own = frozenset({"a.txt"})
    with folder_output(str(out), own) as staged:
        assert not out.exists()  # published only when the work ends
        with open(os.path.join(staged.path, "a.txt"), "wb") as handle:
            handle.write(b"1")
    assert sorted(os.listdir(out)) == ["a.txt"]
    with folder_output(str(out), own) as staged:  # its own earlier output is replaced
        staged.withdraw()
    assert (out / "a.txt").read_bytes() == b"1"
    assert _beside(out) == [".analysis.kvtrace-lock", "analysis"]


def test_a_folder_holding_what_the_command_does_not_write_is_refused(tmp_path):
    out = tmp_path / "analysis"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputRefused, match="notes.txt"):
        with folder_output(str(out), frozenset({"a.txt"})):
            pytest.fail("the work must not start")
    (out / "notes.txt").unlink()
    (out / "a.txt").mkdir()  # its name, but not a file kvtrace writes
    with pytest.raises(OutputRefused, match="a.txt"):
        with folder_output(str(out), frozenset({"a.txt"})):
            pytest.fail("the work must not start")
