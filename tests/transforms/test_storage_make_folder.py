"""storage.make_folder: a private folder kvtrace makes is owner-only and marked kvtrace's; one
it did not make is never changed nor marked, and refused if other users may write it."""

from __future__ import annotations

import logging
import os

import pytest

from kvtrace.transforms import storage


@pytest.fixture(autouse=True)
def fresh_run_registry(monkeypatch):
    """Each test its own process-wide registry of folders made and leftovers: what an earlier
    test in this worker left there (a run's list, a leftover) is not this test's run."""
    monkeypatch.setattr(storage, "_MADE", {})
    monkeypatch.setattr(storage, "_LEFTOVERS", {})
    monkeypatch.setattr(storage, "_LEFTOVERS_OWNER", [os.getpid()])
    monkeypatch.setattr(storage, "_FORWARD_FOLDERS", [])


def test_a_users_existing_folder_is_neither_changed_nor_marked(tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    folder.chmod(0o755)
    storage.make_folder(str(folder), private=True)
    assert folder.stat().st_mode & 0o777 == 0o755
    assert not storage.is_private_folder(str(folder))


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_a_users_folder_others_may_write_is_refused_and_left_as_it_is(tmp_path, mode):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(PermissionError, match="may be written by other users"):
        storage.make_folder(str(folder), private=True)
    assert folder.stat().st_mode & 0o7777 == mode
    assert not storage.is_private_folder(str(folder))


def test_a_private_folder_kvtrace_made_and_opened_up_is_made_owner_only_again(tmp_path, caplog):
    folder = tmp_path / "dead"
    storage.make_folder(str(folder), private=True)
    if not storage.is_private_folder(str(folder)):
        pytest.skip("no extended attributes here")
    folder.chmod(0o777)
    with caplog.at_level(logging.INFO, logger="kvtrace"):
        storage.make_folder(str(folder), private=True)
    assert folder.stat().st_mode & 0o777 == 0o700
    assert [r.getMessage() for r in caplog.records] == [
        f"made {folder} owner-only (it was 0o777): it holds private files"
    ]


def test_new_private_folders_are_owner_only_and_existing_parents_left_alone(tmp_path):
    tmp_path.chmod(0o755)
    storage.make_folder(str(tmp_path / "a" / "b"), private=True)
    assert [(tmp_path / p).stat().st_mode & 0o777 for p in ("", "a", "a/b")] == [
        0o755,
        0o700,
        0o700,
    ]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write any folder")
def test_a_folder_of_another_user_that_others_may_write_is_refused():
    with pytest.raises(PermissionError, match="may be written by other users"):
        storage.make_folder("/tmp", private=True)


def test_a_private_outputs_missing_parents_are_owner_only_and_unmarked(tmp_path):
    """Whichever step makes them first (the output's lock, before its folder is staged): under
    a group-writable umask too; the private folder is the output itself, not its parents."""
    output = tmp_path / "private" / "night" / "hashes"
    previous = os.umask(0o002)
    try:
        storage.make_parent(str(output), private=True)
        storage.make_parent(str(tmp_path / "public" / "out"))
    finally:
        os.umask(previous)
    for made in (output.parent, output.parent.parent):
        assert made.stat().st_mode & 0o777 == 0o700
        assert not storage.is_private_folder(str(made))
    assert (tmp_path / "public").stat().st_mode & 0o777 == 0o775


def test_a_run_that_raises_removes_the_folders_it_made_deepest_first_while_empty(tmp_path):
    (tmp_path / "mine").mkdir()
    with pytest.raises(KeyboardInterrupt), storage.run_folders():
        storage.make_folder(str(tmp_path / "mine" / "a" / "b"))
        storage.make_parent(str(tmp_path / "kept" / "file"), private=True)
        (tmp_path / "kept" / "file").write_text("a letter")
        storage.make_folder(str(tmp_path / "letters" / "dead"), private=True)
        raise KeyboardInterrupt  # a stop
    # The user's folder stays, and a made one that holds something the run did not remove.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "mine"]
    assert list((tmp_path / "mine").iterdir()) == []


def test_a_run_that_ends_without_an_error_keeps_the_folders_it_made(tmp_path):
    with storage.run_folders():
        storage.make_folder(str(tmp_path / "night" / "out"))
    assert (tmp_path / "night" / "out").is_dir()


def test_a_hard_end_removes_the_folders_the_run_made_while_empty(tmp_path):
    with storage.run_folders():
        storage.make_folder(str(tmp_path / "night" / "out"), private=True)
        storage.make_folder(str(tmp_path / "full"))
        (tmp_path / "full" / "published").write_text("")
        storage.remove_leftovers()  # as the CLI's stop deadline calls it
        assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]
