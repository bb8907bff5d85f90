"""The persisted hash -> id map of nightly exports: layout, metadata, reading, atomic publishing.

A map directory holds immutable versions and one pointer:

    CURRENT                                      {"version": 3}: a hint, the only file overwritten
    versions/000003.json                         version 3's metadata, listing its segment files
    segments/000003-NAME/blocks-00012.parquet    ids first numbered by version 3, hash shard 12
    segments/000003-NAME/blocks-00012.index.npz  its index (segments.py)

Every segment of a version is split into the version's hash_shards shards, so a night finds a
key's rows in one file per segment. A compaction night may change the count (it rewrites all).

A run reads the published version, writes its new ids as a segment in a folder named by the
version it targets and its own run id (two runs never write the same paths), moves them, just
before its commit, to a folder named by the version and their content (settle_segments: so a
record lists what the night made, not which run made it, and the same nights give the same map
bytes), then commits by creating the next version's metadata exclusively (exclusive.py: atomic locally and on gs://). Of two runs
extending one version, the first to commit publishes; the other is refused and publishes
nothing. CURRENT is then moved forward; readers also follow committed versions beyond it, so a
run killed between the two steps has still published. Each version names the night that made
it (Night: its start and identity), so that night's rerun publishes the same start and the gate
can confirm a night against the map. Cleanup deletes only segments of versions
already decided (<= the published one) that the winner's metadata does not list: never those of
a published version or of a run still under way. Segments hold keyed 16-byte hashes and ids
only, never tokens or text.

Durability and integrity: segment files are synced before the version listing them is created;
a version records every file's sha256 and size (checked when read, segments.SegmentFile) and
is keyed by a MAC from the run's salt (map_record.py): every read of a version checks it first,
then every field; every row group read is checked against its digest, every row against its
shard and next_id (segments.py). A commit checks the map against the version its mark in the
folder of marks anchors (anchor.py): a map rolled back or replaced is not extended. A map
whose versions are gone but whose segments remain is refused, never taken for a new map (that
would restart ids and delete the segments); every file is owner-only.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import re
import stat
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from typing import IO, Any

import numpy as np

from kvtrace.transforms import storage
from kvtrace.transforms.dead_letters import shown_name
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.timestamp_kinds import KIND_WORDS
from kvtrace.transforms.errors import IdMapError, JobStopped
from kvtrace.transforms.ids.anchor import advance_anchor, check_anchor, descends, rebind
from kvtrace.transforms.ids.dense_ids import NUMBERED
from kvtrace.transforms.ids.exclusive import create_exclusive, replace_file, temp_names
from kvtrace.transforms.ids.map_files import (
    create_mark,
    map_file_exists,
    mark_is_whole,
    open_map_file,
)
from kvtrace.transforms.ids.map_record import (
    FORMAT_VERSION,
    KEYLESS_FORMAT,
    KINDS,
    MAP_FORMAT,
    MAX_IDS,
    MAX_RECORD_BYTES,
    MAX_VERSION,
    MapKey,
    canonical,
    format_of,
    keyed,
    keyed_from_keyless,
    keyed_map_id,
    map_key,
    night_entry,
    origin_kind,
    read_keyless_record,
    read_record,
    refusal,
)
from kvtrace.transforms.ids.segments import (
    RowBounds,
    SegmentFile,
    check_listed,
    index_path,
    merge_segment,
    write_segment,
)
from kvtrace.transforms.read.timestamps import timestamp_kind
from kvtrace.transforms.trace_format import (
    MAX_TRACE_LINE_BYTES,
    NIGHT_ORIGIN,
    OUTPUT_LENGTH_FIELD,
    STATS,
    TIME_ORIGIN_FIELD,
    TIMESTAMP_FIELD,
    parse_json,
)

_LOG = logging.getLogger("kvtrace")
CURRENT = "CURRENT"
CURRENT_MAX_BYTES = 1024  # {"version": N}: anything longer is not kvtrace's
KEYED_STAGE = ".keyed"  # versions/000001.json.keyed: a format-3 record's keyed form, staged
COMMITTED_MARK = "COMMITTED"  # in a segment folder, once the version listing it is committed
# Each night adds a segment per kind, and reading a map opens every segment's files. Folding
# all segments into one every 32 nights bounds that to 32 x shards files, at the price of
# rewriting the map about once a month instead of every night.
MAX_SEGMENTS = 32
# Told a commit's version, its record's path and bytes before the record is created (publish).
Intending = Callable[[int, str, bytes], None]


@dataclass(frozen=True)
class MapIdentity:
    """What makes hashes comparable across runs: any difference would silently give new ids to
    old prefixes, so a map refuses a run that differs in any of these."""

    salt_fingerprint: str
    block_size: int
    tokenizer_sha256: dict[str, str]
    hash_scheme: str
    chat_template_kwargs: dict[str, Any]
    # Token ids of a probe text (tokenize.tokenization_fingerprint): the same tokenizer files can
    # tokenize differently under another tokenizers release. None in maps made before it was
    # recorded, which are then not compared on it.
    tokenization: str | None = None
    # The capture format a map of engine hash captures numbers (anonymize --capture), None for
    # text blocks: each is a space of its own (docs/ID_MAP.md, What a map's ids are over).
    engine_capture: str | None = None

    def recorded(self) -> dict[str, Any]:
        """The fields as a record holds them: engine_capture only in a capture map's, so a text
        map's record is the one kvtrace wrote before captures had maps."""
        fields = dict(self.__dict__)
        if self.engine_capture is None:
            del fields["engine_capture"]
        return fields

    def differences(self, other: MapIdentity) -> list[str]:
        """What differs, field by field, by type and value (1, 1.0 and true are three values);
        engine_capture aside, which open_map compares first (what the ids are over)."""
        names = {
            "salt_fingerprint": "salt",
            "block_size": "block size",
            "tokenizer_sha256": "tokenizer files (sha256)",
            "hash_scheme": "hash scheme",
            "chat_template_kwargs": "chat template kwargs",
            "tokenization": "tokenization of a probe text (tokenizers release?)",
        }
        return [
            f"{label}: map has {_shown(name, getattr(self, name))}, "
            f"this run has {_shown(name, getattr(other, name))}"
            for name, label in names.items()
            if canonical(getattr(self, name)) != canonical(getattr(other, name))
            and not (name == "tokenization" and self.tokenization is None)
        ]


def _shown(name: str, value: Any) -> str:
    if name == "tokenizer_sha256":
        return ", ".join(f"{f}={h[:12]}" for f, h in sorted(value.items())) or "none"
    return json.dumps(value, sort_keys=True)


