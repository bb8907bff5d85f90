"""Which files a trace argument names, the block size its kvtrace manifest declares, and what
that manifest promises of each file.

A kvtrace output folder holds each shard twice (JSONL and Parquet) beside stats.json and
manifest.json; read as a trace it is its JSONL shards, with the manifest's block size. Each
file is read once however it is spelled (by its device and inode: `out`, `./out` and its
absolute path are one folder); a kvtrace shard's Parquet twin whose JSONL twin is read is
dropped, so no row is counted twice. A glob that names every file of an output folder (`out/*`)
reads the folder. Any other file named is read.

A folder holding shards by kvtrace's names is read only as the whole output it was published
as, whichever way it is named (the folder, a glob of its shards, one shard): its manifest
there, every file it lists present with the sha256 it lists, no trace file it does not list.
It is pinned once, when the trace files are listed (pinned_whole): opened, its manifest read
through that descriptor, its identity (device and inode) kept, the files not read hashed. Every
fact taken from it comes from that pin: the block size (declared_block_size) and each shard's
rows, read through the folder opened again and found the same one (else refused), and checked
against the pinned sha256 (trace_io.read_trace); each shard's path carries its pin
(PinnedPath) to every reader and engine. The first MAX_HELD_FOLDERS folders pinned are held
open (their files read from the folder as pinned, wherever it is moved); any other is opened
again only while a file of it is opened or listed, so the descriptors a command holds are
bounded however many folders it reads (docs/BOUNDS.md). A Beam worker in this process reads
through the folder so held or checked; one elsewhere opens the file by its path and checks it against the pinned sha256. So a publish
that swaps the folder meanwhile is never mixed in: it is either not seen or refused. A partial copy (a shard or its twin cut short, a manifest or stats.json
not yet copied) is refused, never analysed. A trace file by a shard's name with no manifest
beside it is refused too: nothing proves it whole (its name does not: a one-shard night copied
halfway is still trace-00000-of-00001); renamed, it is a trace of its own.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import logging
import os
import posixpath
import stat
import uuid
import weakref
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

from kvtrace.transforms import storage
from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.read.paths import expand_inputs, file_identity, open_raw
from kvtrace.transforms.storage import is_url
from kvtrace.transforms.trace_format import (
    DERIVED_FROM,
    DERIVED_MANIFEST_SCHEMA,
    FORMAT,
    MANIFEST,
    MAX_BLOCK_SIZE,
    STATS,
    TRACE_FILE,
    TRACE_SHARDS,
    is_count,
    parse_json,
    schema_problems,
)

_LOG = logging.getLogger("kvtrace")
MAX_MANIFEST_BYTES = 16 << 20  # kvtrace's manifests are KiBs (a file list and sha256s)

# The folders pinned in this process (or the one it forked from) and still held, by token: a
# pin that comes back from pickling (a Beam worker here) is the folder as opened, not reopened.
_PINNED_HERE: weakref.WeakValueDictionary[str, PublishedFolder] = weakref.WeakValueDictionary()
# Folders held open at once, of the pins in this process: a few, whatever the folders read.
MAX_HELD_FOLDERS = 16


class NotWholeOutput(ValueError):
    """A kvtrace output folder that is not as it was published (a partial copy)."""

    def __init__(self, folder: str, why: str):
        super().__init__(f"{folder} is not a whole kvtrace output: {why} (copied partly?)")


@dataclass(frozen=True, eq=False)  # one per folder read: compared, and hashed, by identity
class PublishedFolder:
    """What a kvtrace output folder's manifest promises: each file's sha256, the rows exported,
    the block size; and which folder was opened when its manifest was read (identity: a local
    one's device and inode, until close()), the one its files are opened through: held open
    (descriptor) while few are, else opened again and checked to be it."""

    folder: str
    sha256: dict[str, str]
    exported: int
    block_size: int | None = None
    identity: tuple[int, int] | None = None
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    descriptor: int | None = None
    manifest_sha256: str = ""  # of the manifest's bytes: which output it is (read/measured.py)

    def __post_init__(self) -> None:
        if self.identity is not None:
            _PINNED_HERE[self.token] = self
        if self.descriptor is not None:
            object.__setattr__(self, "_closer", weakref.finalize(self, os.close, self.descriptor))

    def __reduce__(self) -> tuple[Any, tuple]:
        # The promises travel; an inode means nothing on another machine (_pinned).
        return _pinned, (
            self.folder,
            self.sha256,
            self.exported,
            self.block_size,
            self.token,
            self.manifest_sha256,
        )

    @property
    def files(self) -> frozenset[str]:
        """Every file it publishes: the ones its manifest lists, and the manifest."""
        return frozenset(self.sha256) | {MANIFEST}

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
            with self._opened() as descriptor:
                return _open_file(self.folder, descriptor, name)
        except NotWholeOutput:
            raise
        except FileNotFoundError:
            raise NotWholeOutput(self.folder, f"{name} is missing") from None
        except (OSError, ValueError) as err:  # a link, a FIFO, a folder in a file's place
            raise NotWholeOutput(self.folder, f"{name} cannot be read ({err})") from None

    def names(self) -> set[str]:
        with self._opened() as descriptor:
            return _names(self.folder, descriptor)

    @contextmanager
    def _opened(self) -> Iterator[int | None]:
        """The folder opened again (a local one), for as long as a file of it is opened or its
        names listed: the one whose manifest was read, or NotWholeOutput (a publish swapped
        it meanwhile): the guarantee a descriptor held throughout gave, one descriptor at a
        time."""
        if self.descriptor is not None or self.identity is None:
            yield self.descriptor
            return
        descriptor = _open_folder(self.folder)
        try:
            if _identity(descriptor) != self.identity:
                raise NotWholeOutput(self.folder, "it was replaced since its manifest was read")
            yield descriptor
        finally:
            os.close(descriptor)

    def close(self) -> None:
        """The pin let go; a read after opens by path, checked against the promises."""
        _PINNED_HERE.pop(self.token, None)
        object.__setattr__(self, "identity", None)
        closer = getattr(self, "_closer", None)
        if closer is not None:
            closer()
            object.__setattr__(self, "descriptor", None)  # never a number reused by another file


def _pinned(
    folder: str,
    sha256: dict[str, str],
    exported: int,
    block_size: int | None,
    token: str,
    manifest_sha256: str,
) -> PublishedFolder:
    """A pin unpickled: the folder as opened, where this process holds it; else its promises
    alone (files opened by path, each checked against them)."""
    here = _PINNED_HERE.get(token)
    return (
        here
        if here is not None
        else PublishedFolder(
            folder, sha256, exported, block_size, token=token, manifest_sha256=manifest_sha256
        )
    )


class PinnedPath(str):
    """A shard's path as named, with the folder it is read from as pinned when the trace files
    were listed: every read of it, by any engine in any process, is of the pinned output."""

    published: PublishedFolder

    def __new__(cls, path: str, published: PublishedFolder) -> PinnedPath:
        pinned = super().__new__(cls, path)
        pinned.published = published
        return pinned

    def __reduce__(self) -> tuple[Any, tuple]:
        return PinnedPath, (str(self), self.published)


def pin_of(path: str) -> PublishedFolder | None:
    """The folder a trace file was pinned with (trace_files), or None."""
    return path.published if isinstance(path, PinnedPath) else None


def _is_shard(name: str) -> bool:
    return TRACE_FILE.fullmatch(name) is not None


def _is_folder(path: str) -> bool:
    if is_url(path):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.exists(posixpath.join(path.rstrip("/"), MANIFEST))
    return os.path.isdir(path)


def trace_files(arguments: Sequence[str]) -> list[str]:
    """The files to read, in the order given (globs sorted), each once (repeats and read twins
    dropped); a kvtrace output folder's shards as PinnedPaths, the folder pinned whole
    (pinned_whole) once."""
    named = _named_once(arguments)
    # Each folder's identity taken once: a publish after this changes no file's group.
    keys = [_folder_identity(posixpath.dirname(path)) for path in named]
    read: dict[Any, tuple[PublishedFolder | None, frozenset[str]]] = {}
    for key, (folder, names) in _by_folder(named, keys).items():
        if any(_is_shard(name) or name in (MANIFEST, STATS) for name in names):
            read[key] = pinned_whole(folder, names)
    files: list[str] = []
    for path, key in zip(named, keys):
        published, names = read.get(key, (None, None))
        if names is None:
            files.append(path)
        elif posixpath.basename(path) in names:
            files.append(path if published is None else PinnedPath(path, published))
    return files


def _named_once(arguments: Sequence[str]) -> list[str]:
    """The files the arguments name (a folder: its JSONL shards), in order, each file once
    however spelled (paths.file_identity, as expand_inputs within one argument)."""
    files: list[str] = []
    spellings: dict[Any, list[str]] = {}
    for argument in arguments:
        pattern = argument
        if _is_folder(argument):
            folder = argument.rstrip("/") or "/"
            # The folder's name is itself, not a glob: night[1] is not night1.
            pattern = posixpath.join(
                folder if is_url(folder) else glob.escape(folder), TRACE_SHARDS
            )
            if not _matched(pattern):  # say what is missing, if it is a kvtrace output
                published, _ = pinned_whole(folder, ())
                if published is not None:
                    published.close()
        for path in expand_inputs([pattern]):
            names = spellings.setdefault(file_identity(path), [])
            if not names:
                files.append(path)
            names.append(path)
    for names in spellings.values():
        if len(names) > 1:
            _LOG.warning(
                "one file named %d ways, read once as %s: %s",
                len(names),
                names[0],
                ", ".join(names),
            )
    return files


def _by_folder(files: Sequence[str], keys: Sequence[Any]) -> dict[Any, tuple[str, set[str]]]:
    """The names read of each folder (by its identity, keys: one folder however spelled), with
    the folder as first spelled."""
    found: dict[Any, tuple[str, set[str]]] = {}
    for path, key in zip(files, keys):
        folder, name = posixpath.split(path)
        found.setdefault(key, (folder, set()))[1].add(name)
    return found


def _folder_identity(folder: str) -> Any:
    """What makes two spellings one folder: a local one's device and inode."""
    if is_url(folder):
        return folder
    try:
        status = os.stat(folder or ".")
    except OSError:
        return os.path.abspath(folder)
    return status.st_dev, status.st_ino


def _matched(pattern: str) -> list[str]:
    try:
        return expand_inputs([pattern])
    except FileNotFoundError:
        return []


def pinned_whole(
    folder: str, named: Collection[str]
) -> tuple[PublishedFolder | None, frozenset[str]]:
    """The folder pinned (published_folder: the caller closes it, or drops it) and the names
    of it to read: those named, a Parquet twin dropped where its JSONL twin is read; the
    folder's JSONL shards when every file it publishes is named (a glob of the folder: its
    manifest is no trace). Refused if not whole (NotWholeOutput: check_whole), or if its
    manifest or stats.json is named as a trace otherwise (ConfigError)."""
    published = published_folder(folder)
    try:
        present = _names(folder, None) if published is None else published.names()
        read = (
            published.shards
            if published is not None and set(named) == published.files
            else frozenset(n for n in named if not _twin_read(n, named))
        )
        own = read & {MANIFEST, STATS} if published is not None else frozenset()
        check_whole(folder, published, present, read - own)
        if own:
            raise ConfigError(
                f"{posixpath.join(folder, min(own))} is a kvtrace output's own "
                f"file, not a trace: name the folder, or its shards"
            )
    except BaseException:
        if published is not None:
            published.close()
        raise
    return published, read


def _twin_read(name: str, named: Collection[str]) -> bool:
    """A kvtrace shard's Parquet twin (by kvtrace's shard name) whose JSONL twin is read too:
    the same rows. Any other Parquet file is a trace of its own, read."""
    return (
        _is_shard(name)
        and name.endswith(".parquet")
        and name[: -len(".parquet")] + ".jsonl" in named
    )


def check_whole(
    folder: str, published: PublishedFolder | None, present: set[str], read: Collection[str]
) -> None:
    """Refuse a folder of kvtrace shards that is not whole: its manifest missing (where any
    file kvtrace publishes is: _check_lone), a file it lists
    missing or (unless read now: its bytes are checked as read) not of the sha256 listed, or a
    trace file read that it does not list."""
    if published is None:
        _check_lone(folder, present)
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


def _check_lone(folder: str, present: set[str]) -> None:
    """Only a manifest proves a shard whole (its sha256, its rows): a file kvtrace publishes
    (a shard, stats.json) with none beside it is a copy caught before its manifest arrived, or
    cut short, whatever its name says."""
    published = sorted(n for n in present if _is_shard(n) or n == STATS)
    if published:
        raise NotWholeOutput(
            folder, f"its {MANIFEST} is missing, and only it proves {published[0]} whole"
        )


def _names(folder: str, descriptor: int | None) -> set[str]:
    """The names a folder holds (through its descriptor, if opened)."""
    if is_url(folder):
        return {p.rsplit("/", 1)[-1] for p in storage.match(posixpath.join(folder, "*"))}
    return set(os.listdir(folder or ".") if descriptor is None else os.listdir(descriptor))


@contextmanager
def opened_folder(folder: str) -> Iterator[PublishedFolder | None]:
    """The folder's manifest promises (published_folder), its files opened through the folder
    as opened here; the pin let go on leaving."""
    published = published_folder(folder)
    try:
        yield published
    finally:
        if published is not None:
            published.close()


def published_folder(folder: str) -> PublishedFolder | None:
    """The folder pinned: the promises of its manifest.json, read through the folder opened
    here (a local one, closed once read); None when there is none; NotWholeOutput when it is
    not one kvtrace writes (unreadable, or lacking sha256 or records.exported). The one pinning
    every reader and engine uses; the caller closes it (PublishedFolder.close, or
    opened_folder), or drops it."""
    descriptor = None if is_url(folder) else _open_folder(folder)
    try:
        published = _read_manifest(folder, descriptor)
    except BaseException:
        if descriptor is not None:
            os.close(descriptor)
        raise
    if descriptor is None:
        return published
    if published is None or _held() >= MAX_HELD_FOLDERS:
        os.close(descriptor)
        return published
    return dataclasses.replace(published, descriptor=descriptor)


def _held() -> int:
    return sum(pin.descriptor is not None for pin in list(_PINNED_HERE.values()))


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
    if (
        manifest.get("format") != FORMAT
        or not is_count(exported)
        or not (isinstance(sha256, dict) and all(isinstance(v, str) for v in sha256.values()))
    ):
        raise NotWholeOutput(
            folder,
            f"its {MANIFEST} is not one kvtrace writes (no format, sha256 or records.exported)",
        )
    if DERIVED_FROM in manifest and (
        problems := schema_problems(manifest, DERIVED_MANIFEST_SCHEMA)
    ):
        raise NotWholeOutput(folder, f"its {MANIFEST} is not one kvtrace writes ({problems[0]})")
    block_size = manifest.get("block_size")
    if block_size is not None and not (is_count(block_size) and 0 < block_size <= MAX_BLOCK_SIZE):
        # declared, but no block size --block-size takes: never read as none declared
        raise NotWholeOutput(
            folder,
            f"its {MANIFEST} declares block size {str(block_size)[:40]}, not 1..{MAX_BLOCK_SIZE}",
        )
    identity = None if descriptor is None else _identity(descriptor)
    digest = hashlib.sha256(content).hexdigest()
    return PublishedFolder(folder, sha256, exported, block_size, identity, manifest_sha256=digest)


def _open_folder(folder: str) -> int:
    return os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _identity(descriptor: int) -> tuple[int, int]:
    status = os.fstat(descriptor)
    return status.st_dev, status.st_ino


def _open_file(folder: str, opened: int | None, name: str) -> IO[bytes]:
    """A regular file of a folder by its name there, through the folder's descriptor if opened
    (a local one): no link followed, no FIFO waited on (opened without blocking, looked at on
    the descriptor read)."""
    if opened is None:
        return open_raw(posixpath.join(folder, name))
    descriptor = os.open(
        name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=opened
    )
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise storage.UnfitFile(f"{name} is not a regular file")
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def published_shards(files: Sequence[str]) -> dict[str, PublishedFolder]:
    """The files that are shards of a kvtrace output folder (by name; with no manifest beside
    them, refused: _check_lone), each with what the folder's manifest promises, the folder
    pinned once here (the caller closes each: PublishedFolder.close). A PinnedPath's pin is
    trace_io's to use: not pinned again."""
    folders: dict[str, PublishedFolder | None] = {}
    found = {}
    try:
        for path in files:
            folder, name = posixpath.split(path)
            if not _is_shard(name) or pin_of(path) is not None:
                continue
            if folder not in folders:
                folders[folder] = published_folder(folder)
            published = folders[folder]
            if published is None:
                _check_lone(folder, {name})  # refuses it: nothing proves it whole
            found[path] = published
    except BaseException:
        for published in folders.values():
            if published is not None:
                published.close()
        raise
    return found


def declared_block_size(files: Sequence[str], given: int | None = None) -> int | None:
    """The block size the files are read at: given (--block-size), else the one the manifest
    every file was pinned with declares (trace_files); None when no file declares one. Traces
    that do not agree are refused (ConfigError), never read at a default: files declaring
    different sizes (or some none) without given, or given against a declared one."""
    declared = {
        f: published.block_size if (published := pin_of(f)) is not None else None for f in files
    }
    sizes = set(declared.values())
    if given is not None:
        against = next((f for f, size in declared.items() if size not in (None, given)), None)
        if against is not None:
            raise ConfigError(
                f"--block-size {given}, but {_declaring(against)} declares "
                f"{declared[against]}: its hash_ids are blocks of that size"
            )
        return given
    if len(sizes) > 1:
        first = next(f for f in files if declared[f] is not None)
        second = next(f for f in files if declared[f] != declared[first])
        raise ConfigError(
            f"{_declaring(first)} declares block size {declared[first]}, "
            f"{_declaring(second)} declares {declared[second] or 'none'}: read them "
            f"apart" + ("" if declared[second] else f", or give --block-size {declared[first]}")
        )
    return sizes.pop() if sizes else None


def _declaring(path: str) -> str:
    """Where a trace file's block size is declared: its folder's manifest, or nowhere."""
    published = pin_of(path)
    return posixpath.join(published.folder, MANIFEST) if published is not None else path
