"""Create a file only if it does not exist yet, atomically where the filesystem allows it.

This is the id map's commit point: of two runs that extend the same version, the one that
creates the next version's metadata first publishes, the other is refused.

| filesystem | how                                                        | guarantee            |
|------------|------------------------------------------------------------|----------------------|
| local, NFS | write a private temp file, then link(2) it to the name      | atomic, complete     |
| gs://      | upload with the precondition ifGenerationMatch=0            | atomic, complete     |
| others     | check that the name is free, then create it                 | none against a race: |
|            | (Beam's S3 filesystem exposes no conditional put)           | one writer per map   |

A file that is read and then replaced (a mark in the folder of marks) is replaced under the
folder's lock (folder_lock: flock(2) on the folder, local folders), so that of two runs
the later reads what the earlier wrote.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kvtrace.transforms import storage
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.storage import is_url

TEMP_MARK = ".tmp-"
TEMP_DIGITS = 16  # the random hex digits after TEMP_MARK
# A holder reads and writes one small file: a lock held this long is held by a stuck run.
LOCK_WAIT_S = 60.0
LOCK_POLL_S = 0.01


def create_exclusive(path: str, data: bytes, created: Callable[[], None] = lambda: None) -> bool:
    """Write data to path unless path exists; True when this call created it. created: called
    the moment path stands, before the call's own syncing and tidying, so a stop or a failure
    in those still knows the file was made."""
    if not is_url(path):
        return _create_local(path, data, created)
    if path.startswith("gs://"):
        made = _create_gcs(path, data)
    elif storage.exists(path):
        return False
    else:
        with storage.create(path) as handle:
            handle.write(data)
        made = True
    if made:
        created()
    return made


def replace_file(path: str, data: bytes) -> None:
    """Write data in path's place, whatever it held: staged owner-only beside it under a temp
    name, then renamed over it, so that a reader finds the old bytes or the new, never part
    (the id map's files that are rewritten: CURRENT, a record keyed once, a mark)."""
    if is_url(path):  # one writer at a time there, and nothing to clear
        staged = temp_name(path)
        with storage.create(staged, private=True) as handle:
            handle.write(data)
        storage.rename(staged, path)
        return
    with _held_temp(path) as staged:
        with storage.create(staged, private=True) as handle:
            handle.write(data)
        storage.rename(staged, path)


@contextmanager
def folder_lock(folder: str) -> Iterator[None]:
    """Hold the lock of a local folder (which must exist; flock(2) on the folder itself, so no
    lock file joins the folder's files) while the caller reads and replaces a file in it; waits
    for another holder at most LOCK_WAIT_S, then stops in one line. Object stores have no
    lock: one writer at a time there."""
    if is_url(folder):
        yield
        return
    handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _wait_for_lock(handle, folder)
        yield
    finally:
        os.close(handle)  # releases the lock


def _wait_for_lock(handle: int, path: str) -> None:
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise JobStopped(
                    f"another kvtrace run held the lock of {path} for over "
                    f"{LOCK_WAIT_S:.0f} s; nothing was written. Try again once it "
                    f"ends"
                ) from None
            time.sleep(LOCK_POLL_S)


def temp_name(path: str) -> str:
    """A new temp name beside path: path, TEMP_MARK, TEMP_DIGITS random hex digits (temp_names
    matches them)."""
    return f"{path}{TEMP_MARK}{uuid.uuid4().hex[:TEMP_DIGITS]}"


def temp_names(replaced: str) -> str:
    """A regular expression of the temp names temp_name gives the files whose names the regular
    expression `replaced` matches whole."""
    return rf"(?:{replaced}){re.escape(TEMP_MARK)}[0-9a-f]{{{TEMP_DIGITS}}}"


@contextmanager
def _held_temp(path: str) -> Iterator[str]:
    """A private temp file beside a local path, empty, held by this process while the context
    lasts (storage.held): another run removes it only once its writer is done or dead."""

    def make() -> str:
        staged = temp_name(path)
        storage.create(staged, private=True).close()
        return staged

    with storage.held(make) as staged:
        yield staged


def _create_local(path: str, data: bytes, created: Callable[[], None]) -> bool:
    with _held_temp(path) as staged:
        try:
            with storage.create(staged, private=True) as handle:  # durable before it is linked
                handle.write(data)
            os.link(staged, path)  # fails if path exists: the atomic step
            created()
            storage.sync_folder(os.path.dirname(path) or ".")
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(staged)


def remove_stale_temp_files(folder: str, replaced: str) -> list[str]:
    """Temp files in a local folder that no run holds (_held_temp): what a commit killed
    between writing and linking leaves, whatever host or PID namespace it ran in. Only regular
    files named as temp_name names those of the files kvtrace writes there (`replaced`, a
    regular expression of their names) go: never a folder, a link, or a name of anyone else's.
    Returns what went."""
    if is_url(folder) or not os.path.isdir(folder):
        return []
    temps = re.compile(temp_names(replaced))
    return [
        name
        for name in sorted(os.listdir(folder))
        if temps.fullmatch(name)
        and _is_regular(os.path.join(folder, name))
        and storage.remove_unheld(os.path.join(folder, name))
    ]


def _is_regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:  # removed meanwhile by another run's cleanup
        return False


def _create_gcs(path: str, data: bytes) -> bool:
    from google.api_core.exceptions import PreconditionFailed
    from google.cloud import storage

    bucket, name = path[len("gs://") :].split("/", 1)
    blob = storage.Client().bucket(bucket).blob(name)
    try:
        blob.upload_from_string(data, if_generation_match=0)
        return True
    except PreconditionFailed:
        return False