@dataclass(frozen=True)
class MapVersion:
    version: int
    identity: MapIdentity
    timestamp_origin_ms: int | None  # None until a run with requests fixes it
    next_id: dict[str, int]
    files: dict[str, list[str]]  # per kind, paths relative to the map directory
    hash_shards: int  # every segment file is one of these shards (0 for an empty map)
    history: list[dict[str, Any]] = field(default_factory=list)
    # Per file relative to the map (segments and their indexes): {"sha256", "bytes"}.
    checksums: dict[str, dict] = field(default_factory=dict)
    # The map's id (anchor.py names its mark by it): None in a map from before ids, which its
    # next commit gives one; and the sha256 of the record before this one (None for version 1).
    map_id: str | None = None
    previous_sha256: str | None = None
    # The sha256 of this version's record as read (not recorded: the next one chains to it).
    record_sha256: str | None = field(default=None, compare=False)
    # What its nights published (map_record format 7): requests per day (named in decimal) and
    # the last published time, ms from the origin; empty and None before.
    published_days: dict[str, int] = field(default_factory=dict)
    published_to_ms: int | None = None

    @property
    def days(self) -> dict[int, int]:
        """Requests its nights published per day (ms // DAY_MS): what a night's clock resets
        are judged against, as a stream's are against its published windows."""
        return {int(day): count for day, count in self.published_days.items()}

    def segment_files(self, directory: str, kind: str) -> list[SegmentFile]:
        """The kind's segment files with what their reads verify: checksums, and that each row
        belongs to the file's hash shard and has an id this version gave out."""
        return [
            SegmentFile(
                storage.join(directory, name),
                self.checksums[name],
                self.checksums[relative_index(name)],
                bounds=RowBounds(shard_of_segment(name), self.hash_shards, self.next_id[kind]),
            )
            for name in sorted(self.files[kind])
        ]

    @property
    def timestamp_kind(self) -> str | None:
        """The kind of time (relative or epoch) of the origin, so of every night of the map."""
        return origin_kind(self.timestamp_origin_ms)

    def segments(self, kind: str) -> int:
        return len({path.split("/")[1] for path in self.files[kind]})

    def compaction_due(self) -> bool:
        """Whether the next run folds every segment into one (one more would exceed the cap)."""
        return any(self.segments(kind) + 1 > MAX_SEGMENTS for kind in KINDS)

    def record(self) -> dict[str, Any]:
        """The version's record as written, before its MAC (map_record.keyed)."""
        return {
            "format": MAP_FORMAT,
            "format_version": FORMAT_VERSION,
            "version": self.version,
            **self.identity.recorded(),
            "timestamp_origin_ms": self.timestamp_origin_ms,
            "timestamp_kind": self.timestamp_kind,
            "next_id": self.next_id,
            "files": self.files,
            "hash_shards": self.hash_shards,
            "history": self.history,
            "checksums": self.checksums,
            "map_id": self.map_id,
            "previous_sha256": self.previous_sha256,
            "published_days": self.published_days,
            "published_to_ms": self.published_to_ms,
        }

    @staticmethod
    def from_record(data: dict[str, Any], record_sha256: str | None = None) -> MapVersion:
        """A version from a record map_record.read_record verified and checked."""
        identity = MapIdentity(
            **{name: data[name] for name in MapIdentity.__dataclass_fields__ if name in data}
        )
        return MapVersion(
            data["version"],
            identity,
            data["timestamp_origin_ms"],
            data["next_id"],
            data["files"],
            data["hash_shards"],
            data["history"],
            data["checksums"],
            data.get("map_id"),
            data.get("previous_sha256"),
            record_sha256,
            data.get("published_days", {}),
            data.get("published_to_ms"),
        )


def version_bytes(version: MapVersion, key: MapKey) -> bytes:
    return keyed(version.record(), key)


def read_version_record(directory: str, number: int, key: MapKey) -> dict[str, Any]:
    """Version `number`'s record, verified (map_record.read_record); it must hold that version."""
    return _read_version(directory, number, key)[0]


def verified_newest(directory: str, key: MapKey) -> tuple[dict[str, Any], bytes] | None:
    """The published version's record, verified (_read_version), and its bytes as stored, once
    the whole history below it is found to be its own: each record names the sha256 of the one
    below it, down to version 1 (or to a record from before the chain), so the MAC of the
    newest binds every one (anchor.descends: one read and one sha256 per version, no MAC or
    field check each). A record of another map of the same salt put in a version's place
    verifies on its own; it breaks the chain here. None for a new map."""
    number = current_version_number(directory)
    return _verified_chain(directory, number, key) if number else None


def _verified_chain(directory: str, number: int, key: MapKey) -> tuple[dict[str, Any], bytes]:
    """Version `number`'s record, verified, and its bytes, once the versions below it are found
    to be its own (verified_newest)."""
    data, raw = _read_version(directory, number, key)
    record_of = record_reader(directory)
    if not descends(
        number,
        1,
        hashlib.sha256(record_of(1)).hexdigest(),
        lambda n: raw if n == number else record_of(n),
    ):
        for below in range(number - 1, 0, -1):  # a record damaged or edited is told as such
            _read_version(directory, below, key)
        raise IdMapError(
            f"the versions of the id map {directory} do not form one chain from version 1 to "
            f"{number} (a record names another sha256 than the one below it: another map's "
            f"version put in its place?), so the map's history cannot be trusted. Restore the "
            f"id map from a backup; nothing was read or written."
        )
    return data, raw


def recorded_history(directory: str, key: MapKey) -> list[dict[str, Any]]:
    """The night of every version, as the published version's record lists them (each record
    carries its whole history, so its MAC binds every night before it): what the gate confirms
    a night against. Versions below it put in place from another map change nothing here;
    the run's open path refuses them (verified_newest)."""
    record = published_record(directory, key)
    return record["history"] if record else []


def published_record(directory: str, key: MapKey) -> dict[str, Any] | None:
    """The published version's record, verified; None for a map with none."""
    number = current_version_number(directory)
    return read_version_record(directory, number, key) if number else None


def _read_version(directory: str, number: int, key: MapKey) -> tuple[dict[str, Any], bytes]:
    """Version `number`'s record, verified, and its bytes as stored."""
    path = version_path(directory, number)
    raw = _record_raw(path)
    data = read_record(
        raw, path, key, below_is_keyed=lambda: number > 1 and _is_keyed(directory, number - 1)
    )
    if data["version"] != number:
        raise IdMapError(
            f"{path} holds version {data['version']}, not {number} (a file put in "
            f"another's place?). Restore the id map from a backup."
        )
    return data, raw


def _record_raw(path: str) -> bytes:
    try:
        with open_map_file(path) as handle:
            return handle.read(MAX_RECORD_BYTES + 1)
    except (OSError, storage.UnfitFile) as err:
        raise IdMapError(f"{path}: unreadable id map metadata ({err})") from None


def _is_keyed(directory: str, number: int) -> bool:
    path = version_path(directory, number)
    return format_of(_record_raw(path), path) != KEYLESS_FORMAT


def key_format_3_map(directory: str, key: MapKey) -> list[int]:
    """Key a map built before keying (format 3), on purpose and once: only a map whose records
    are all format 3, as kvtrace wrote it, is keyed. Every record is verified by its own sha256
    and fields and its keyed form (the same content) staged beside it; then the staged forms
    are renamed over the records, newest first, so a format-3 record is never above a keyed
    one. Rerun after an interruption, it finishes: in a map partly keyed, each format-3 record
    must have its keyed form staged, byte for byte (a holder of the salt wrote it); any other
    is an edit (a forged record above a keyed map), refused. A keyed map is only verified.
    Returns the versions keyed. Whoever runs it vouches that the map is unaltered: until then
    its records carry only sha256s anyone can recompute."""
    number = current_version_number(directory)
    unkeyed = [n for n in range(1, number + 1) if _verified_is_keyless(directory, n, key)]
    forms = _keyed_forms(directory, unkeyed, key)
    if len(unkeyed) < number:  # partly keyed: only an interrupted keying is finished
        keyed_ones = sorted(set(range(1, number + 1)) - set(unkeyed))
        for n in unkeyed:
            if _staged_keyed_form(directory, n) != forms[n]:
                raise IdMapError(
                    f"{version_path(directory, n)} is of id map format {KEYLESS_FORMAT} in a "
                    f"map keyed already (version {keyed_ones[0]} is): kvtrace never leaves "
                    f"that, so the map was edited; nothing was keyed. Restore the id map from "
                    f"a backup."
                )
    else:
        for n in unkeyed:  # every record verified before any is replaced
            replace_file(_staged_path(directory, n), forms[n])
        # durable before a rename: a rerun finishes a partly keyed map from these alone
        storage.sync_folder(storage.join(directory, "versions"))
    for n in reversed(unkeyed):
        storage.rename(_staged_path(directory, n), version_path(directory, n))
    if unkeyed:
        storage.sync_folder(storage.join(directory, "versions"))
    return unkeyed


