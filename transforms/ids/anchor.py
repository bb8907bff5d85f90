"""An id map's published version, anchored outside the map: marks in a folder of marks.

The map's records are keyed, but every version a map ever had is valid: a map whose files are
all replaced by an older version's (a restored backup, or an edit that needs no salt) reads
cleanly, and its next night would number from the older next_id again, giving new keys ids
that published traces already use. So each commit leaves, in a folder the map's writers cannot
write, MAC'd with the map's key:

    MARKS/map-<map id>.json          the version it published, its record's sha256, the place
    MARKS/<sha256 of the place>.json the id of the map last published at that place (and at
                                     its spelling, when links in its path lead there)

A map's id is given at its creation (id_map.map_id_of) and in every version's record, so every
spelling of a map (a link, a bind mount, a second mount of a volume) and every copy of it finds
the same mark: an older copy is a rollback. Each record holds the sha256 of the one before it,
so a commit walks from the map's current record down to the marked version's (the versions
between are those committed since the mark moved: one, or a few after killed runs) and refuses
a map that does not descend from the marked record (another map of the same id, or a forged
newest record). A place names the map last published there: another map found there (another
id, a map from before ids, or a new one) is refused until the operator rebinds the place on
purpose (`kvtrace id-map rebind`). A place file of format 5's time (a mark named by the place,
of a map from before ids) is checked as that mark until the map's next commit replaces it.

MARKS is --id-map-marks, by default SALT_FILE.id-map-marks beside a salt file. A salt from the
environment or a secret manager has no folder beside it, so a run with one names the folder or
is refused (marks_folder): every map is anchored, whatever holds its salt. Only a map's first
commit finds no mark.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Callable
from typing import Any

from kvtrace.transforms import storage
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.errors import IdMapError, JobStopped
from kvtrace.transforms.ids.exclusive import folder_lock, remove_stale_temp_files, replace_file
from kvtrace.transforms.ids.map_files import map_file_exists, open_map_file
from kvtrace.transforms.ids.map_record import MAX_VERSION, MapKey, keyed, unverified_members

MARKS = ".id-map-marks"
MARK_FORMAT = "kvtrace-id-map-mark"
PLACE_FORMAT = "kvtrace-id-map-place"
# What a mark or place file holds is fixed in size (~300 bytes): an id, a version, digests, the
# place by its digest (location_digest). Marks written before that held the place's path (up
# to PATH_MAX, each byte not UTF-8 escaped to 6): read whole up to this, as they were.
MAX_MARK_BYTES = 8192


def map_location(directory: str) -> str:
    """The map directory as its place file names it: where the kernel puts it (storage.place:
    links in its parents resolved), its own link kept. Only the place binding uses it: the
    map's id names its mark, whatever the spelling."""
    directory = directory.rstrip("/")
    return directory if storage.is_url(directory) else storage.place(directory)


def map_spelling(directory: str) -> str:
    """The map directory as the run names it: absolute, every link in its path kept (a relative
    one from the working folder as the user reached it: working_folder). Its place follows a
    link in the path; the spelling does not, so a link repointed (to an empty folder, or
    another map) leaves the spelling bound to the map it named: bound as the place is, it
    finds no map there, or another, and is refused, never taken for a new map from id 0."""
    directory = directory.rstrip("/") or "/"
    if storage.is_url(directory) or os.path.isabs(directory):
        return directory
    return os.path.join(working_folder(), directory)


def working_folder() -> str:
    """The working folder as the user reached it: $PWD, which a shell sets to the path cd was
    given, links kept (`cd /srv/current`), when it is absolute, has no `.` or `..` and names
    the folder the kernel gives (os.getcwd(), links resolved), as `pwd` decides; else that."""
    physical = os.getcwd()
    logical = os.environ.get("PWD", "")
    if not os.path.isabs(logical) or {".", ".."} & set(logical.split("/")):
        return physical
    try:
        same = os.path.samestat(os.stat(logical), os.stat(physical))
    except OSError:  # $PWD names nothing now
        return physical
    return logical if same else physical


