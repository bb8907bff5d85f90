"""Input paths: local files directly, URLs (gs://, s3://, ...) through Beam's filesystems.

Local reads skip importing Beam, which costs ~1 s of start-up that `kvtrace analyze` does not
otherwise need.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Sequence

import pyarrow as pa

from transforms.storage import is_url

PARQUET_SUFFIXES = (".parquet", ".pq")
# Compressed JSONL by suffix, as pyarrow names the codecs.
CODECS = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2"}
def expand_inputs(patterns: Sequence[str]) -> list[str]:
    """Every file the patterns match, sorted; a pattern that matches nothing is an error."""
    files: set[str] = set()
    for pattern in patterns:
        if is_url(pattern):
            from apache_beam.io.filesystems import FileSystems

            matched = [m.path for r in FileSystems.match([pattern]) for m in r.metadata_list]
        else:
            matched = [p for p in glob.glob(pattern) if not os.path.isdir(p)]
            _refuse_special_files(matched)
        if not matched:
            hint = " (a folder: give a glob of its files, e.g. DIR/*.jsonl)" if (
                not is_url(pattern) and os.path.isdir(pattern)) else ""
            raise FileNotFoundError(f"{pattern!r} matches no file{hint}")
        files.update(matched)
    return sorted(files)


def _refuse_special_files(paths: Sequence[str]) -> None:
    """FIFOs, devices and sockets never end (or never start): reading one would hang the job.
    A dangling link passes here and becomes a dead letter when read, like an unreadable file."""
    for path in paths:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            raise ValueError(f"input {path} is not a regular file (a FIFO, device or socket)")


def compression_of(path: str) -> str | None:
    """The codec a file's suffix names, or None for a plain file."""
    suffix = path[path.rfind("."):].lower() if "." in path.rsplit("/", 1)[-1] else ""
    return CODECS.get(suffix)


def file_sizes(files: Sequence[str]) -> list[tuple[str, int]]:
    """(path, size in bytes) of each file, for splitting and progress totals."""
    local = [f for f in files if not is_url(f)]
    sizes = {f: _size(f) for f in local}
    remote = [f for f in files if is_url(f)]
    if remote:
        from apache_beam.io.filesystems import FileSystems

        for result in FileSystems.match(remote):
            for metadata in result.metadata_list:
                sizes[metadata.path] = metadata.size_in_bytes
    return [(f, sizes[f]) for f in files]


def _size(path: str) -> int:
    """A local file's size; 0 for one that cannot be looked at (a dangling link), which its
    read then turns into a dead letter."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def read_bytes(path: str) -> bytes:
    """A file's content, decompressed by its suffix (.gz, .zst, .bz2)."""
    if is_url(path):
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.open(path, compression_type=CompressionTypes.AUTO) as handle:
            return handle.read()
    with pa.input_stream(path, compression="detect") as stream:
        return stream.read()


def open_stream(path: str) -> pa.NativeFile:
    """A decompressing pyarrow input stream over the file."""
    if is_url(path):
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        return pa.PythonFile(FileSystems.open(path, compression_type=CompressionTypes.AUTO), "r")
    return pa.input_stream(path, compression="detect")


def count_lines(path: str, chunk_bytes: int = 16 << 20) -> int:
    """Lines in the (decompressed) file, a last line without a newline included."""
    lines, last = 0, b"\n"
    with open_stream(path) as stream:
        while chunk := stream.read(chunk_bytes):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def open_parquet(path: str):
    """A file object (or path) pyarrow.parquet can read."""
    if is_url(path):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.open(path)
    return path