def _verified_is_keyless(directory: str, number: int, key: MapKey) -> bool:
    """Whether version `number` is of format 3, its record verified either way."""
    if _is_keyed(directory, number):
        read_version_record(directory, number, key)
        return False
    _keyless_data(directory, number, key)
    return True


def _keyless_data(directory: str, number: int, key: MapKey) -> dict[str, Any]:
    """A format-3 record's fields, verified, of this version of this salt's map."""
    path = version_path(directory, number)
    data = read_keyless_record(_record_raw(path), path)
    if data["version"] != number or data["salt_fingerprint"] != key.salt_fingerprint:
        raise IdMapError(
            f"{path} holds version {data['version']} of a map of salt "
            f"fingerprint {data['salt_fingerprint']}, not version {number} of "
            f"this salt's ({key.salt_fingerprint}); nothing was keyed."
        )
    return data


def _keyed_forms(directory: str, unkeyed: list[int], key: MapKey) -> dict[int, bytes]:
    """The keyed forms of the format-3 versions, each chained to the one before it. Keying
    renames newest first, so the format-3 versions are always 1..j: the first gives the id
    (format-3 versions that are not, an edit, get no id: their forms match nothing staged)."""
    forms: dict[int, bytes] = {}
    map_id = keyed_map_id(_keyless_data(directory, 1, key), key) if unkeyed[:1] == [1] else ""
    for n in unkeyed:
        forms[n] = keyed_from_keyless(
            _keyless_data(directory, n, key), key, map_id, forms.get(n - 1)
        )
    return forms


def _staged_path(directory: str, number: int) -> str:
    """Where keying stages a record's keyed form (not a version file: versions are *.json)."""
    return version_path(directory, number) + KEYED_STAGE


def _staged_keyed_form(directory: str, number: int) -> bytes | None:
    path = _staged_path(directory, number)
    return _record_raw(path) if storage.exists(path) else None


def upgrade_map(directory: str, key: MapKey, marks: str) -> tuple[int, list[int]]:
    """What `kvtrace id-map upgrade` does: check the map against its place and mark as a commit
    would, whatever format its newest record claims (a place bound to a keyed map takes only
    that map's continuation: a keyed map rolled back and rewritten as format 3 is another map
    there; a map built before keying has neither), key it if all its records are format 3 or
    finish an interrupted keying (key_format_3_map; a keyed map is only verified), then mark
    its published version. Returns that version and the versions keyed."""
    number = current_version_number(directory)
    if number == 0:
        raise IdMapError(
            f"{directory} holds no id map version (no {CURRENT}, no versions/): nothing to upgrade"
        )
    try:  # before anything is rewritten; refused as a run is refused before it starts
        check_anchor(
            marks,
            directory,
            number,
            _found_map_id(directory, number, key),
            record_reader(directory),
            key,
            anew=True,  # whoever upgrades vouches for the map: its first mark may be this one
        )
    except JobStopped as err:
        raise IdMapError(str(err)) from None
    keyed_now = key_format_3_map(directory, key)
    # The whole history verified as a night opens it (each record alone is not: another map's
    # version of the same salt verifies on its own); the bytes marked are the bytes verified.
    data, record = _verified_chain(directory, number, key)
    if data.get("map_id") is not None:  # a map from before ids gets one at its next commit
        advance_anchor(marks, directory, data["map_id"], number, record, key)
    return number, keyed_now


def rebind_map(directory: str, key: MapKey, marks: str) -> str | None:
    """What `kvtrace id-map rebind` does: bind the map's place to the map found there, after
    checking that map against its own mark (a rollback is refused here as at a commit), and
    mark its version: a map with no mark in this folder starts its marks here, on purpose.
    Returns the map's id (None: no map, or one from before ids or keying; the place is freed,
    and the map's next commit or upgrade binds it)."""
    number = current_version_number(directory)
    map_id = _found_map_id(directory, number, key) if number else None
    record = b""
    if map_id is not None:
        _, record = _verified_chain(directory, number, key)  # a map a night would open
        try:
            check_anchor(
                marks,
                directory,
                number,
                map_id,
                record_reader(directory),
                key,
                bound=False,
                anew=True,
            )
        except JobStopped as err:
            raise IdMapError(str(err)) from None
    rebind(marks, directory, map_id, key)
    if map_id is not None:
        advance_anchor(marks, directory, map_id, number, record, key)
    return map_id


def _found_map_id(directory: str, number: int, key: MapKey) -> str | None:
    """The id of the map whose newest version is `number`, its record verified: None for a map
    from before ids, or a format-3 one (of this salt: keyed later, it gets its id then)."""
    if _is_keyed(directory, number):
        return read_version_record(directory, number, key).get("map_id")
    _keyless_data(directory, number, key)
    return None


def record_reader(directory: str) -> Callable[[int], bytes]:
    """A version's record bytes as stored, by number: what the anchor's walk reads."""
    return lambda number: _record_raw(version_path(directory, number))


def relative_index(name: str) -> str:
    return index_path(name)


def empty_version(identity: MapIdentity) -> MapVersion:
    """Version 0: what a map directory that does not exist yet stands for (its id is given by
    its first commit, map_id_of)."""
    return MapVersion(
        0, identity, None, {kind: 0 for kind in KINDS}, {kind: [] for kind in KINDS}, hash_shards=0
    )


def map_id_of(base: MapVersion, night: Night, checksums: dict[str, dict]) -> str:
    """The id a map gets at its first commit (or, from before ids, its next): derived from its
    salt's fingerprint, the record it grows from, the night that makes it and the checksums of
    the segment files that version lists. Those files hold the night's keys, hashed under the
    salt, so maps of other keys get other ids even when their nights publish the same bytes
    (one request each of the same length: the same dense ids, lengths and times); only twins
    (the same night under the same salt) are one map. The same nights give the same id on
    every engine (determinism); only the salt's holder can write a record naming it (the MAC)."""
    seed = "\0".join(
        (
            base.identity.salt_fingerprint,
            base.record_sha256 or "",
            night.identity,
            canonical(checksums),
        )
    )
    return hashlib.sha256(b"kvtrace map id\0" + seed.encode()).hexdigest()[:32]


def version_path(directory: str, version: int) -> str:
    return storage.join(directory, "versions", f"{version:06d}.json")


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def segment_folder(version: int, run_id: str) -> str:
    return f"{version:06d}-{run_id}"


def run_folder(directory: str, version: int, run_id: str) -> str:
    """The folder a run writes its new segment files in, before its commit settles them."""
    return storage.join(directory, "segments", segment_folder(version, run_id))


def segment_path(directory: str, version: int, run_id: str, kind: str, shard: int) -> str:
    return storage.join(run_folder(directory, version, run_id), f"{kind}-{shard:05d}.parquet")


