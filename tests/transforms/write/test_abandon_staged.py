"""A stop that ends the process without unwinding (the CLI's deadline) removes what the run
staged (publish.abandon_staged), never meeting a publication half done."""

from __future__ import annotations

import os
import threading
from contextlib import ExitStack

import pytest

from kvtrace.transforms import storage
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.write import publish
from kvtrace.transforms.write.publish import STAGING_MARK, DeadLetterRun, folder_output


@pytest.fixture(autouse=True)
def _this_tests_own_registry(monkeypatch):
    """abandon_staged keeps the lock (its process ends next): each test gets its own."""
    monkeypatch.setattr(storage, "_LEFTOVERS", {})
    monkeypatch.setattr(publish, "_PUBLISHING", threading.RLock())
    monkeypatch.setattr(publish, "_SWAPPING", threading.Lock())
    monkeypatch.setattr(publish, "_ABANDONED", threading.Event())
    monkeypatch.setattr(publish, "_OPEN_PUBLICATIONS", [])
    monkeypatch.setattr(publish, "_PUBLISHED_HERE", publish._Published())


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
        # The output never stood: its staging folder goes, and with it the letters, the
        # pointer to them (a published run's would stay for the next run to settle) and the
        # dead-letter folder the run made for them.
        assert _staged_names(tmp_path) == []
        assert not os.path.exists(staged) and not (tmp_path / "out").exists()
        assert (tmp_path / "kept-beside").exists() and not (tmp_path / "dead").exists()
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


def _staged_output(tmp_path, name: str) -> str:
    staged = tmp_path / f".{name}{STAGING_MARK}0123456789ab"
    publish._staged_here(str(staged))
    staged.mkdir()
    (staged / "manifest.json").write_text(name)
    return str(staged)


def test_a_publication_that_ends_in_the_wait_stands(tmp_path):
    staged = _staged_output(tmp_path, "out")
    holding, done = threading.Event(), threading.Event()

    def publication() -> None:
        with publish.publication():
            holding.set()
            done.wait()
            publish.publish_in_place([(staged, str(tmp_path / "out"))])

    worker = threading.Thread(target=publication)
    worker.start()
    holding.wait()
    done.set()  # it ends within the wait, whenever it is
    assert publish.abandon_staged(30)
    worker.join()
    assert (tmp_path / "out" / "manifest.json").read_text() == "out"
    assert publish.published_here() == str(tmp_path / "out")
    assert _staged_names(tmp_path) == []


def test_a_publication_the_deadline_meets_is_put_back_and_said(tmp_path):
    """A hard end that stops waiting puts back the swaps of the publications under way (a
    night's trace, its block hashes not yet in) and records what stands of their other steps
    (an id map's version), so its line tells the truth: nothing is left half a night."""
    trace, hashes = _staged_output(tmp_path, "out"), _staged_output(tmp_path, "hashes")
    swapped, failed = threading.Event(), []

    def night() -> None:
        try:
            with publish.publication(lambda: ["version 3 of the id map M"]):
                publish.publish_in_place([(trace, str(tmp_path / "out"))])
                swapped.set()
                while not publish._ABANDONED.wait(30):  # the slow sync of the hashes
                    pass
                publish.publish_in_place([(hashes, str(tmp_path / "hashes"))])
        except JobStopped as err:
            failed.append(err)

    worker = threading.Thread(target=night)
    worker.start()
    swapped.wait()
    assert publish.abandon_staged(0)
    worker.join()
    assert failed  # no swap after the hard end
    assert not (tmp_path / "out").exists() and not (tmp_path / "hashes").exists()
    assert publish.published_here() == "version 3 of the id map M"
    assert _staged_names(tmp_path) == []


def test_a_publication_whose_steps_cannot_be_told_is_said_half_done(tmp_path):
    stalled, done, failed = threading.Event(), threading.Event(), []

    def copying() -> None:
        try:
            with publish.publication(None):  # an object store's copies: no standing to read
                stalled.set()
                done.wait()
        except JobStopped as err:
            failed.append(err)

    worker = threading.Thread(target=copying)
    worker.start()
    stalled.wait()
    assert not publish.abandon_staged(0)
    done.set()
    worker.join()
    assert failed and publish.published_here() == ""  # nothing recorded after the hard end


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
