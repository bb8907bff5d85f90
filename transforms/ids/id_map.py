"""The persisted hash -> id map of nightly exports: layout, metadata, reading, atomic publishing.

A map directory holds immutable versions and one pointer:

    CURRENT                                      {"version": 3}: a hint, the only file overwritten
    versions/000003.json                         version 3's metadata, listing its segment files
    segments/000003-RUNID/blocks-00012.parquet   ids first numbered by version 3, hash shard 12
    segments/000003-RUNID/blocks-00012.index.npz its index (segments.py)

Every segment of a version is split into the version's hash_shards shards, so a night finds a
key's rows in one file per segment. A compaction night may change the count (it rewrites all).

A run reads the published version, writes its new ids as a segment named by the version it
targets and its own run id (two runs never write the same paths), then commits by creating the
next version's metadata exclusively (exclusive.py: atomic locally and on gs://). Of two runs
extending one version, the first to commit publishes; the other is refused and publishes
nothing. CURRENT is then moved forward; readers also follow committed versions beyond it, so a
run killed between the two steps has still published. Cleanup deletes only segments of versions
already decided (<= the published one) that the winner's metadata does not list: never those of
a published version or of a run still under way. Segments hold keyed 16-byte hashes and ids
only, never tokens or text.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from transforms import storage
from transforms.errors import IdMapError, JobStopped
from transforms.ids.exclusive import create_exclusive

MAP_FORMAT = "kvtrace-id-map"
# 2: segments sorted by hash with an index (segments.py), the shard count recorded.
FORMAT_VERSION = 2
KINDS = ("blocks", "sessions")
CURRENT = "CURRENT"
# Each night adds a segment per kind, and reading a map opens every segment's files. Folding
# all segments into one every 32 nights bounds that to 32 x shards files, at the price of
# rewriting the map about once a month instead of every night.
MAX_SEGMENTS = 32


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

    def differences(self, other: MapIdentity) -> list[str]:
        names = {"salt_fingerprint": "salt", "block_size": "block size",
                 "tokenizer_sha256": "tokenizer files (sha256)", "hash_scheme": "hash scheme",
                 "chat_template_kwargs": "chat template kwargs",
                 "tokenization": "tokenization of a probe text (tokenizers release?)"}
        return [
            f"{label}: map has {_shown(name, getattr(self, name))}, "
            f"this run has {_shown(name, getattr(other, name))}"
            for name, label in names.items()
            if getattr(self, name) != getattr(other, name)
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

    def segments(self, kind: str) -> int:
        return len({path.split("/")[1] for path in self.files[kind]})

    def compaction_due(self) -> bool:
        """Whether the next run folds every segment into one (one more would exceed the cap)."""
        return any(self.segments(kind) + 1 > MAX_SEGMENTS for kind in KINDS)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MAP_FORMAT,
            "format_version": FORMAT_VERSION,
            "version": self.version,
            **self.identity.__dict__,
            "timestamp_origin_ms": self.timestamp_origin_ms,
            "next_id": self.next_id,
            "files": self.files,
            "hash_shards": self.hash_shards,
            "history": self.history,
        }

    @staticmethod
    def from_json(data: dict[str, Any], where: str) -> MapVersion:
        if data.get("format") != MAP_FORMAT:
            raise IdMapError(f"{where} is not a kvtrace id map")
        if data.get("format_version") != FORMAT_VERSION:
            raise IdMapError(
                f"{where} has id map format version {data.get('format_version')}; this kvtrace "
                f"reads version {FORMAT_VERSION} (segments sorted by hash, with an index). "
                f"Start a new map in another directory."
            )
        identity = MapIdentity(**{name: data[name] for name in MapIdentity.__dataclass_fields__
                                  if name in data})
        return MapVersion(data["version"], identity, data["timestamp_origin_ms"],
                          data["next_id"], data["files"], data["hash_shards"], data["history"])


def empty_version(identity: MapIdentity) -> MapVersion:
    """Version 0: what a map directory that does not exist yet stands for."""
    return MapVersion(0, identity, None, {kind: 0 for kind in KINDS}, {kind: [] for kind in KINDS},
                      hash_shards=0)


def version_path(directory: str, version: int) -> str:
    return storage.join(directory, "versions", f"{version:06d}.json")


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def segment_folder(version: int, run_id: str) -> str:
    return f"{version:06d}-{run_id}"


def segment_path(directory: str, version: int, run_id: str, kind: str, shard: int) -> str:
    return storage.join(directory, "segments", segment_folder(version, run_id),
                            f"{kind}-{shard:05d}.parquet")


def shard_of_segment(path: str) -> int:
    """The hash shard a segment file holds, from its name (blocks-00012.parquet: 12)."""
    return int(path.rsplit("-", 1)[1].removesuffix(".parquet"))


def relative(directory: str, path: str) -> str:
    return path[len(directory.rstrip("/")) + 1:]


def _read_json(path: str) -> dict[str, Any]:
    with storage.open_read(path) as handle:
        return json.loads(handle.read())


def _json_bytes(payload: dict[str, Any]) -> bytes:
    return (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode()


def _write_json(path: str, payload: dict[str, Any]) -> None:
    with storage.create(path) as handle:
        handle.write(_json_bytes(payload))


def current_version_number(directory: str) -> int:
    """The published version: CURRENT's, or a later committed one whose run was stopped before
    moving CURRENT; 0 for a map directory that is new (absent or empty)."""
    pointer = storage.join(directory, CURRENT)
    number = 0
    if storage.exists(pointer):
        try:
            number = int(_read_json(pointer)["version"])
        except (ValueError, KeyError, TypeError):
            raise IdMapError(f"{pointer} is damaged; it should read {{\"version\": N}}") from None
    while storage.exists(version_path(directory, number + 1)):
        number += 1
    return number


def open_map(directory: str, identity: MapIdentity) -> MapVersion:
    """The map's published version, checked against this run; a new map if there is none."""
    number = current_version_number(directory)
    if number == 0:
        return empty_version(identity)
    path = version_path(directory, number)
    try:
        version = MapVersion.from_json(_read_json(path), path)
    except (OSError, ValueError, KeyError, TypeError) as err:
        if isinstance(err, IdMapError):
            raise
        raise IdMapError(f"{path}: unreadable id map metadata ({err})") from None
    differences = version.identity.differences(identity)
    if differences:
        raise IdMapError(
            f"the id map {directory} was built with other settings, so its ids would not carry "
            f"over; refusing to use it. " + "; ".join(differences)
            + ". Use the map's settings, or start a new map in another directory."
        )
    if version.identity.tokenization is None:  # a map from before it was recorded adopts it
        version = replace(version, identity=replace(version.identity,
                                                    tokenization=identity.tokenization))
    return version