def settle_segments(
    directory: str, version: int, written: dict[str, list[SegmentFile]]
) -> dict[str, list[SegmentFile]]:
    """The run's new segment files moved from its own folder to the one their content names
    (the digest of every file's name and checksums), so a version's record is the same whatever
    run wrote it. Two runs of one content write the same bytes there (a rename over equal
    bytes); of other contents, other folders. A run killed midway leaves files no version lists,
    which cleanup deletes (discard_abandoned)."""
    files = sorted((f for kind in KINDS for f in written[kind]), key=lambda f: f.path)
    if not files:
        return written
    content = canonical([[f.path.rsplit("/", 1)[1], f.data, f.index] for f in files])
    folder = storage.join(
        directory,
        "segments",
        segment_folder(
            version, hashlib.sha256(b"kvtrace segment folder\0" + content.encode()).hexdigest()[:12]
        ),
    )
    storage.make_folder(folder, private=True)
    staged = {f.path.rsplit("/", 1)[0] for f in files} - {folder}
    for segment in files:
        for source in (segment.path, index_path(segment.path)):
            storage.rename(source, storage.join(folder, source.rsplit("/", 1)[1]))
    for emptied in staged:
        storage.remove_folder(emptied)
    return {
        kind: [
            f._replace(path=storage.join(folder, f.path.rsplit("/", 1)[1])) for f in written[kind]
        ]
        for kind in KINDS
    }


@contextmanager
def run_segments(directory: str, version: int, run_id: str) -> Iterator[None]:
    """Own the run's segment folder (write_segment_shard writes there, named by its run id: no
    version lists it, no other run writes there) from before its first file is written until
    the run ends, and remove it on every exit: whatever was written of it, whichever step fails
    or is stopped. A commit has emptied it (settle_segments moves its files to the folder their
    content names), so a published night loses nothing; a hard end (a stop's deadline) removes
    a local map's too (storage.remove_on_exit). Cleanup would never reach it otherwise: it
    targets a version the map does not reach (discard_abandoned). The map's folders this run
    made (a new map's) go too when they are left empty: the run committed nothing there."""
    segments = storage.join(directory, "segments")
    folder = run_folder(directory, version, run_id)
    # Innermost first; an object store has no empty folders to leave.
    made = (
        []
        if storage.is_url(directory)
        else [f for f in (segments, directory) if not os.path.lexists(f)]
    )
    storage.remove_on_exit(folder)
    try:
        yield
    finally:
        storage.remove_folder(folder)
        storage.forget_on_exit(folder)
        for made_here in made:
            storage.remove_empty_folder(made_here)


def shard_of_segment(path: str) -> int:
    """The hash shard a segment file holds, from its name (blocks-00012.parquet: 12)."""
    return int(path.rsplit("-", 1)[1].removesuffix(".parquet"))


def segment_files_by_shard(segments: list[SegmentFile]) -> dict[int, list[SegmentFile]]:
    """A version's segment files grouped by the hash shard each holds, in path order."""
    by_shard: dict[int, list[SegmentFile]] = {}
    for segment in sorted(segments):
        by_shard.setdefault(shard_of_segment(segment.path), []).append(segment)
    return by_shard


def write_segment_shard(
    directory: str,
    version: int,
    run_id: str,
    kind: str,
    shard: int,
    runs: list[SegmentFile],
    added: list[np.ndarray],
) -> SegmentFile:
    """One hash shard of the night's new segment: its newly numbered rows, merged on a folding
    night with the shard's earlier files, streamed (segments.merge_segment gives the bytes
    segments.write_segment gives for all the rows at once)."""
    path = segment_path(map_folder(directory), version, run_id, kind, shard)
    if not runs:
        return write_segment(path, added)
    return merge_segment(
        path, sorted(runs), np.concatenate(added) if added else np.empty(0, NUMBERED)
    )


def map_folder(directory: str) -> str:
    """The map's folder, made owner-only (and marked kvtrace's) by the run's first write into
    it, not when the map is opened: a run refused before then leaves nothing. Returns it."""
    storage.make_folder(directory, private=True)
    return directory


def relative(directory: str, path: str) -> str:
    return path[len(directory.rstrip("/")) + 1 :]


def _read_json(path: str) -> Any:
    with open_map_file(path) as handle:
        return parse_json(handle.read(CURRENT_MAX_BYTES))