def bound_locations(directory: str) -> list[str]:
    """What a commit binds to the map's id: its place and, when links lead there, its spelling."""
    return sorted({map_location(directory), map_spelling(directory)})


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
        f"'Rollback'). Nothing was read or written."
    )


# The files kvtrace writes in a folder of marks (mark_path, location_path), as a regular
# expression: only their temp files are ever removed there.
MARKS_FILES = r"(?:map-)?[0-9a-f]{32}\.json"


def mark_path(marks: str, map_id: str) -> str:
    """The map's mark in the folder of marks: one per map, named by its id."""
    return storage.join(marks, f"map-{map_id}.json")


def place_path(marks: str, directory: str) -> str:
    """The place's file in the folder of marks."""
    return location_path(marks, map_location(directory))


def location_path(marks: str, location: str) -> str:
    """A bound location's file in the folder of marks, named from the location's digest."""
    return storage.join(marks, f"{location_digest(location)[:32]}.json")


def location_digest(location: str) -> str:
    """A location as marks hold it: the sha256 of its bytes (a Linux name need not be UTF-8:
    os.fsencode gives back the bytes a surrogate stands for), so a mark's size does not grow
    with its path's (a long name escaped in JSON would outgrow MAX_MARK_BYTES)."""
    return hashlib.sha256(os.fsencode(location)).hexdigest()


def mark_bytes(directory: str, map_id: str, version: int, record: bytes, key: MapKey) -> bytes:
    return keyed(
        {
            "format": MARK_FORMAT,
            "map_id": map_id,
            "place": location_digest(map_location(directory)),
            "version": version,
            "record_sha256": hashlib.sha256(record).hexdigest(),
        },
        key,
    )


def place_bytes(location: str, map_id: str, key: MapKey) -> bytes:
    return keyed(
        {"format": PLACE_FORMAT, "place": location_digest(location), "map_id": map_id}, key
    )


def read_mark(path: str, map_id: str, key: MapKey) -> dict[str, Any] | None:
    """The map's mark, verified: exactly what mark_bytes writes for this map's id; None when
    there is none."""
    return _read_keyed(
        path,
        key,
        lambda mark: (
            mark.keys() == {"format", "map_id", "place", "version", "record_sha256", "mac"}
            and mark["format"] == MARK_FORMAT
            and mark["map_id"] == map_id
            and type(mark["place"]) is str
            and _is_version(mark["version"])
        ),
    )


def read_location(path: str, location: str, key: MapKey) -> dict[str, Any] | None:
    """A bound location's file, verified: the binding place_bytes writes (the location by its
    digest; by its path before that), or a mark named by the place (from before map ids: it
    has a version, no map_id); None when there is none."""

    def names_this_place(mark: dict[str, Any]) -> bool:
        bound = mark.keys() == {"format", "place", "map_id", "mac"} and (
            mark["format"] == PLACE_FORMAT
            and mark["place"] in (location_digest(location), location)
        )
        return bound or (
            mark.keys() == {"format", "map", "version", "record_sha256", "mac"}
            and mark["format"] == MARK_FORMAT
            and mark["map"] == location
            and _is_version(mark["version"])
        )

    return _read_keyed(path, key, names_this_place)


def _is_version(value: Any) -> bool:
    return type(value) is int and 1 <= value <= MAX_VERSION


