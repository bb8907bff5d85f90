"""storage.open_regular: the one way a local file kvtrace reads is opened (inputs, tokenizer
files, presets, published folders): a regular file whose size can be trusted, within its bound,
looked at without waiting on it."""

from __future__ import annotations

import os

import pytest

from kvtrace.transforms.storage import UnfitFile, open_regular


def test_a_regular_file_is_opened_with_its_size(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"abc\n")
    handle, size = open_regular(path, 4)
    with handle:
        assert (size, handle.read()) == (4, b"abc\n")


def test_an_empty_file_is_empty(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(b"")
    handle, size = open_regular(path)
    with handle:
        assert (size, handle.read()) == (0, b"")


def test_a_file_over_its_bound_is_refused_before_a_byte_is_read(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"x" * 5)
    with pytest.raises(UnfitFile, match="5 bytes, over the 4 bytes allowed"):
        open_regular(path, 4)


def test_a_size_that_is_not_the_length_is_refused():
    """/proc files say 0 bytes and hold some: read by their size, they would look empty."""
    with pytest.raises(UnfitFile, match="size cannot be trusted"):
        open_regular("/proc/self/status", follow_links=True)


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null", "/"])
def test_devices_and_folders_are_refused(path):
    with pytest.raises(UnfitFile, match="not a regular file"):
        open_regular(path, follow_links=True)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UnfitFile, match="not a regular file"):  # a blocking open would hang
        open_regular(fifo, follow_links=True)


def test_a_link_is_followed_only_when_asked(tmp_path):
    (tmp_path / "target").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(UnfitFile, match="is a link"):
        open_regular(tmp_path / "link")
    handle, size = open_regular(tmp_path / "link", follow_links=True)
    handle.close()
    assert size == 1