def _json_bytes(payload: dict[str, Any]) -> bytes:
    return (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode()


def current_version_number(directory: str) -> int:
    """The published version: the highest committed one (CURRENT, moved after each commit, is
    only a hint: a run stopped between the two has still published); 0 for a new map. A map
    missing versions it once had is refused: numbering again from an older version would give
    new keys ids that published traces already use. A name in versions/ is read as a number
    only once it is one kvtrace writes (six digits, at most MAX_VERSION), so nothing is sized
    by a number found on disk before it is bounded."""
    committed = _committed_versions(directory)
    number = committed[-1] if committed else 0
    lost = _missing_versions(committed)
    pointer = storage.join(directory, CURRENT)
    hinted = _current_hint(pointer)
    if hinted is not None and hinted > number:
        lost.append(hinted)
    beyond = [
        folder
        for folder in _committed_segment_folders(directory)
        if _folder_version(directory, folder) > number
    ]
    if lost or beyond:
        missing = [relative(directory, version_path(directory, v)) for v in sorted(set(lost))]
        raise IdMapError(
            f"the id map {directory} has lost committed versions "
            f"({', '.join(missing or [f'the versions of segments/{beyond[0]}'])} missing): its "
            f"ids cannot be continued safely. Restore versions/ and CURRENT from a backup; "
            f"nothing was read or written."
        )
    return number


# The name of a version's record: six digits (version_path), 000001 to MAX_VERSION.
VERSION_NAME = re.compile(r"(?!000000)[0-9]{6}\.json")
# The files kvtrace writes through a temp file (exclusive.temp_name), as regular expressions:
# CURRENT in the map's folder; in versions/ a record and a record's keyed form staged.
CURRENT_FILE = re.escape(CURRENT)
VERSION_FILES = rf"{VERSION_NAME.pattern}(?:{re.escape(KEYED_STAGE)})?"
# All a map's folder ever holds.
_MAP_ENTRY = re.compile(rf"versions|segments|{CURRENT_FILE}|{temp_names(CURRENT_FILE)}")
FOREIGN_NAMED = 3  # entries a refusal of a folder that is no map names
LOST_NAMED = 3  # missing versions a refusal names: the first few tell the operator enough


def _committed_versions(directory: str) -> list[int]:
    """The versions whose records are in versions/, sorted; a *.json there that is not a name
    kvtrace writes (versions/999999999999.json) is refused before it is read as a number."""
    names = _names(directory, "versions", "*.json")
    stray = next((name for name in names if not VERSION_NAME.fullmatch(name)), None)
    if stray is not None:
        raise IdMapError(
            f"the id map {directory} holds versions/{shown_name(stray[:80])}, which is no version kvtrace "
            f"writes (000001.json to {MAX_VERSION}.json): the map was edited. Restore "
            f"versions/ from a backup; nothing was read or written."
        )
    return sorted(int(name.removesuffix(".json")) for name in names)


# A segment folder's name: the version it was written for, then the run or content naming it.
SEGMENT_FOLDER_NAME = re.compile(r"([0-9]{6})-[^/]+")


def _folder_version(directory: str, folder: str) -> int:
    """The version a segment folder was written for, from its name (segment_folder); a folder
    kvtrace does not name so is refused in one line, never parsed as a number."""
    named = SEGMENT_FOLDER_NAME.fullmatch(folder)
    if named is None:
        raise IdMapError(
            f"the id map {directory} holds segments/{shown_name(folder[:80])}, which is no segment folder "
            f"kvtrace writes (VERSION-NAME): the map was edited. Restore segments/ from a "
            f"backup; nothing was read or written."
        )
    return int(named.group(1))


def _missing_versions(committed: list[int]) -> list[int]:
    """The first few versions below the highest that have no record (committed: distinct,
    sorted), found in the gaps: nothing sized by the highest number."""
    missing: list[int] = []
    for below, above in zip([0, *committed], committed):
        missing += range(below + 1, min(above, below + 1 + LOST_NAMED - len(missing)))
        if len(missing) >= LOST_NAMED:
            break
    return missing


def _names(directory: str, folder: str, pattern: str) -> list[str]:
    """The files of the map's folder whose names match pattern, a glob of kvtrace's own names
    one level per `/` (`*/COMMITTED`: a/COMMITTED), relative to the folder. The map's path is
    taken as spelled (storage.files_in), never as a pattern: a map may be named m[1]. Locally
    no link is followed (_local_names): what is listed is what is deleted."""
    levels = pattern.split("/")
    top = storage.join(directory, folder)
    if not storage.is_url(top):
        return _local_names(directory, folder, levels)
    return [
        name
        for name in storage.files_in(top, nested=len(levels) > 1)
        if len(name.split("/")) == len(levels)
        and all(map(fnmatch.fnmatchcase, name.split("/"), levels))
    ]


def _local_names(directory: str, folder: str, levels: list[str]) -> list[str]:
    """_names of a local map, each entry looked at without following it (lstat): the folder and
    every entry a level before the last names must be a real folder, every entry the last names
    a regular file, as kvtrace writes them; anything else (a link, a FIFO) is the map damaged,
    refused in one line, so no walk reaches, and no delete touches, anything outside the map."""
    top = os.path.join(directory, folder)
    try:
        if not stat.S_ISDIR(os.lstat(top).st_mode):
            raise _unfit_entry(directory, folder, "a folder")
    except FileNotFoundError:
        return []
    names = [""]
    for depth, level in enumerate(levels):
        wanted = "a regular file" if depth == len(levels) - 1 else "a folder"
        found = []
        for prefix in names:
            try:
                with os.scandir(os.path.join(top, prefix)) as entries:
                    listed = [e for e in entries if fnmatch.fnmatchcase(e.name, level)]
            except FileNotFoundError:  # a live run's folder, removed meanwhile
                continue
            for entry in listed:
                name = f"{prefix}/{entry.name}" if prefix else entry.name
                fits = entry.is_file if wanted == "a regular file" else entry.is_dir
                if entry.is_symlink() or not fits(follow_symlinks=False):
                    raise _unfit_entry(directory, f"{folder}/{name}", wanted)
                found.append(name)
        names = found
    return sorted(names)


def _unfit_entry(directory: str, name: str, wanted: str) -> IdMapError:
    return IdMapError(
        f"the id map {directory} is damaged: {shown_name(name[:120])} is not {wanted} (a link, FIFO or "
        f"other thing kvtrace never writes there). Restore the id map from a backup; nothing "
        f"was read or written."
    )


def check_listed_files(
    directory: str, version: MapVersion, folders: set[str] | None = None
) -> None:
    """Refuse a local map missing what its version lists: every segment folder (of `folders`,
    None: all) a real folder, every file listed there a regular file of its recorded size (one
    lstat each, no link followed). A night reads only the shards its keys fall in, so damage
    elsewhere would otherwise be carried into the next version (a file damaged in place, its
    size kept: check_carried_files, before the commit). An object store's files are checked
    as they are read (segments.SegmentFile) and by check_carried_files."""
    if storage.is_url(directory) or version.version == 0:
        return
    listed = sorted(
        n
        for kind in KINDS
        for name in version.files[kind]
        if folders is None or name.split("/")[1] in folders
        for n in (name, relative_index(name))
    )
    folders_listed = sorted({"/".join(n.split("/")[:2]) for n in listed})
    for folder in (["segments"] if listed else []) + folders_listed:
        _check_entry(directory, folder, version, stat.S_ISDIR, "a folder")
    for name in listed:
        size = _check_entry(directory, name, version, stat.S_ISREG, "a regular file")
        if size != version.checksums[name]["bytes"]:
            raise _damaged_listing(
                directory,
                name,
                version,
                f"{size} bytes, not the {version.checksums[name]['bytes']} recorded",
            )


def _check_entry(
    directory: str, name: str, version: MapVersion, fits: Callable[[int], bool], wanted: str
) -> int:
    """The size of what is at name, once it is found to be what fits says (lstat)."""
    try:
        status = os.lstat(os.path.join(directory, name))
    except FileNotFoundError:
        raise _damaged_listing(directory, name, version, "missing") from None
    except OSError as err:
        raise _damaged_listing(directory, name, version, f"unreadable ({err})") from None
    if stat.S_ISLNK(status.st_mode) or not fits(status.st_mode):
        raise _damaged_listing(directory, name, version, f"not {wanted} (a link?)")
    return status.st_size


def _damaged_listing(directory: str, name: str, version: MapVersion, what: str) -> IdMapError:
    return IdMapError(
        f"the id map {directory} is damaged: {name}, which its version {version.version} "
        f"lists, is {what}; the map is not extended over it. Restore the id map from a "
        f"backup; nothing was read or written."
    )


def _current_hint(pointer: str) -> int | None:
    """The version CURRENT names; None when it is absent or its bytes name none (it is only a
    hint). Anything but a regular file in its place (a FIFO, whose open would wait forever) is
    refused: kvtrace writes none."""
    if not map_file_exists(pointer):
        return None
    try:
        hinted = _read_json(pointer)["version"]
    except storage.UnfitFile as err:
        raise IdMapError(
            f"the id map's {CURRENT} is not a file kvtrace wrote ({err}). Remove it (it is "
            f"only a hint, rewritten by the next commit) or restore it from a backup; nothing "
            f"was read or written."
        ) from None
    except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError):
        return None
    return hinted if type(hinted) is int else None


def _committed_segment_folders(directory: str) -> list[str]:
    """Segment folders whose version was committed (marked after the commit: a killed run's
    folder has no mark, a published one's does)."""
    return sorted(
        name.split("/")[0] for name in _names(directory, "segments", f"*/{COMMITTED_MARK}")
    )


def ids_over(capture: str | None) -> str:
    """What a map's ids number (MapIdentity.engine_capture), in words."""
    return "blocks of text" if capture is None else f"engine hashes of --capture {capture}"


def open_map(directory: str, identity: MapIdentity, key: MapKey) -> MapVersion:
    """The map's published version, verified with the run's key and checked against its
    settings; a new map if there is none."""
    try:
        canonical(identity.__dict__)
    except ValueError as err:  # NaN in --chat-template-kwargs: found now, not at the commit
        raise IdMapError(f"an id map cannot record this run's settings: {err}") from None
    check_map_folder(directory)
    newest = verified_newest(directory, key)
    if newest is None:
        return empty_version(identity)
    data, raw = newest
    version = MapVersion.from_record(data, hashlib.sha256(raw).hexdigest())
    if version.identity.engine_capture != identity.engine_capture:
        raise IdMapError(
            f"the id map {directory} numbers {ids_over(version.identity.engine_capture)}, this "
            f"run reads {ids_over(identity.engine_capture)}: their ids are of other spaces, "
            f"never one prefix's; refusing to use it. Give each its own map (docs/ID_MAP.md: "
            f"what a map's ids are over)."
        )
    differences = version.identity.differences(identity)
    if differences:
        raise IdMapError(
            f"the id map {directory} was built with other settings, so its ids would not carry "
            f"over; refusing to use it. "
            + "; ".join(differences)
            + ". Use the map's settings, or start a new map in another directory."
        )
    if version.identity.tokenization is None:  # a map from before it was recorded adopts it
        version = replace(
            version, identity=replace(version.identity, tokenization=identity.tokenization)
        )
    return version


