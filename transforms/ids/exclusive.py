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
import uuid

from transforms import storage
from transforms.read.paths import is_url


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


def _create_local(path: str, data: bytes) -> bool:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    staged = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(staged, "xb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(staged, path)  # fails if path exists: the atomic step
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(staged)


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
