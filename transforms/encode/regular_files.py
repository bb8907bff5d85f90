"""Small files kvtrace trusts (a tokenizer's files, presets), read whole only when they are what
they claim: a regular file (a link followed only to one) no larger than its bound
(storage.open_regular). A file grown past its bound after it was opened is cut there and
refused.
"""

from __future__ import annotations

import os

from kvtrace.transforms.storage import UnfitFile, open_regular

__all__ = ["UnfitFile", "read_regular_file"]


def read_regular_file(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of the regular file at path (symlinks followed), at most max_bytes of them.
    UnfitFile if it is anything else or larger; OSError if it cannot be read."""
    handle, _ = open_regular(path, max_bytes, follow_links=True)
    with handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnfitFile(f"{path}: grew past {max_bytes} bytes while being read")
    return data