def check_map_folder(directory: str) -> None:
    """A local folder given as a map must be new, empty or a map: one holding anything a map
    never holds is someone else's, refused in one line before anything is read or written there
    (a run opening a map repairs it). Object stores hold no temp files to clear."""
    if storage.is_url(directory) or not os.path.isdir(directory):
        return
    foreign = sorted(name for name in os.listdir(directory) if not _MAP_ENTRY.fullmatch(name))
    if foreign:
        named = ", ".join(shown_name(name[:80]) for name in foreign[:FOREIGN_NAMED])
        raise IdMapError(
            f"--id-map {directory} holds files kvtrace did not write ({named}"
            f"{', ...' if len(foreign) > FOREIGN_NAMED else ''}): it is not an id map, which "
            f"holds only {CURRENT}, versions/ and segments/. Give a new or empty folder, or the "
            f"map's own; nothing was read or written."
        )


def discard_abandoned(directory: str, current: MapVersion, key: MapKey) -> list[str]:
    """Delete segments no published version can ever use: those of runs that targeted a version
    already decided (<= current) and lost, or were killed. Segments of later versions may be a
    live run's and stay; so does everything a published version lists (each version's record
    verified before it decides anything). Such a run's local folder goes too once empty (a run
    killed before its first file leaves one with none). Returns what went."""
    listed: dict[int, set[str]] = {}

    def abandoned(folder: str) -> bool:  # folder: 000004-RUNID
        version = _folder_version(directory, folder)
        if version > current.version:
            return False
        if version not in listed:
            listed[version] = _segment_folders(directory, version, current, key)
        return folder not in listed[version]

    files = [
        storage.join(directory, "segments", name)
        for name in _names(directory, "segments", "*/*")
        if abandoned(name.split("/")[0])
    ]
    for path in files:
        # Every run clears the same leftovers (at its commit, as it opens the map): one another
        # run deleted after this one listed it is gone, as wanted. An object store's delete of
        # an absent object succeeds already.
        with suppress(FileNotFoundError):
            storage.delete([path])
    return sorted(files + _remove_empty(storage.join(directory, "segments"), abandoned))


def _remove_empty(segments: str, abandoned: Callable[[str], bool]) -> list[str]:
    """The empty segment folders abandoned() names, removed (a file written into one meanwhile
    keeps it); object stores have no empty folders. Returns those that went."""
    return [
        storage.join(segments, name)
        for name in storage.empty_folders_in(segments)
        if SEGMENT_FOLDER_NAME.fullmatch(name)
        and abandoned(name)
        and storage.remove_empty_folder(storage.join(segments, name))
    ]


def _segment_folders(directory: str, version: int, current: MapVersion, key: MapKey) -> set[str]:
    """The segment folders version `version` lists (none for version 0)."""
    if version == 0:
        return set()
    files = (
        current.files
        if version == current.version
        else read_version_record(directory, version, key)["files"]
    )
    return {path.split("/")[1] for kind_files in files.values() for path in kind_files}


@dataclass(frozen=True)
class Night:
    """The night a version records: where its manifest says its numbering began (its id_map:
    block_ids_from, sessions_from, time_from_ms) and its identity (NightRows); former, the
    identity maps recorded before (files_identity), by which a rerun of a night they recorded
    is still found."""

    start: dict[str, int]
    identity: str
    former: str | None = None

    def identities(self) -> tuple[str, ...]:
        return (self.identity,) if self.former is None else (self.identity, self.former)


@dataclass(frozen=True)
class NightTimes:
    """When a night's rows publish: its requests per day (ms // DAY_MS) and its last published
    time (ms from the map's origin; None without a request)."""

    days: dict[int, int] = field(default_factory=dict)
    last_ms: int | None = None


# A trace row as kvtrace writes it begins with its timestamp (trace_format.jsonl_bytes).
_ROW_TIME = re.compile(rb'\{"' + TIMESTAMP_FIELD.encode() + rb'": (0|[1-9][0-9]{0,18}),')
_READ_BYTES = 1 << 20


class NightRows:
    """What a night is, however its times are published (night_identity): the sha256 of the
    canonical JSON of its rows' digest (the sha256 of its JSONL trace shards, in name order,
    every timestamp on the map's clock: a --time-origin night's moved back by its
    id_map.time_from_ms) and stats.json's. It binds every row and its time on the map's clock,
    never a presentation flag; the same for a rerun that finds the night in the map (same rows,
    same ids). Fed each shard once, as the caller reads it: anonymize the folder's shards as
    written, the gate (audit --id-map) the bytes it read of the folder's own, never a name a
    manifest lists."""

    def __init__(self, manifest: dict[str, Any]) -> None:
        own_clock = manifest.get(TIME_ORIGIN_FIELD) == NIGHT_ORIGIN
        self._shift = manifest["id_map"]["time_from_ms"] if own_clock else 0
        self._stats = manifest["sha256"].get(STATS)
        self._rows = hashlib.sha256()

    def add(self, shard: IO[bytes]) -> None:
        """The next shard's bytes, read to their end."""
        if not self._shift:  # every row as written: the pieces are the bytes themselves
            while chunk := shard.read(_READ_BYTES):
                self._rows.update(chunk)
            return
        for piece, starts_row in _pieces(shard):
            self._rows.update(_on_map_clock(piece, self._shift) if starts_row else piece)

    def identity(self) -> str:
        digests = {"rows_on_map_clock": self._rows.hexdigest(), STATS: self._stats}
        return hashlib.sha256(canonical(digests).encode()).hexdigest()


def night_identity(manifest: dict[str, Any], folder: str) -> str:
    """The identity (NightRows) of the night anonymize wrote in folder, read from its shards as
    written (before the map's commit, in every engine)."""
    night = NightRows(manifest)
    for name in sorted(n for n in manifest["files"] if n.endswith(".jsonl")):
        with open_map_file(storage.join(folder, name)) as handle:  # a regular file only
            night.add(handle)
    return night.identity()


def files_identity(manifest: dict[str, Any]) -> str:
    """A night's identity as id maps recorded it before night_identity (the sha256 of its files'
    digests, as its manifest lists them): a presentation's, still matched so that a rerun of a
    night recorded then is found."""
    return hashlib.sha256(canonical(manifest["sha256"]).encode()).hexdigest()


def _pieces(handle: Any) -> Iterator[tuple[bytes, bool]]:
    """A file's bytes as lines (each with its newline), held in bounded pieces: a line over
    MAX_TRACE_LINE_BYTES is given in pieces, only the first said to start a row."""
    pending, starts_row = b"", True
    while chunk := handle.read(_READ_BYTES):
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            yield line + b"\n", starts_row
            starts_row = True
        if len(pending) > MAX_TRACE_LINE_BYTES:
            yield pending, starts_row
            pending, starts_row = b"", False
    if pending:
        yield pending, starts_row


def _on_map_clock(line: bytes, shift: int) -> bytes:
    """A row with its timestamp moved by shift ms (a line not kvtrace's is left as it is: its
    identity is then no night's)."""
    found = _ROW_TIME.match(line)
    if not shift or found is None:
        return line
    return line[: found.start(1)] + str(int(found[1]) + shift).encode() + line[found.end(1) :]


