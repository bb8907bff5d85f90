"""Which files a trace argument names, the block size its kvtrace manifest declares, and what
that manifest promises of each file.

A kvtrace output folder holds each shard twice (JSONL and Parquet) beside stats.json and
manifest.json; read as a trace it is its JSONL shards, with the manifest's block size. A glob
that matches both twins of a kvtrace shard (trace-SSSSS-of-NNNNN) keeps the JSONL one, so no
row is counted twice; any other file named is read.

A folder holding shards by kvtrace's names is read only as the whole output it was published
as, whichever way it is named (the folder, a glob of its shards, one shard): its manifest
there, every file it lists present with the sha256 it lists, no trace file it does not list.
The files not read are hashed when the trace files are listed (check_whole); each shard read
is checked as it is read (trace_io.read_trace), through one descriptor of the folder opened
with its manifest, so a publish that swaps the folder meanwhile is not mixed in. A partial
copy (a shard or its twin cut short, a manifest or stats.json not yet copied) is refused,
never analysed. A trace file by a shard's name alone in its folder (no other file kvtrace
publishes beside it) is read as it is.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import posixpath
import stat
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

from transforms import storage
from transforms.read.paths import expand_inputs, open_raw, read_bytes
from transforms.storage import is_url
from transforms.trace_format import FORMAT, MANIFEST, STATS, TRACE_FILE, is_count, parse_json

TRACE_SHARDS = "trace-*.jsonl"
MAX_MANIFEST_BYTES = 16 << 20  # kvtrace's manifests are KiBs (a file list and sha256s)


class NotWholeOutput(ValueError):
    """A kvtrace output folder that is not as it was published (a partial copy)."""

    def __init__(self, folder: str, why: str):
        super().__init__(f"{folder} is not a whole kvtrace output: {why} (copied partly?)")


@dataclass(frozen=True, eq=False)  # one per folder read: compared, and hashed, by identity
class PublishedFolder:
    """What a kvtrace output folder's manifest promises: each file's sha256, the rows exported;
    and the folder as opened when its manifest was read (descriptor: a local one's), which its
    files are opened through."""

    folder: str
    sha256: dict[str, str]
    exported: int
    descriptor: int | None = None

    @property
    def shards(self) -> frozenset[str]:
        """The JSONL trace shards it lists (each row once; the Parquet twins repeat them)."""
        return frozenset(n for n in self.sha256 if _is_shard(n) and n.endswith(".jsonl"))

    def differs(self, name: str) -> NotWholeOutput:
        return NotWholeOutput(self.folder, f"{name} differs from its manifest")

    def check(self, path: str, sha256: str | None) -> None:
        """Refuse a file whose bytes (their sha256) are not the ones listed for it."""
        name = posixpath.basename(path)
        if sha256 is None or self.sha256.get(name) != sha256:
            raise self.differs(name)

    def open(self, name: str) -> IO[bytes]:
        """A file of the folder as it was opened: a regular file, never through a link."""
        try:
            return _open_file(self.folder, self.descriptor, name)
        except FileNotFoundError:
            raise NotWholeOutput(self.folder, f"{name} is missing") from None
        except (OSError, ValueError) as err:  # a link, a FIFO, a folder in a file's place
            raise NotWholeOutput(self.folder, f"{name} cannot be read ({err})") from None

    def names(self) -> set[str]:
        return _names(self.folder, self.descriptor)

    def close(self) -> None:
        _close(self.descriptor)


def _is_shard(name: str) -> bool:
    return TRACE_FILE.fullmatch(name) is not None


def _is_folder(path: str) -> bool:
    if is_url(path):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.exists(posixpath.join(path.rstrip("/"), MANIFEST))
    return os.path.isdir(path)


def trace_files(arguments: Sequence[str]) -> list[str]:
    """The files to read, in the order given (globs sorted), twins and repeats dropped; each
    kvtrace output folder a file is read from only whole (check_whole)."""
    files: list[str] = []
    for argument in arguments:
        pattern = argument
        if _is_folder(argument):
            folder = argument.rstrip("/") or "/"
            # The folder's name is itself, not a glob: night[1] is not night1.
            pattern = posixpath.join(folder if is_url(folder) else glob.escape(folder),
                                     TRACE_SHARDS)
            if not _matched(pattern):  # say what is missing, if it is a kvtrace output
                check_whole(folder, ())
        files += [f for f in expand_inputs([pattern]) if f not in files]
    present = set(files)
    files = [f for f in files if not _twin_read(f, present)]
    read: dict[str, set[str]] = {}
    for path in files:
        folder, name = posixpath.split(path)
        read.setdefault(folder, set()).add(name)
    for folder, names in read.items():
        if any(_is_shard(name) for name in names):
            check_whole(folder, names)
    return files


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


def check_whole(folder: str, read: Collection[str]) -> None:
    """Refuse a folder of kvtrace shards that is not whole: its manifest missing (where kvtrace
    files sit beside the one read), a file it lists missing or (unless read now: its bytes are
    checked as read) not of the sha256 listed, or a trace file read that it does not list."""
    with opened_folder(folder) as published:
        present = _names(folder, None) if published is None else published.names()
        if published is None:
            if len({n for n in present if _is_shard(n) or n == STATS}) > 1:  # not a lone shard
                raise NotWholeOutput(folder, f"its {MANIFEST} is missing")
            return
        missing = sorted(set(published.sha256) - present)
        if missing:
            raise NotWholeOutput(folder, f"{missing[0]} is missing")
        unlisted = sorted(set(read) - set(published.sha256))
        if unlisted:
            raise published.differs(unlisted[0])
        for name in sorted(set(published.sha256) - set(read)):
            with published.open(name) as handle:
                published.check(name, hashlib.file_digest(handle, "sha256").hexdigest())


def _names(folder: str, descriptor: int | None) -> set[str]:
    """The names a folder holds (through its descriptor, if opened)."""
    if is_url(folder):
        return {p.rsplit("/", 1)[-1] for p in storage.match(posixpath.join(folder, "*"))}
    return set(os.listdir(folder or ".") if descriptor is None else os.listdir(descriptor))


@contextmanager
def opened_folder(folder: str) -> Iterator[PublishedFolder | None]:
    """The folder's manifest promises (published_folder), its files opened through the folder
    as opened here; the descriptor closed on leaving."""
    published = published_folder(folder)
    try:
        yield published
    finally:
        if published is not None:
            published.close()


def published_folder(folder: str) -> PublishedFolder | None:
    """The promises of the manifest.json in folder; None when there is none; NotWholeOutput
    when it is not one kvtrace writes (unreadable, or lacking sha256 or records.exported).
    A local folder is opened first and its manifest read through it; the caller closes it
    (PublishedFolder.close, or opened_folder)."""
    descriptor = None if is_url(folder) else _open_folder(folder)
    try:
        published = _read_manifest(folder, descriptor)
    except BaseException:
        _close(descriptor)
        raise
    if published is None:
        _close(descriptor)
    return published


def _read_manifest(folder: str, descriptor: int | None) -> PublishedFolder | None:
    if descriptor is None and not storage.exists(posixpath.join(folder, MANIFEST)):
        return None  # an object store's: no descriptor to ask
    try:  # a FIFO or an endless file named manifest.json is refused, not waited on
        with _open_file(folder, descriptor, MANIFEST) as handle:
            content = handle.read(MAX_MANIFEST_BYTES + 1)
        if len(content) > MAX_MANIFEST_BYTES:
            raise ValueError(f"over {MAX_MANIFEST_BYTES} bytes")
        manifest = parse_json(content)
    except FileNotFoundError:
        return None
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
    return PublishedFolder(folder, sha256, exported, descriptor)


def _open_folder(folder: str) -> int:
    return os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _close(descriptor: int | None) -> None:
    if descriptor is not None:
        os.close(descriptor)


def _open_file(folder: str, opened: int | None, name: str) -> IO[bytes]:
    """A regular file of a folder by its name there, through the folder's descriptor if opened
    (a local one): no link followed, no FIFO waited on (opened without blocking, looked at on
    the descriptor read)."""
    if opened is None:
        return open_raw(posixpath.join(folder, name))
    descriptor = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=opened)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise storage.UnfitFile(f"{name} is not a regular file")
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def published_shards(files: Sequence[str]) -> dict[str, PublishedFolder]:
    """The files that are shards of a kvtrace output folder (by name, beside a manifest), each
    with what the folder's manifest promises, the folder opened once (the caller closes each:
    PublishedFolder.close)."""
    folders: dict[str, PublishedFolder | None] = {}
    found = {}
    try:
        for path in files:
            folder, name = posixpath.split(path)
            if not _is_shard(name):
                continue
            if folder not in folders:
                folders[folder] = published_folder(folder)
            if folders[folder] is not None:
                found[path] = folders[folder]
    except BaseException:
        for published in folders.values():
            if published is not None:
                published.close()
        raise
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
