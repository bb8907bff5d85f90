"""An id map's published version, anchored outside the map: a mark in a folder of marks.

The map's records are keyed, but every version a map ever had is valid: a map whose files are
all replaced by an older version's (a restored backup, or an edit that needs no salt) reads
cleanly, and its next night would number from the older next_id again, giving new keys ids
that published traces already use. So each commit leaves, in a folder the map's writers cannot
write, per map directory, the version it published and its record's sha256, MAC'd with the
map's key:

    MARKS/<sha256 of the map directory>.json

MARKS is --id-map-marks, by default SALT_FILE.id-map-marks beside a salt file. A salt from the
environment or a secret manager has no folder beside it, so a run with one names the folder or
is refused (marks_folder): every map is anchored, whatever holds its salt. A commit first
checks the map it extends against its mark: the map must have reached the marked version and
still hold that very record (it descends from it); anything else stops the night with nothing
published. Only a map's first commit finds no mark.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from typing import Any

from transforms import storage
from transforms.encode.salt import SaltSource
from transforms.errors import IdMapError, JobStopped
from transforms.ids.exclusive import folder_lock, remove_stale_temp_files, replace_file
from transforms.ids.map_record import MAX_VERSION, MapKey, keyed

MARKS = ".id-map-marks"
MARK_FORMAT = "kvtrace-id-map-mark"
MAX_MARK_BYTES = 4096  # a path, a version, two digests


def map_location(directory: str) -> str:
    """The map directory as the mark names it: where the kernel puts it (storage.place: links
    in its parents resolved, so `alias/map` with alias -> real is `real/map`), its own link
    kept (a link swapped to an older copy is the same map to its readers, so it must meet the
    same mark)."""
    directory = directory.rstrip("/")
    return directory if storage.is_url(directory) else storage.place(directory)


def marks_folder(salt: SaltSource, given: str | None) -> str:
    """Where a run's marks go: the folder given, else beside the salt file; a salt that is no
    file (an environment variable, a secret manager) has nothing beside it, so then the folder
    must be given: a map that is not anchored could be rolled back unnoticed."""
    if given:
        return given.rstrip("/") or "/"
    if salt.kind == "file":
        return salt.where + MARKS
    raise IdMapError(
        f"--id-map with the salt from {salt.describe()} needs --id-map-marks DIR: a folder, "
        f"outside the map and not writable by whoever can write the map, where each commit "
        f"marks the version it published (a salt file keeps them beside it; docs/ID_MAP.md, "
        f"'Rollback'). Nothing was read or written.")


def mark_path(marks: str, directory: str) -> str:
    """The map's mark in the folder of marks: one per map directory."""
    name = hashlib.sha256(map_location(directory).encode()).hexdigest()[:32]
    return storage.join(marks, f"{name}.json")


def mark_bytes(directory: str, version: int, record: bytes, key: MapKey) -> bytes:
    return keyed({"format": MARK_FORMAT, "map": map_location(directory), "version": version,
                  "record_sha256": hashlib.sha256(record).hexdigest()}, key)


def read_mark(path: str, directory: str, key: MapKey) -> dict[str, Any] | None:
    """The mark's fields, verified: the bytes are exactly what mark_bytes writes for them (its
    MAC included) and name this map; None when there is no mark."""
    if not storage.exists(path):
        return None
    try:
        with storage.open_read(path) as handle:
            raw = handle.read(MAX_MARK_BYTES + 1)
        mark = json.loads(raw)
        valid = _is_mark(mark, raw, directory, key)
    except (OSError, ValueError, RecursionError):  # unreadable, not JSON, or a value no mark
        valid = False                               # holds (NaN)
    if not valid:
        raise JobStopped(
            f"the id map's mark {path} does not verify with this run's salt or names another "
            f"map: it was altered, or belongs to another salt. Restore it from the backup of "
            f"the folder of marks; the map was not extended and no trace was published")
    return mark


def _is_mark(mark: Any, raw: bytes, directory: str, key: MapKey) -> bool:
    """Whether raw is the mark kvtrace writes for this map, MAC and all."""
    return (type(mark) is dict
            and mark.keys() == {"format", "map", "version", "record_sha256", "mac"}
            and mark["map"] == map_location(directory)
            and type(mark["version"]) is int and 1 <= mark["version"] <= MAX_VERSION
            and hmac.compare_digest(raw, keyed({k: v for k, v in mark.items() if k != "mac"},
                                               key)))


def check_anchor(path: str, directory: str, version: int,
                 record_of: Callable[[int], bytes], key: MapKey) -> None:
    """Refuse to extend a map that is not at or past its marked version, or no longer holds
    the marked record (rolled back, or replaced by another map). record_of(number) gives a
    version's record bytes as stored."""
    mark = read_mark(path, directory, key)
    if mark is None:
        return
    marked = mark["version"]
    if version < marked or hashlib.sha256(record_of(marked)).hexdigest() != mark[
            "record_sha256"]:
        raise JobStopped(
            f"the id map {directory} is at version {version}, but version {marked} of it was "
            f"published (its mark {path} says so, with that version's record): the map was "
            f"rolled back or replaced, and extending it would give new keys ids published "
            f"traces already use. Restore the map's newest version, or start a new map in "
            f"another directory; the map was not extended and no trace was published")


def advance_anchor(path: str, directory: str, version: int, record: bytes,
                   key: MapKey) -> None:
    """Mark `version` (whose record bytes are `record`) as published: the mark only moves
    forward. It is replaced under the folder's lock after being read again there, so a run
    that committed earlier but marks later never writes its version over a later one's (that
    later version descends from it: its mark covers this one). Staged and renamed, owner-only."""
    if _covers(read_mark(path, directory, key), path, version, record):
        return  # nothing to move: no lock taken
    folder = path.rsplit("/", 1)[0]
    storage.make_folder(folder, private=True)
    with folder_lock(folder):
        if _covers(read_mark(path, directory, key), path, version, record):
            return
        remove_stale_temp_files(folder)  # of marks whose writer was killed before its rename
        replace_file(path, mark_bytes(directory, version, record, key))


def _covers(mark: dict[str, Any] | None, path: str, version: int, record: bytes) -> bool:
    """Whether the mark is at `version` with this record, or past it; a mark of `version` with
    another record is refused: the map was replaced while this run committed."""
    if mark is None or mark["version"] < version:
        return False
    if mark["version"] == version and mark["record_sha256"] != hashlib.sha256(
            record).hexdigest():
        raise JobStopped(
            f"the id map's mark {path} names another record for version {version} than the "
            f"one this run committed: the map was replaced while it ran. Restore the map's "
            f"newest version; no trace was published")
    return True
