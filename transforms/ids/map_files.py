"""The one way kvtrace reads a file of an id map or of its folder of marks.

Whoever can write a map can put anything in a file's place: a FIFO (whose open blocks until a
writer comes), a device (whose open can act), a link to either. kvtrace writes only regular
files there, so a local one is opened only as a regular file, its own link not followed
(storage.open_regular): anything else is refused in one line (storage.UnfitFile), never waited
on. An object store holds only objects. Every read in transforms/ids opens through here
(tests/transforms/ids/test_map_files.py finds any other opener). A mark is created here the
same way: never by opening what is in its place (create_mark).
"""

from __future__ import annotations

import os
import stat
from typing import IO

from kvtrace.transforms import storage


def open_map_file(path: str) -> IO[bytes]:
    """A file of the map or its marks, opened to read its bytes as stored. UnfitFile if it is
    not a regular file; OSError if it cannot be opened."""
    if storage.is_url(path):
        return storage.open_read(path)
    return storage.open_regular(path)[0]


def map_file_exists(path: str) -> bool:
    """Whether something is in the file's place: a link to nothing is (open_map_file refuses
    it), never taken for a file that is absent."""
    return storage.exists(path) if storage.is_url(path) else os.path.lexists(path)


# What every mark holds (readers test only that it exists): never empty, since an object
# store may refuse an empty object (Beam's S3 writer completes a multipart upload of no part).
MARK_BYTES = b"kvtrace\n"


def create_mark(path: str) -> None:
    """An owner-only file at path holding MARK_BYTES, durable. Locally made only if nothing is
    in its place (O_EXCL: a link is not followed, a FIFO not waited on), or rewritten if a
    regular file there holds other bytes (a mark torn by a power cut, or empty as kvtrace once
    made them: the same mark, in the one format); UnfitFile if something else is there. An
    object store holds only objects, each written whole."""
    if storage.is_url(path):
        with storage.create(path, private=True) as handle:
            handle.write(MARK_BYTES)
        return
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags | os.O_CREAT | os.O_EXCL, storage.PRIVATE_FILE)
    except FileExistsError:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise _unfit(path) from None
        if mark_is_whole(path):
            return
        descriptor = os.open(path, flags | os.O_TRUNC)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # swapped since it was looked at
            raise _unfit(path)
        os.write(descriptor, MARK_BYTES)  # a regular file: written whole in one call
        os.fsync(descriptor)  # durable as storage.create's files are
    finally:
        os.close(descriptor)


def mark_is_whole(path: str) -> bool:
    """Whether the mark at path (there already) holds MARK_BYTES: a local one killed before its
    fsync may not (an object is written whole). UnfitFile if it is not a regular file."""
    if storage.is_url(path):
        return True
    with open_map_file(path) as handle:
        return handle.read(len(MARK_BYTES) + 1) == MARK_BYTES


def _unfit(path: str) -> storage.UnfitFile:
    return storage.UnfitFile(f"{path} is not a regular file (a link, FIFO or folder)")