def _read_keyed(
    path: str, key: MapKey, fits: Callable[[dict[str, Any]], bool]
) -> dict[str, Any] | None:
    """A file of the folder of marks, verified: its bytes exactly what keyed writes for its
    fields (MAC included), fits; None when there is none."""
    if not map_file_exists(path):
        return None
    try:
        with open_map_file(path) as handle:
            raw = handle.read(MAX_MARK_BYTES + 1)
        mark = json.loads(raw)
        valid = (
            type(mark) is dict
            and "mac" in mark
            and fits(mark)
            and hmac.compare_digest(raw, keyed({k: v for k, v in mark.items() if k != "mac"}, key))
        )
    except storage.UnfitFile as err:  # before ValueError, which it is: told as what it is
        raise JobStopped(
            f"the id map's mark {err}: kvtrace writes only regular files in the folder of "
            f"marks. Restore it from the backup of the folder of marks; the map was not "
            f"extended and no trace was published"
        ) from None
    except (OSError, ValueError, RecursionError, TypeError):  # unreadable, not JSON, or a
        valid = False  # value no mark holds (NaN)
    if not valid:
        raise JobStopped(
            f"the id map's mark {path} does not verify with this run's salt or names another "
            f"map: it was altered, or belongs to another salt. Restore it from the backup of "
            f"the folder of marks; the map was not extended and no trace was published"
        )
    return mark


def check_anchor(
    marks: str,
    directory: str,
    version: int,
    map_id: str | None,
    record_of: Callable[[int], bytes],
    key: MapKey,
    bound: bool = True,
    anew: bool = False,
) -> None:
    """Refuse to extend a map that is not the one its place (or its spelling) was last
    published with (unless not bound: a rebind), is not at or past its marked version, or does
    not descend from the marked record (rolled back, or replaced by another map), or has a
    committed version and no mark (unless anew: an operator's upgrade or rebind starts its
    marks on purpose, vouching for the map).
    record_of(number) gives a version's record bytes as stored; map_id is None for a map from
    before ids, or a new one."""
    marked = False  # whether a mark of this map was found, by its id or by its place
    for location in bound_locations(directory) if bound else []:
        place = location_path(marks, location)
        found = read_location(place, location, key)
        if found is not None and "version" in found:  # a mark from before ids, by the place
            _check_descent(found, place, directory, version, record_of)
            marked = True
        elif found is not None and found["map_id"] != map_id:
            raise JobStopped(
                f"the id map {directory} is not the map last published there (map id "
                f"{found['map_id']}, its place file {place}): it was replaced by another map, "
                f"its versions were removed, or a link in its path leads elsewhere now. "
                f"Restore that map; or, if this one replaced it on purpose (a new map there "
                f"too), run `kvtrace id-map rebind {directory}` with its salt. The map was "
                f"not extended and no trace was published"
            )
    if map_id is not None:
        path = mark_path(marks, map_id)
        mark = read_mark(path, map_id, key)
        if mark is not None:
            _check_descent(mark, path, directory, version, record_of)
        elif not (anew or marked) and version > 0:
            raise JobStopped(unmarked(directory, version, map_id, marks))


def unmarked(directory: str, version: int, map_id: str, marks: str) -> str:
    """Why a committed map (it has an id) is not extended without its mark: each commit marks
    its version, so only a map's first commit finds none. Whatever the cause (a backup rolled
    back, the folder of marks named another way: beside a salt file named through a link), the
    map cannot be told from a rolled-back one; starting its marks anew is a deliberate act."""
    return (
        f"the id map {directory} is at version {version} (map id {map_id}), but the folder of "
        f"marks {marks} holds no mark of it, and only a map's first commit finds no mark: the "
        f"map may have been rolled back or copied, or its marks are kept in another folder "
        f"(the default one is named from the salt file's path as given: a link to it names "
        f"another). Give --id-map-marks the folder its nights marked; or, if that folder is "
        f"lost, start its marks anew on purpose with `kvtrace id-map rebind {directory}` and "
        f"its salt. The map was not extended and no trace was published"
    )


def _check_descent(
    mark: dict[str, Any], path: str, directory: str, version: int, record_of: Callable[[int], bytes]
) -> None:
    marked = mark["version"]
    if not descends(version, marked, mark["record_sha256"], record_of):
        raise JobStopped(
            f"the id map {directory} is at version {version}, but version {marked} of it was "
            f"published (its mark {path} says so, with that version's record), and its current "
            f"record does not descend from it: the map was rolled back or replaced, and "
            f"extending it would give new keys ids published traces already use. Restore the "
            f"map's newest version, or start a new map in another directory; the map was not "
            f"extended and no trace was published"
        )


