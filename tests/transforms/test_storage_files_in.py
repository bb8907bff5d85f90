"""storage.files_in: a folder's files listed by the folder's name as spelled, never read as a
pattern (a folder kvtrace made may be named out[1]), locally and on object stores."""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms import storage


def test_a_folder_named_with_glob_characters_lists_its_own_files_only(tmp_path):
    for folder, name in (("m[1]", "own"), ("m1", "sibling"), ("m*", "star"), ("m?", "mark")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_bytes(b"x")
    assert storage.files_in(str(tmp_path / "m[1]")) == ["own"]
    assert storage.files_in(str(tmp_path / "m*")) == ["star"]
    assert storage.files_in(str(tmp_path / "m?")) == ["mark"]


def test_files_are_listed_hidden_ones_too_subfolders_only_when_nested(tmp_path):
    (tmp_path / "b").write_bytes(b"x")
    (tmp_path / ".hidden").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "b")
    os.mkfifo(tmp_path / "fifo")  # not a file a glob gives
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "deeper" / "c").write_bytes(b"x")
    assert storage.files_in(str(tmp_path)) == [".hidden", "b", "link"]
    assert storage.files_in(str(tmp_path), nested=True) == [".hidden", "b", "link", "sub/deeper/c"]


def test_a_folder_that_is_missing_or_a_file_holds_nothing(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    for nested in (False, True):
        assert storage.files_in(str(tmp_path / "missing"), nested) == []
        assert storage.files_in(str(tmp_path / "file"), nested) == []


NAMES = st.text(alphabet="ab[]*?!^-.\\", min_size=1, max_size=12)


@pytest.mark.beam
@given(folder=NAMES, name=st.text(alphabet="ab[]*?/.", min_size=1, max_size=8))
def test_an_object_stores_listing_takes_in_every_object_of_the_folder(folder, name):
    """What gs:// and s3:// match for files_in, by Beam's own translation of the pattern
    (FileSystem.translate_pattern): every object under the folder, whatever the characters of
    the folder's name or the object's (files_in then keeps the folder's own)."""
    from apache_beam.io.filesystem import FileSystem

    # s3:// as the example: its filesystem comes with the test extra (gs:// needs the gcp one)
    prefix = storage.join(f"s3://bucket/{folder}", "")
    listed = re.compile(FileSystem.translate_pattern(storage.objects_under(prefix)))
    assert listed.fullmatch(prefix + name)
