"""Which files a trace argument names, and the block size its kvtrace manifest declares.

A kvtrace output folder holds each shard twice (JSONL and Parquet) beside manifest.json; read
as a trace it is its JSONL shards, with the manifest's block size. A glob that matches both
twins of a shard keeps the JSONL one, so no row is counted twice.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Sequence

from transforms.read.paths import PARQUET_SUFFIXES, expand_inputs, read_bytes
from transforms.storage import is_url

MANIFEST = "manifest.json"
TRACE_SHARDS = "trace-*.jsonl"
MAX_MANIFEST_BYTES = 16 << 20  # kvtrace's manifests are KiBs (a file list and sha256s)


def _is_folder(path: str) -> bool:
    if is_url(path):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.exists(posixpath.join(path.rstrip("/"), MANIFEST))
    return os.path.isdir(path)


def trace_files(arguments: Sequence[str]) -> list[str]:
    """The files to read, in the order given (globs sorted), twins and repeats dropped."""
    files: list[str] = []
    for argument in arguments:
        pattern = (posixpath.join(argument.rstrip("/"), TRACE_SHARDS) if _is_folder(argument)
                   else argument)
        files += [f for f in expand_inputs([pattern]) if f not in files]
    present = set(files)
    return [f for f in files if not (f.lower().endswith(PARQUET_SUFFIXES)
                                     and f.rsplit(".", 1)[0] + ".jsonl" in present)]


def declared_block_size(files: Sequence[str]) -> int | None:
    """The block size in the manifest.json beside the files, if every one has the same."""
    sizes = set()
    for folder in {posixpath.dirname(f) for f in files}:
        path = posixpath.join(folder, MANIFEST)
        try:  # a FIFO or an endless file named manifest.json is refused, not waited on
            manifest = json.loads(read_bytes(path, MAX_MANIFEST_BYTES))
        except (OSError, ValueError):
            return None
        size = manifest.get("block_size") if isinstance(manifest, dict) else None
        if not isinstance(size, int):
            return None
        sizes.add(size)
    return sizes.pop() if len(sizes) == 1 else None
