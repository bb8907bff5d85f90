"""Which files a trace argument names, the block size its kvtrace manifest declares, and what
that manifest promises of each shard.

A kvtrace output folder holds each shard twice (JSONL and Parquet) beside manifest.json; read
as a trace it is its JSONL shards, with the manifest's block size. A glob that matches both
twins of a kvtrace shard (trace-SSSSS-of-NNNNN) keeps the JSONL one, so no row is counted
twice; any other file named is read.

A folder holding shards by kvtrace's names is read only as the whole output it was published
as: its manifest there, every shard it lists present, none it does not. Each shard read from
such a folder is checked against the manifest's sha256 as it is read (trace_io.read_trace), so
a partial copy (a shard cut short, a manifest not yet copied) is refused, never analysed. A
lone trace file, not in a kvtrace folder, is read as it is.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

from transforms import storage
from transforms.read.paths import expand_inputs, read_bytes
from transforms.storage import is_url
from transforms.trace_format import FORMAT, MANIFEST, TRACE_FILE, is_count, parse_json

TRACE_SHARDS = "trace-*.jsonl"
MAX_MANIFEST_BYTES = 16 << 20  # kvtrace's manifests are KiBs (a file list and sha256s)


class NotWholeOutput(ValueError):
    """A kvtrace output folder that is not as it was published (a partial copy)."""

    def __init__(self, folder: str, why: str):
        super().__init__(f"{folder} is not a whole kvtrace output: {why} (copied partly?)")


@dataclass(frozen=True, eq=False)  # one per folder read: compared, and hashed, by identity
class PublishedFolder:
    """What a kvtrace output folder's manifest promises: each file's sha256, the rows exported."""

    folder: str
    sha256: dict[str, str]
    exported: int

    @property
    def shards(self) -> frozenset[str]:
        """The JSONL trace shards it lists (each row once; the Parquet twins repeat them)."""
        return frozenset(n for n in self.sha256 if _is_shard(n) and n.endswith(".jsonl"))

    def differs(self, name: str) -> NotWholeOutput:
        return NotWholeOutput(self.folder, f"{name} differs from its manifest")

    def check(self, path: str, sha256: str | None) -> None:
        """Refuse a shard whose bytes (their sha256) are not the ones listed for it."""
        name = posixpath.basename(path)
        if sha256 is None or self.sha256.get(name) != sha256:
            raise self.differs(name)


def _is_shard(name: str) -> bool:
    return TRACE_FILE.fullmatch(name) is not None


def _is_folder(path: str) -> bool:
    if is_url(path):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.exists(posixpath.join(path.rstrip("/"), MANIFEST))
    return os.path.isdir(path)


def trace_files(arguments: Sequence[str]) -> list[str]:
    """The files to read, in the order given (globs sorted), twins and repeats dropped; a
    kvtrace output folder only whole (check_whole)."""
    files: list[str] = []
    for argument in arguments:
        pattern = argument
        if _is_folder(argument):
            pattern = posixpath.join(argument.rstrip("/"), TRACE_SHARDS)
            check_whole(argument.rstrip("/"), _matched(pattern))
        files += [f for f in expand_inputs([pattern]) if f not in files]
    present = set(files)
    return [f for f in files if not _twin_read(f, present)]


def _twin_read(path: str, present: set[str]) -> bool:
    """A kvtrace shard's Parquet twin (by kvtrace's shard name) whose JSONL twin is read too:
    the same rows. Any other Parquet file is a trace of its own, read."""
    return (_is_shard(posixpath.basename(path)) and path.endswith(".parquet")
            and path[: -len(".parquet")] + ".jsonl" in present)


def _matched(pattern: str) -> list[str]:
    try:
        return expand_inputs([pattern])
    except FileNotFoundError:
        return []


def check_whole(folder: str, shards: Sequence[str]) -> None:
    """Refuse a folder of kvtrace shards whose manifest is missing, or whose trace files (all
    those read from it) are not the shards it lists (their bytes are checked as read)."""
    names = {posixpath.basename(f) for f in shards}
    published = published_folder(folder)
    if published is None:
        if any(_is_shard(name) for name in names):
            raise NotWholeOutput(folder, f"its {MANIFEST} is missing")
        return
    missing = sorted(published.shards - names)
    if missing:
        raise NotWholeOutput(folder, f"{missing[0]} is missing")
    unlisted = sorted(names - published.shards)
    if unlisted:
        raise published.differs(unlisted[0])


def published_folder(folder: str) -> PublishedFolder | None:
    """The promises of the manifest.json in folder; None when there is none; NotWholeOutput
    when it is not one kvtrace writes (unreadable, or lacking sha256 or records.exported)."""
    path = posixpath.join(folder, MANIFEST)
    if not (storage.exists(path) if is_url(path) else os.path.lexists(path)):
        return None
    try:  # a FIFO or an endless file named manifest.json is refused, not waited on
        manifest = parse_json(read_bytes(path, MAX_MANIFEST_BYTES))
    except (OSError, ValueError) as err:
        raise NotWholeOutput(folder, f"its {MANIFEST} cannot be read ({err})") from None
    if not isinstance(manifest, dict):
        manifest = {}
    sha256, records = manifest.get("sha256"), manifest.get("records")
    exported = records.get("exported") if isinstance(records, dict) else None
    if manifest.get("format") != FORMAT or not is_count(exported) or not (
            isinstance(sha256, dict) and all(isinstance(v, str) for v in sha256.values())):
        raise NotWholeOutput(folder, f"its {MANIFEST} is not one kvtrace writes (no format, "
                                     f"sha256 or records.exported)")
    return PublishedFolder(folder, sha256, exported)


def published_shards(files: Sequence[str]) -> dict[str, PublishedFolder]:
    """The files that are shards of a kvtrace output folder (by name, beside a manifest), each
    with what the folder's manifest promises."""
    folders: dict[str, PublishedFolder | None] = {}
    found = {}
    for path in files:
        folder, name = posixpath.split(path)
        if not _is_shard(name):
            continue
        if folder not in folders:
            folders[folder] = published_folder(folder)
        if folders[folder] is not None:
            found[path] = folders[folder]
    return found


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
