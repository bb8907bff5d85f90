"""Create a file only if it does not exist yet, atomically where the filesystem allows it.

This is the id map's commit point: of two runs that extend the same version, the one that
creates the next version's metadata first publishes, the other is refused.

| filesystem | how                                                        | guarantee            |
|------------|------------------------------------------------------------|----------------------|
| local, NFS | write a private temp file, then link(2) it to the name      | atomic, complete     |
| gs://      | upload with the precondition ifGenerationMatch=0            | atomic, complete     |
| others     | check that the name is free, then create it                 | none against a race: |
|            | (Beam's S3 filesystem exposes no conditional put)           | one writer per map   |
"""

from __future__ import annotations

import os
import socket
import uuid

from transforms import storage
from transforms.storage import is_url

TEMP_MARK = ".tmp-"


def create_exclusive(path: str, data: bytes) -> bool:
    """Write data to path unless path exists; True when this call created it."""
    if not is_url(path):
        return _create_local(path, data)
    if path.startswith("gs://"):
        return _create_gcs(path, data)
    if storage.exists(path):
        return False
    with storage.create(path) as handle:
        handle.write(data)
    return True


def replace_file(path: str, data: bytes) -> None:
    """Write data in path's place, whatever it held: staged owner-only beside it under a temp
    name, then renamed over it, so that a reader finds the old bytes or the new, never part
    (the id map's files that are rewritten: CURRENT, a record keyed once, a mark)."""
    staged = temp_name(path)
    with storage.create(staged, private=True) as handle:
        handle.write(data)
    storage.rename(staged, path)


def temp_name(path: str) -> str:
    """A private temp name beside path, naming the process that writes it, so that a later run
    can tell a killed writer's leftover (remove_stale_temp_files) from a live one's."""
    return f"{path}{TEMP_MARK}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _create_local(path: str, data: bytes) -> bool:
    staged = temp_name(path)
    with storage.create(staged, private=True) as handle:  # durable before it is linked
        handle.write(data)
    try:
        os.link(staged, path)  # fails if path exists: the atomic step
        storage.sync_folder(os.path.dirname(path) or ".")
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(staged)


def remove_stale_temp_files(folder: str) -> list[str]:
    """Temp files in a local folder whose writer, on this host, is no longer running: what a
    commit killed between writing and linking leaves. Returns what went."""
    if is_url(folder) or not os.path.isdir(folder):
        return []
    host = socket.gethostname()
    stale = []
    for name in os.listdir(folder):
        if TEMP_MARK not in name:
            continue
        writer = name.rsplit(TEMP_MARK, 1)[1].rsplit("-", 2)
        if len(writer) == 3 and writer[0] == host and writer[1].isdigit() and not _alive(int(writer[1])):
            os.unlink(os.path.join(folder, name))
            stale.append(name)
    return stale


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _create_gcs(path: str, data: bytes) -> bool:
    from google.api_core.exceptions import PreconditionFailed
    from google.cloud import storage

    bucket, name = path[len("gs://"):].split("/", 1)
    blob = storage.Client().bucket(bucket).blob(name)
    try:
        blob.upload_from_string(data, if_generation_match=0)
        return True
    except PreconditionFailed:
        return False