def recorded_start(version: MapVersion, *identities: str) -> dict[str, int] | None:
    """The start a version of the map recorded for the night of these identities (its own and
    its former: Night.identities; the first, if a compacting rerun recorded it again); None for
    a night the map has not recorded. A rerun publishes it, so its manifest is the original's
    byte for byte."""
    return next(
        (entry["start"] for entry in version.history if entry.get("night") in identities), None
    )


def _brings_nothing(
    base: MapVersion, added: dict[str, int], compacted: bool, earliest_ms: int | None, night: Night
) -> bool:
    """A night with nothing the map lacks (next_version): no new id, no compaction, and a night
    the map records already (a rerun) or no request at all."""
    return (
        not any(added.values())
        and not compacted
        and (earliest_ms is None or recorded_start(base, *night.identities()) is not None)
    )


def next_version(
    directory: str,
    base: MapVersion,
    written: dict[str, list[SegmentFile]],
    added: dict[str, int],
    compacted: bool,
    hash_shards: int,
    earliest_ms: int | None,
    night: Night,
    times: NightTimes = NightTimes(),
) -> MapVersion | None:
    """The version a run publishes, or None when it brings nothing the map lacks: no new id, no
    compaction, and a night the map records already (a rerun) or no request at all. A night of
    known ids only is still recorded, so the gate can confirm where it began. A compacting
    run's segments replace the map's; the others' add to them."""
    if _brings_nothing(base, added, compacted, earliest_ms, night):
        return None
    if (night.start["block_ids_from"], night.start["sessions_from"]) != (
        base.next_id["blocks"],
        base.next_id["sessions"],
    ):
        raise JobStopped(
            f"the night's id_map {night.start} does not begin where the id map "
            f"{directory} stands ({base.next_id}); nothing was published."
        )
    number = base.version + 1
    names = {kind: [relative(directory, f.path) for f in written[kind]] for kind in KINDS}
    files = {
        kind: sorted(names[kind] if compacted else base.files[kind] + names[kind]) for kind in KINDS
    }
    sums = dict(base.checksums)
    for segment in (f for kind in KINDS for f in written[kind]):
        name = relative(directory, segment.path)
        sums[name], sums[relative_index(name)] = segment.data, segment.index
    listed = {n for kind in KINDS for name in files[kind] for n in (name, relative_index(name))}
    next_id = {kind: base.next_id[kind] + added[kind] for kind in KINDS}
    if any(n > MAX_IDS for n in next_id.values()):
        raise JobStopped(
            f"the id map {directory} would pass {MAX_IDS} ids of a kind ({next_id}); "
            f"nothing was published. Start a new map in another directory."
        )
    origin = base.timestamp_origin_ms if base.timestamp_origin_ms is not None else earliest_ms
    checksums = {name: sums[name] for name in sorted(listed)}
    if recorded_start(base, *night.identities()) is not None:  # a compacting rerun: counted once
        times = NightTimes()
    return replace(
        base,
        version=number,
        map_id=base.map_id or map_id_of(base, night, checksums),
        previous_sha256=base.record_sha256,
        record_sha256=None,
        timestamp_origin_ms=origin,
        next_id=next_id,
        files=files,
        hash_shards=hash_shards,
        history=base.history + [night_entry(number, added, compacted, night.start, night.identity)],
        checksums=checksums,
        published_days=_days_added(base.published_days, times.days),
        published_to_ms=max(
            (t for t in (base.published_to_ms, times.last_ms) if t is not None), default=None
        ),
    )


def _days_added(recorded: dict[str, int], night: dict[int, int]) -> dict[str, int]:
    days = dict(recorded)
    for day, count in night.items():
        days[str(day)] = days.get(str(day), 0) + count
    return days


def check_night_follows(
    directory: str, base: MapVersion, night: Night, granularity: dict[str, int] | None = None
) -> None:
    """Refuse a new night that begins at or before the last time the map's nights published
    (a cut inside a timestamp granule, or a log the map has passed): one run would sort its
    rows among theirs, nights cannot, so nothing may publish it. A rerun of a recorded night
    is that night, and passes; a night that begins where a recorded one began but is not it
    (other rows) is told so: most likely a rerun with other flags. granularity: the night's
    manifest's, whose timestamp granule the refusal names with where it came from."""
    last = base.published_to_ms
    if last is None or night.start["time_from_ms"] > last:
        return
    begun = night.start["time_from_ms"]
    twin = next((e for e in base.history if e.get("start", {}).get("time_from_ms") == begun), None)
    if twin is not None:
        raise JobStopped(
            f"this night begins at {begun} ms, as the night the id map {directory} recorded "
            f"in version {twin['version']} did, but its rows are not that night's: a night's "
            f"identity covers every published byte of its rows, parent_row too, so a rerun "
            f"with --emit-parents given the other way (or other flags or inputs) is another "
            f"night, over the map's. Rerun it as it ran; nothing was published."
        )
    raise JobStopped(
        f"this night's first row would publish at {night.start['time_from_ms']} ms, at or before "
        f"{last} ms, the last time the id map {directory}'s nights published: its rows would not "
        f"follow theirs as in one run over both. Cut nights on published times"
        f"{_granule_said(granularity or {})}: give this night only requests that publish "
        f"after {last} ms; nothing was published."
    )


def _granule_said(granularity: dict[str, int]) -> str:
    """The night's timestamp granule and where it came from: --length-granularity N alone sets
    one (its floor, coarsen.timestamp_floor), as --timestamp-granularity-ms does."""
    step, lengths = granularity.get("timestamp_ms", 1), granularity.get(OUTPUT_LENGTH_FIELD, 1)
    if step <= 1:
        return " (granules)"
    source = "--timestamp-granularity-ms"
    if lengths > 1:
        source += f", or without it the floor --length-granularity {lengths} sets"
    return f" (granules of {step} ms: {source})"


def check_night_kind(directory: str, base: MapVersion, earliest_ms: int | None) -> None:
    """Refuse a night whose timestamps are of another kind than the map's origin (relative
    offsets against epoch dates, or the reverse): its published times, counted from that
    origin, would be wall-clock dates (or negative). The night's own minority kind is dead
    lettered already (encode/timestamp_kinds.py): what remains is its bulk, one kind."""
    night = set() if earliest_ms is None else {timestamp_kind(earliest_ms)}
    if base.timestamp_kind is not None and night - {base.timestamp_kind}:
        other = (night - {base.timestamp_kind}).pop()
        raise JobStopped(
            f"this night's timestamps are {KIND_WORDS[other][1]}, but the id map {directory} "
            f"began on {KIND_WORDS[base.timestamp_kind][1]} (its origin "
            f"{base.timestamp_origin_ms} ms): counted from that origin they would not be times "
            f"since the map's first request (epoch dates would publish the wall clock). "
            f"Anonymize them with a map of their own kind; the map was not "
            f"extended and no trace was published"
        )


