"""A stop that ends the process without unwinding (the CLI's deadline) removes what the run
staged (publish.abandon_staged), never meeting a publication half done."""

from __future__ import annotations

import os
import threading
from contextlib import ExitStack

import pytest

from kvtrace.transforms import storage
from kvtrace.transforms.write import publish
from kvtrace.transforms.write.publish import STAGING_MARK, DeadLetterRun, folder_output


@pytest.fixture(autouse=True)
def _this_tests_own_registry(monkeypatch):
    """abandon_staged keeps the lock (its process ends next): each test gets its own."""
    monkeypatch.setattr(storage, "_LEFTOVERS", {})
    monkeypatch.setattr(publish, "_PUBLISHING", threading.RLock())


def _staged_names(root) -> list[str]:
    return [
        name for _, dirs, files in os.walk(root) for name in dirs + files if STAGING_MARK in name
    ]


def _run_left_unwound(tmp_path, stack: ExitStack) -> tuple[str, str]:
    """A run's output and letters staged, written into, and never unwound (as a process that
    ends mid-run leaves them)."""
    out = tmp_path / "out"
    staged = stack.enter_context(folder_output(str(out)))
    (tmp_path / "kept-beside").write_bytes(b"")  # the user's, beside the output: stays
    with open(os.path.join(staged.path, "trace-00000-of-00001.jsonl"), "wb") as handle:
        handle.write(b'{"timestamp": 0}\n')
    letters = DeadLetterRun(str(tmp_path / "dead"), str(out), "0123456789ab")
    letters.begin(staged.path)
    return staged.path, os.path.basename(letters.staging)


def test_what_a_run_staged_goes_and_nothing_else(tmp_path):
    with ExitStack() as stack:
        staged, letters = _run_left_unwound(tmp_path, stack)
        assert _staged_names(tmp_path)
        publish.abandon_staged(0)
        # The output never stood: its staging folder goes, and with it the letters and the
        # pointer to them (a published run's would stay for the next run to settle).
        assert _staged_names(tmp_path) == []
        assert not os.path.exists(staged) and not (tmp_path / "out").exists()
        assert (tmp_path / "kept-beside").exists() and (tmp_path / "dead").is_dir()
        stack.pop_all()  # the process would end here: no unwinding


def test_the_letters_of_a_published_output_stay_for_the_next_run(tmp_path):
    """Once the output the run's pointer names is published, its letters are the pointer's to
    settle (the next run of the output publishes them): a hard end leaves them staged."""
    with ExitStack() as stack:
        staged, letters = _run_left_unwound(tmp_path, stack)
        (tmp_path / "dead" / letters / publish.DEAD_LETTER_FILE).write_bytes(b"{}\n")
        publish.publish_folder(staged, str(tmp_path / "out"))
        publish.abandon_staged(0)
        assert letters in _staged_names(tmp_path)
        assert publish.recover_letters(str(tmp_path / "dead"), str(tmp_path / "out")) == [
            "0123456789ab"
        ]
        stack.pop_all()


def test_a_publication_under_way_is_waited_for_and_then_stands(tmp_path):
    staged = tmp_path / f".out{STAGING_MARK}0123456789ab"
    publish._staged_here(str(staged))
    staged.mkdir()
    (staged / "manifest.json").write_text("{}")
    holding, done = threading.Event(), threading.Event()

    def publication() -> None:
        with publish._PUBLISHING:
            holding.set()
            done.wait()
            os.rename(staged, tmp_path / "out")

    worker = threading.Thread(target=publication)
    worker.start()
    holding.wait()
    publish.abandon_staged(0)  # the publication holds the lock: nothing is removed
    assert (staged / "manifest.json").exists()
    done.set()
    worker.join()
    publish.abandon_staged(30)
    assert (tmp_path / "out" / "manifest.json").read_text() == "{}"
    assert _staged_names(tmp_path) == []


def test_the_lock_file_goes_too(tmp_path):
    """One registry of what the run made (storage.remove_on_exit): its lock file goes with its
    staging, though no finally block ran (standard input's copy has no name to leave)."""
    with ExitStack() as stack:
        _run_left_unwound(tmp_path, stack)
        lock = publish.lock_path(str(tmp_path / "out"))
        assert os.path.exists(lock)
        publish.abandon_staged(0)
        assert not os.path.exists(lock)
        stack.pop_all()


def test_a_lock_file_that_is_not_the_one_held_stays(tmp_path):
    """A file by the lock's name that is not the locked one (another run's, made after this
    one's was removed) is never removed."""
    with ExitStack() as stack:
        _run_left_unwound(tmp_path, stack)
        lock = publish.lock_path(str(tmp_path / "out"))
        os.remove(lock)
        with open(lock, "wb"):
            pass
        publish.abandon_staged(0)
        assert os.path.exists(lock)
        stack.pop_all()


def test_a_forked_child_removes_nothing_its_parent_made(tmp_path):
    made = tmp_path / "made-by-the-parent"
    made.mkdir()
    storage.remove_on_exit(str(made))
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's exit code is the assertion
        storage.remove_leftovers()
        os._exit(0)
    os.waitpid(child, 0)
    assert made.is_dir()
    storage.remove_leftovers()
    assert not made.exists()