def descends(
    version: int, marked: int, marked_sha256: str, record_of: Callable[[int], bytes]
) -> bool:
    """Whether version `version`'s record descends from the marked one: each record names the
    sha256 of the one before it, down to the marked record's. The walk reads one record per
    version between (bounded: each record is, and the versions between are the map's own). A
    record from before the chain names none: below it, only the marked record itself is
    compared (what marks checked then)."""
    if version < marked:
        return False
    raw = record_of(version)
    for number in range(version, marked, -1):
        previous = previous_sha256(raw)
        if previous is None:
            return hashlib.sha256(record_of(marked)).hexdigest() == marked_sha256
        raw = record_of(number - 1)
        if hashlib.sha256(raw).hexdigest() != previous:
            return False
    return hashlib.sha256(raw).hexdigest() == marked_sha256


def previous_sha256(raw: bytes) -> str | None:
    """The sha256 a record names for the record before it; None for one from before the chain
    (or bytes that name none: the walk then fails on the hashes). The record may not be
    verified yet (the newest, read to check its anchor before its MAC), so the member is read
    unparsed, as any unverified record's (map_record.unverified_members)."""
    previous = unverified_members(raw, ("previous_sha256",)).get("previous_sha256")
    return previous if type(previous) is str else None


def advance_anchor(
    marks: str, directory: str, map_id: str, version: int, record: bytes, key: MapKey
) -> None:
    """Mark `version` (whose record bytes are `record`) of map `map_id` as published at this
    place: the mark only moves forward. It is replaced under the folder's lock after being
    read again there, so a run that committed earlier but marks later never writes its version
    over a later one's (that later version descends from it: its mark covers this one). The
    place and spelling are bound to the map's id. Staged and renamed, owner-only."""
    path, locations = mark_path(marks, map_id), bound_locations(directory)

    def done() -> tuple[bool, list[str]]:
        unbound = [
            location
            for location in locations
            if (read_location(location_path(marks, location), location, key) or {}).get("map_id")
            != map_id
        ]
        return _covers(read_mark(path, map_id, key), path, version, record), unbound

    if done() == (True, []):
        return  # nothing to move: no lock taken
    storage.make_folder(marks, private=True)
    with folder_lock(marks):
        covered, unbound = done()
        # of marks whose writer was killed before its rename
        remove_stale_temp_files(marks, MARKS_FILES)
        if not covered:
            replace_file(path, mark_bytes(directory, map_id, version, record, key))
        for location in unbound:
            replace_file(location_path(marks, location), place_bytes(location, map_id, key))


def rebind(marks: str, directory: str, map_id: str | None, key: MapKey) -> None:
    """Bind the place and spelling to the map found there now, on purpose (`kvtrace id-map
    rebind`): to its id, or to none (their files removed) for a new map or one from before
    ids, whose next commit binds them."""
    places = {location: location_path(marks, location) for location in bound_locations(directory)}
    if map_id is None:
        storage.delete([path for path in places.values() if storage.exists(path)])
        return
    storage.make_folder(marks, private=True)
    with folder_lock(marks):
        remove_stale_temp_files(marks, MARKS_FILES)
        for location, path in places.items():
            replace_file(path, place_bytes(location, map_id, key))


def _covers(mark: dict[str, Any] | None, path: str, version: int, record: bytes) -> bool:
    """Whether the mark is at `version` with this record, or past it; a mark of `version` with
    another record is refused: the map was replaced while this run committed."""
    if mark is None or mark["version"] < version:
        return False
    if mark["version"] == version and mark["record_sha256"] != hashlib.sha256(record).hexdigest():
        raise JobStopped(
            f"the id map's mark {path} names another record for version {version} than the "
            f"one this run committed: the map was replaced while it ran. Restore the map's "
            f"newest version; no trace was published"
        )
    return True