def publish(
    directory: str,
    base: MapVersion,
    new: MapVersion,
    key: MapKey,
    committed: list[int] | None = None,
    intending: Intending = lambda version, path, data: None,
) -> bytes:
    """Commit the new version by creating its metadata, keyed, exclusively (its segments are
    durable already: storage.create syncs each file), then mark its segment folders committed
    and move CURRENT to it. Returns the record's bytes. committed: given the version the moment
    this run's record is created, so what stands is known to be this run's, never inferred from
    the map (another run may have committed in its place). intending: told the version, its
    record's path and bytes before the record is created, so a process that outlives this one
    knows the commit by what the path holds, whatever point this one dies at."""
    metadata = version_bytes(new, key)
    # No commit writes a record its own reader refuses (checksums a night's record carried in,
    # say): whatever made it, the version is the reader's before it exists.
    why = refusal(metadata, key)
    if why is not None:
        raise JobStopped(
            f"version {new.version} of the id map {directory}, as this run would write it, is "
            f"not one kvtrace reads ({why}): it was not committed, the map was not extended "
            f"and no trace was published"
        )
    folders = _new_folders(map_folder(directory), base, new)
    for folder in folders:
        storage.sync_folder(folder)
    if folders:  # the new folders' own entries
        storage.sync_folder(storage.join(directory, "segments"))
    record = committed if committed is not None else []
    if current_version_number(directory) != base.version:
        raise _extended(directory, base)
    path = version_path(directory, new.version)
    intending(new.version, path, metadata)
    if not create_exclusive(path, metadata, lambda: record.append(new.version)):
        raise _extended(directory, base)
    for folder in _new_folders(directory, base, new):
        _mark_committed(folder)
    _switch_current(directory, new.version)
    return metadata


def check_carried_files(directory: str, base: MapVersion, compacted: bool) -> None:
    """Refuse a commit that would list again a file of the base version damaged in place: a
    night reads only the shards its keys fall in, so each file the new version carries over
    (every file of the base, unless the night compacts: it rewrites them all) is checked here
    by its index's sha256 and its footer's digest (segments.check_listed, small reads:
    docs/ID_MAP.md has the cost). Its row groups are verified when read; one damaged with its
    footer intact is the window docs/BOUNDS.md accepts."""
    if compacted:
        return
    for kind in KINDS:
        for segment in base.segment_files(directory, kind):
            check_listed(segment)


def check_not_extended(directory: str, base: MapVersion) -> None:
    """Refuse a commit on a map another run extended since this one read it."""
    if current_version_number(directory) > base.version:
        raise _extended(directory, base)


def _extended(directory: str, base: MapVersion) -> JobStopped:
    return JobStopped(
        f"the id map {directory} was extended by another run while this one ran (it started "
        f"from version {base.version}); this run's ids may clash with it, so it published "
        f"nothing (its trace has no manifest). Run the night again, one run per map at a time."
    )


def finish_interrupted_commit(directory: str, current: MapVersion) -> None:
    """Roll forward what a run killed after its commit left undone: the committed marks of the
    published version's segment folders, and CURRENT. A folder is marked only once it is found
    to hold what the version lists (check_listed_files): a folder gone is damage, never made
    again."""
    if current.version == 0:
        return
    marked = set(_committed_segment_folders(directory))
    listed = {n.split("/")[1] for kind in KINDS for n in current.files[kind]}
    unmarked = listed - marked
    check_listed_files(directory, current, unmarked)
    # A mark killed before its fsync is made whole: the map's bytes are an uninterrupted run's.
    torn = {name for name in listed & marked if not _mark_whole(directory, name)}
    for name in sorted(unmarked | torn):
        _mark_committed(storage.join(directory, "segments", name))
    if _current_hint(storage.join(directory, CURRENT)) != current.version:
        _switch_current(directory, current.version)


def _mark_committed(folder: str) -> None:
    """Mark a segment folder committed, never through what is in the mark's place
    (map_files.create_mark): a link or FIFO there is the map damaged, refused in one line."""
    try:
        create_mark(storage.join(folder, COMMITTED_MARK))
    except storage.UnfitFile as err:
        raise IdMapError(
            f"the id map is damaged: {err}. Restore the id map from a backup."
        ) from None


def _mark_whole(directory: str, folder: str) -> bool:
    path = storage.join(directory, "segments", folder, COMMITTED_MARK)
    try:
        return mark_is_whole(path)
    except (OSError, storage.UnfitFile) as err:
        raise IdMapError(
            f"the id map is damaged: {err}. Restore the id map from a backup."
        ) from None


def _new_folders(directory: str, base: MapVersion, new: MapVersion) -> list[str]:
    listed = {name.split("/")[1] for kind in KINDS for name in base.files[kind]}
    return sorted(
        {
            storage.join(directory, "segments", name.split("/")[1])
            for kind in KINDS
            for name in new.files[kind]
            if name.split("/")[1] not in listed
        }
    )


def _switch_current(directory: str, version: int) -> None:
    replace_file(storage.join(directory, CURRENT), _json_bytes({"version": version}))
    storage.sync_folder(directory)


def publish_night(
    manifest: dict[str, Any],
    directory: str,
    base: MapVersion,
    salt: SaltSource,
    marks: str,
    compacted: bool,
    hash_shards: int,
    block_files: list[SegmentFile],
    session_files: list[SegmentFile],
    added_blocks: int,
    added_sessions: int,
    earliest_ms: int | None,
    folder: str,
    times: NightTimes = NightTimes(),
    committed: list[int] | None = None,
    intending: Intending = lambda version, path, data: None,
) -> tuple[dict[str, Any], int | None]:
    """The last step of a run: publish what it added, keyed with a key derived here from the
    salt source (never shipped in the pipeline), once the map is found to be at or past the
    version its mark in the folder of marks names (anchor.py); the version records the night
    (Night: folder holds its trace shards as written). Returns the manifest to publish (a night the map recorded already, a
    rerun after a run killed past its commit, names the start recorded for it, not the map's
    current one) and the version committed (None: nothing to commit); committed and intending:
    as publish's."""
    # Every check before the run's segments settle (a refusal leaves them to run_segments).
    check_night_kind(directory, base, earliest_ms)
    key = map_key(salt.load())
    check_not_extended(directory, base)  # a race lost is told as such, not as a rollback
    try:
        check_anchor(marks, directory, base.version, base.map_id, record_reader(directory), key)
    except JobStopped:
        # Another run may have committed since the check above (its mark moved past this run's
        # base): a race lost, never a replaced map to rebind.
        check_not_extended(directory, base)
        raise
    night = Night(manifest["id_map"], night_identity(manifest, folder), files_identity(manifest))
    recorded = recorded_start(base, *night.identities())
    if recorded is None and earliest_ms is not None:
        check_night_follows(directory, base, night, manifest.get("granularity"))
    published = manifest if recorded is None else manifest | {"id_map": recorded}
    added = {"blocks": added_blocks, "sessions": added_sessions}
    if not _brings_nothing(base, added, compacted, earliest_ms, night):
        check_carried_files(directory, base, compacted)
    written = {"blocks": block_files, "sessions": session_files}
    try:
        written = settle_segments(directory, base.version + 1, written)
    except OSError:
        # A run that won the race since the checks above may have discarded this run's folder
        # (discard_abandoned cannot tell a live run's folder from a killed one's): any failure
        # to settle is judged against the map first, and a race lost is told as such.
        check_not_extended(directory, base)
        raise
    new = next_version(
        directory,
        base,
        written=written,
        added=added,
        compacted=compacted,
        hash_shards=hash_shards,
        earliest_ms=earliest_ms,
        night=night,
        times=times,
    )
    if new is None:  # nothing to commit: the map as it is becomes the mark's, if it is not
        if base.version and base.map_id is not None:  # one from before ids: at its next commit
            advance_anchor(
                marks,
                directory,
                base.map_id,
                base.version,
                _record_raw(version_path(directory, base.version)),
                key,
            )
        return published, None
    record = publish(directory, base, new, key, committed, intending)
    advance_anchor(marks, directory, new.map_id, new.version, record, key)
    try:  # runs that lost or died on the way to this version
        discard_abandoned(directory, new, key)
    except Exception as err:  # the version stands: the next run's opening clears them again
        _LOG.warning(
            "id map %s: leftovers not cleared after version %d: %s", directory, new.version, err
        )
    return published, new.version