def discard_abandoned(directory: str, current: MapVersion) -> list[str]:
    """Delete segments no published version can ever use: those of runs that targeted a version
    already decided (<= current) and lost, or were killed. Segments of later versions may be a
    live run's and stay; so does everything a published version lists. Returns what went."""
    listed: dict[int, set[str]] = {}
    abandoned = []
    for path in storage.match(storage.join(directory, "segments", "*", "*")):
        folder = relative(directory, path).split("/")[1]  # 000004-RUNID
        version = int(folder.split("-")[0])
        if version > current.version:
            continue
        if version not in listed:
            listed[version] = _segment_folders(directory, version, current)
        if folder not in listed[version]:
            abandoned.append(path)
    if abandoned:
        storage.delete(abandoned)
    return sorted(abandoned)


def _segment_folders(directory: str, version: int, current: MapVersion) -> set[str]:
    """The segment folders version `version` lists (none for version 0)."""
    if version == 0:
        return set()
    files = current.files if version == current.version else _read_json(
        version_path(directory, version))["files"]
    return {path.split("/")[1] for kind_files in files.values() for path in kind_files}


def next_version(
    base: MapVersion,
    written: dict[str, list[str]],
    added: dict[str, int],
    compacted: bool,
    hash_shards: int,
    earliest_ms: int | None,
) -> MapVersion | None:
    """The version a run publishes, or None when it brought nothing new (a rerun). A compacting
    run's segments replace the map's; the others' add to them."""
    if not any(added.values()) and not compacted:
        return None
    number = base.version + 1
    files = {
        kind: sorted(written[kind] if compacted else base.files[kind] + written[kind])
        for kind in KINDS
    }
    origin = base.timestamp_origin_ms if base.timestamp_origin_ms is not None else earliest_ms
    return replace(
        base,
        version=number,
        timestamp_origin_ms=origin,
        next_id={kind: base.next_id[kind] + added[kind] for kind in KINDS},
        files=files,
        hash_shards=hash_shards,
        history=base.history + [{"version": number, "added": added, "compacted": compacted}],
    )


def publish(directory: str, base: MapVersion, new: MapVersion) -> None:
    """Commit the new version by creating its metadata exclusively, then move CURRENT to it."""
    metadata = _json_bytes(new.to_json())
    if current_version_number(directory) != base.version or not create_exclusive(
        version_path(directory, new.version), metadata
    ):
        raise JobStopped(
            f"the id map {directory} was extended by another run while this one ran (it started "
            f"from version {base.version}); this run's ids may clash with it, so it published "
            f"nothing (its trace has no manifest). Run the night again, one run per map at a time."
        )
    _switch_current(directory, new.version)


def _switch_current(directory: str, version: int) -> None:
    pointer = storage.join(directory, CURRENT)
    staged = f"{pointer}.tmp-{os.urandom(6).hex()}"
    _write_json(staged, {"version": version})
    storage.rename(staged, pointer)


def publish_night(
    _: Any,
    directory: str,
    base: MapVersion,
    compacted: bool,
    hash_shards: int,
    block_files: list[str],
    session_files: list[str],
    added_blocks: int,
    added_sessions: int,
    earliest_ms: list[int],
) -> int:
    """The last step of a run: publish what it added; returns the map's version after it."""
    new = next_version(
        base,
        written={"blocks": block_files, "sessions": session_files},
        added={"blocks": added_blocks, "sessions": added_sessions},
        compacted=compacted,
        hash_shards=hash_shards,
        earliest_ms=min(earliest_ms, default=None),
    )
    if new is None:
        return base.version
    publish(directory, base, new)
    discard_abandoned(directory, new)  # runs that lost or died on the way to this version
    return new.version
