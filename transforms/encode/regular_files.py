"""Small files kvtrace trusts (a tokenizer's files, presets), read whole only when they are what
they claim: a regular file (a link followed only to one) no larger than its bound.

A FIFO never ends and a device never stops (`/dev/zero`), so the kind and the size are checked
before the file is opened for reading, and again on the open descriptor, which is what is read:
a file swapped between the two checks is caught by the second, a file grown by then is cut at
its bound and refused. Opened non-blocking, so a FIFO swapped in cannot hang the open itself.
"""

from __future__ import annotations

import os
import stat


class UnfitFile(ValueError):
    """A file that is not a regular file within its size bound; the message is one line."""


def read_regular_file(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of the regular file at path (symlinks followed), at most max_bytes of them.
    UnfitFile if it is anything else or larger; OSError if it cannot be read."""
    _check(os.stat(path), path, max_bytes)
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(descriptor, "rb") as handle:
        _check(os.fstat(descriptor), path, max_bytes)
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnfitFile(f"{path}: grew past {max_bytes} bytes while being read")
    return data


def _check(status: os.stat_result, path: str | os.PathLike, max_bytes: int) -> None:
    if not stat.S_ISREG(status.st_mode):
        raise UnfitFile(f"{path} is not a regular file (a FIFO, device, socket or folder)")
    if status.st_size > max_bytes:
        raise UnfitFile(f"{path}: {status.st_size} bytes, over the {max_bytes} bytes allowed")
