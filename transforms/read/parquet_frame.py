"""A Parquet file's frame: the magic that ends it and the footer length before that, read from
its last 8 bytes alone. The one place the tail is read: the Parquet readers (paths.parquet_file)
take the footer length from it, and standard input's form is told by it (decompress), no footer
byte parsed: a footer is parsed only by a reader, within its bounds."""

from __future__ import annotations

import os
from typing import IO

PARQUET_MAGIC = b"PAR1"
# What ends a Parquet file: its footer's length (4 bytes, little-endian), then the magic.
TAIL_BYTES = 4 + len(PARQUET_MAGIC)


def footer_length(raw: IO[bytes], path: str) -> int:
    """The footer length a seekable file's tail states, once it is known to fit between the
    file's opening magic and its tail; ValueError saying why not. Leaves raw at its end."""
    size = raw.seek(0, os.SEEK_END)
    if size < len(PARQUET_MAGIC) + TAIL_BYTES:
        raise ValueError(f"{path}: too short to be a Parquet file")
    raw.seek(size - TAIL_BYTES)
    tail = raw.read(TAIL_BYTES)
    if tail[4:] != PARQUET_MAGIC:
        raise ValueError(f"{path}: not a Parquet file (no {PARQUET_MAGIC!r} at its end)")
    footer_bytes = int.from_bytes(tail[:4], "little")
    if footer_bytes > size - len(PARQUET_MAGIC) - TAIL_BYTES:
        raise ValueError(f"{path}: a Parquet footer of {footer_bytes} bytes, past the file's start")
    return footer_bytes


def framed_as_parquet(raw: IO[bytes]) -> bool:
    """Whether a seekable file opens and ends as Parquet does: the magic at both ends and a
    footer length that fits between them. Says nothing of the footer itself."""
    try:
        footer_length(raw, "")
    except ValueError:
        return False
    raw.seek(0)
    return raw.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
