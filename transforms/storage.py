"""Files the jobs write and read back (trace shards, manifests, id maps): local paths through the
os module, URLs (gs://, s3://, ...) through Beam's filesystems.

Importing Beam costs ~3.5 s here, more than loading a tokenizer: a local run never pays it.
"""

from __future__ import annotations

import glob
import os
from typing import IO, Any

from transforms.read.paths import is_url


def _beam() -> Any:
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def join(directory: str, *names: str) -> str:
    if is_url(directory):
        return _beam().join(directory, *names)
    return os.path.join(directory, *names)


def open_read(path: str) -> IO[bytes]:
    """The file's bytes as stored (no decompression)."""
    if is_url(path):
        from apache_beam.io.filesystem import CompressionTypes

        return _beam().open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    return open(path, "rb")


def create(path: str) -> IO[bytes]:
    """A new file at path, replacing any; local parent folders are made as needed."""
    if is_url(path):
        from apache_beam.io.filesystem import CompressionTypes

        return _beam().create(path, compression_type=CompressionTypes.UNCOMPRESSED)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    return open(path, "wb")


def exists(path: str) -> bool:
    return _beam().exists(path) if is_url(path) else os.path.exists(path)


def delete(paths: list[str]) -> None:
    remote = [p for p in paths if is_url(p)]
    if remote:
        _beam().delete(remote)
    for path in paths:
        if not is_url(path):
            os.remove(path)


def rename(source: str, destination: str) -> None:
    """Move source over destination (atomic on local filesystems)."""
    if is_url(source):
        _beam().rename([source], [destination])
    else:
        os.replace(source, destination)


def match(pattern: str) -> list[str]:
    """Files matching a glob pattern, sorted."""
    if is_url(pattern):
        return sorted(m.path for r in _beam().match([pattern]) for m in r.metadata_list)
    return sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
