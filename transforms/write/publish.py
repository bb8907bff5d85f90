"""An output folder published whole or not at all.

A run writes every file of its output (trace shards, stats.json, manifest.json last) into a
staging folder beside the output, each file synced as it closes; publishing then swaps the
staging folder with the output in one atomic step, so a reader, a crash or a full disk never
meets a mix of two runs or a half-written file: before the swap the folder is the previous
output, after it the new one.

    parent/.NAME.kvtrace-lock               held (flock) by the run writing NAME: one at a time
    parent/.NAME.kvtrace-staging-RUNID/     the run's output while it is written (owner-only)
    parent/NAME/                            the published output

Local filesystems swap with renameat2(RENAME_EXCHANGE) (Linux), or, where a filesystem lacks it,
two renames whose gap a later run closes (restore_interrupted). Object stores have no atomic
folder: files are copied in, the manifest last, so the manifest (listing every file's sha256)
is what marks a complete output there; one writer per output folder.

A run refuses an output folder holding anything kvtrace did not write (files its manifest does
not list): it publishes only what it produced, and removes only what an earlier run published.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from transforms import storage
from transforms.errors import JobStopped
from transforms.storage import is_url
from transforms.trace_format import FORMAT, MANIFEST

STAGING_MARK = ".kvtrace-staging-"
LOCK_MARK = ".kvtrace-lock"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class OutputRefused(ValueError):
    """The output folder cannot be published into: the message says why and what to do."""


def staging_folder(output: str, run_id: str) -> str:
    parent, name = _split(output)
    return storage.join(parent, f".{name}{STAGING_MARK}{run_id}") if parent else \
        f".{name}{STAGING_MARK}{run_id}"


def _split(path: str) -> tuple[str, str]:
    path = path.rstrip("/")
    if "/" not in path:
        return "", path
    parent, name = path.rsplit("/", 1)
    return parent or "/", name


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def foreign_files(output: str) -> list[str]:
    """What the output folder holds that no kvtrace manifest there lists (all of it, when it has
    no readable manifest); subfolders and hidden files included."""
    if is_url(output):
        present = [p.rsplit("/", 1)[-1] for p in storage.match(storage.join(output, "*"))]
    elif os.path.isdir(output):
        present = sorted(os.listdir(output))
    elif os.path.exists(output):
        return [output]
    else:
        return []
    listed = set(_listed(output))
    return [name for name in present if name not in listed]


def _listed(output: str) -> list[str]:
    path = storage.join(output, MANIFEST)
    try:
        with storage.open_read(path) as handle:
            manifest = json.loads(handle.read())
        files = manifest["files"]
        if manifest.get("format") != FORMAT or not all(
                isinstance(f, str) and "/" not in f for f in files):
            return []
        return [*files, MANIFEST]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def check_output(output: str) -> None:
    """Refuse an output folder holding files kvtrace did not write (or a file in its place)."""
    foreign = foreign_files(output)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise OutputRefused(
            f"--output {output} holds files kvtrace did not write ({shown}); a run replaces an "
            f"output folder whole, so it must be new, empty, or an earlier kvtrace output")


@contextmanager
def output_lock(output: str) -> Iterator[None]:
    """Hold the output's lock for a run (local folders): a second run on the same output is
    refused at once, and the holder may clear what killed runs left beside the output."""
    if is_url(output):
        yield
        return
    parent, name = _split(os.path.abspath(output))
    os.makedirs(parent, exist_ok=True)
    handle = os.open(os.path.join(parent, f".{name}{LOCK_MARK}"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JobStopped(f"another kvtrace run is writing {output}; one run per output "
                             f"folder at a time") from None
        restore_interrupted(output)
        yield
    finally:
        os.close(handle)


def restore_interrupted(output: str) -> list[str]:
    """Under the output's lock: put back an output a run took away and died before replacing
    (the two-rename path), then remove killed runs' staging folders. Returns what went."""
    parent, name = _split(os.path.abspath(output))
    leftovers = sorted(p for p in os.listdir(parent) if p.startswith(f".{name}{STAGING_MARK}"))
    previous = [p for p in leftovers if p.endswith(".previous")]
    if previous and not os.path.exists(output):
        os.rename(os.path.join(parent, previous[-1]), output)
        leftovers.remove(previous[-1])
    for leftover in leftovers:
        shutil.rmtree(os.path.join(parent, leftover), ignore_errors=True)
    return leftovers


def publish_folder(staging: str, output: str) -> None:
    """Replace the output folder with the staging folder, whole; the staging folder's files
    are durable already (storage.create syncs each)."""
    check_output(output)  # again: something may have appeared while the run ran
    if is_url(output):
        _publish_remote(staging, output)
        return
    storage.sync_folder(staging)
    os.chmod(staging, storage.PUBLIC_FOLDER)
    if not os.path.exists(output):
        try:
            os.rename(staging, output)
            storage.sync_folder(os.path.dirname(os.path.abspath(output)))
            return
        except OSError as err:
            if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    if not _exchange(staging, output):
        previous = f"{staging}.previous"
        os.rename(output, previous)  # a gap restore_interrupted closes if the run dies here
        os.rename(staging, output)
        staging = previous
    storage.sync_folder(os.path.dirname(os.path.abspath(output)))
    shutil.rmtree(staging)  # now the previous output


def _exchange(first: str, second: str) -> bool:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second),
                       _RENAME_EXCHANGE)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), second)


def _publish_remote(staging: str, output: str) -> None:
    """Object stores: the old manifest goes first (the folder stops claiming completeness),
    then the files, then the manifest."""
    old = storage.join(output, MANIFEST)
    if storage.exists(old):
        storage.delete([old])
    names = [p.rsplit("/", 1)[-1] for p in storage.match(storage.join(staging, "*"))]
    for name in sorted(names, key=lambda n: n == MANIFEST):
        storage.rename(storage.join(staging, name), storage.join(output, name))
    listed = set(names)
    stale = [p for p in storage.match(storage.join(output, "*"))
             if p.rsplit("/", 1)[-1] not in listed]
    if stale:
        storage.delete(stale)
