"""The one way kvtrace reads a file of an id map or of its folder of marks.

Whoever can write a map can put anything in a file's place: a FIFO (whose open blocks until a
writer comes), a device (whose open can act), a link to either. kvtrace writes only regular
files there, so a local one is opened only as a regular file, its own link not followed
(storage.open_regular): anything else is refused in one line (storage.UnfitFile), never waited
on. An object store holds only objects. Every read in transforms/ids opens through here
(tests/transforms/ids/test_map_files.py finds any other opener).
"""

from __future__ import annotations

import os
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
