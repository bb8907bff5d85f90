"""storage.make_folder: a private folder is owner-only whether kvtrace made it or found it."""

from __future__ import annotations

import logging
import os

import pytest

from kvtrace.transforms import storage


def test_an_existing_private_folder_is_made_owner_only_and_said_so(tmp_path, caplog):
    folder = tmp_path / "dead"
    folder.mkdir()
    folder.chmod(0o777)
    with caplog.at_level(logging.INFO, logger="kvtrace"):
        storage.make_folder(str(folder), private=True)
    assert folder.stat().st_mode & 0o777 == 0o700
    assert [r.getMessage() for r in caplog.records] == [
        f"made {folder} owner-only (it was 0o777): it holds private files"]


def test_new_private_folders_are_owner_only_and_existing_parents_left_alone(tmp_path):
    tmp_path.chmod(0o755)
    storage.make_folder(str(tmp_path / "a" / "b"), private=True)
    assert [(tmp_path / p).stat().st_mode & 0o777 for p in ("", "a", "a/b")] == [
        0o755, 0o700, 0o700]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may chmod any folder")
def test_a_private_folder_that_cannot_be_made_owner_only_is_refused(tmp_path):
    with pytest.raises(PermissionError, match="cannot make / owner-only"):
        storage.make_folder("/", private=True)
