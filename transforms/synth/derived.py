"""A derived trace's folder (synthesize, convert -o DIR): its rows as one JSONL shard beside a
manifest.json that carries its block size and where its rows came from, so every reader of the
folder (analyze, simulate, export, render, synthesize again) reads it at its own block size.

The manifest is the one kvtrace writes (canonical JSON, write/manifest.write_json) in the
derived shape trace_format.DERIVED_MANIFEST_SCHEMA declares, checked against it before it is
written; the folder is published whole by write/publish.folder_output, the manifest last.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO

from kvtrace.transforms import storage
from kvtrace.transforms.read.paths import open_raw
from kvtrace.transforms.read.trace_inputs import pin_of
from kvtrace.transforms.trace_format import (
    DEFAULT_BLOCK_SIZE,
    DERIVED_FROM,
    DERIVED_MANIFEST_SCHEMA,
    FORMAT,
    GLOBAL_SCOPE,
    IDS_FIELD,
    schema_problems,
    shard_name,
)
from kvtrace.transforms.write.manifest import KVTRACE_VERSION, manifest_path, write_json

DERIVED_SHARD = shard_name(0, 1, ".jsonl")
_READ_BYTES = 1 << 20


@dataclass(frozen=True)
class Derivation:
    """Where a derived trace's rows came from: the command, the format it read, the sha256 of
    its sources' sha256 lines (sources_digest) and its numeric settings."""

    command: str
    source_format: str
    sources_sha256: str
    settings: dict[str, float | int | None] = field(default_factory=dict)


def is_folder_output(output: str) -> bool:
    """-o FILE.jsonl names a bare trace file; anything else a folder with its manifest."""
    return not output.endswith(".jsonl")


def sources_digest(files: Sequence[str]) -> str:
    """The sha256 of the sources' sha256 lines, in the order read: what `sha256sum FILES | cut
    -c1-64 | sha256sum` prints. A shard of a kvtrace folder gives the digest its manifest pinned
    (trace_inputs.pin_of); any other file is read once, as stored."""
    lines = "".join(f"{_file_sha256(path)}\n" for path in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def _file_sha256(path: str) -> str:
    published = pin_of(path)
    if published is not None:
        return published.sha256[posixpath.basename(path)]
    digest = hashlib.sha256()
    with open_raw(path) as handle:
        while chunk := handle.read(_READ_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


class _CountingWriter:
    """A file being written, with the sha256 and the line count of what went through it."""

    def __init__(self, handle: IO[bytes]):
        self._handle = handle
        self.sha256 = hashlib.sha256()
        self.rows = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.rows += data.count(b"\n")
        return self._handle.write(data)


def write_derived(
    folder: str, write_rows: Callable[[IO[bytes]], None], block_size: int, derivation: Derivation
) -> dict:
    """Write the rows (write_rows, given the shard to write to) and then the manifest into a
    staged folder; returns the manifest. The rows are kvtrace's JSONL, one per line."""
    with storage.create(storage.join(folder, DERIVED_SHARD)) as handle:
        shard = _CountingWriter(handle)
        write_rows(shard)  # type: ignore[arg-type]  # a writer is all the rows need
    manifest = derived_manifest(shard.rows, shard.sha256.hexdigest(), block_size, derivation)
    write_json(manifest_path(folder), manifest)
    return manifest


def _setting(value: float | int | None) -> int | str | None:
    """A setting as the manifest holds it: a fraction as Python spells it (published documents
    hold no floats, trace_format._foreign), a whole number or None as it is."""
    return repr(value) if isinstance(value, float) else value


def derived_manifest(rows: int, sha256: str, block_size: int, derivation: Derivation) -> dict:
    """The manifest of a derived folder of one shard; ValueError where it would be one kvtrace's
    readers do not accept (a setting no number, a command not declared)."""
    manifest = {
        "kvtrace_version": KVTRACE_VERSION,
        "format": FORMAT,
        "block_size": block_size,
        "records": {"exported": rows},
        "files": [DERIVED_SHARD],
        "sha256": {DERIVED_SHARD: sha256},
        IDS_FIELD: {"scope": GLOBAL_SCOPE},  # numbered once across the trace
        DERIVED_FROM: {
            "command": derivation.command,
            "source_format": derivation.source_format,
            "sources_sha256": derivation.sources_sha256,
            "settings": {name: _setting(value) for name, value in derivation.settings.items()},
        },
    }
    problems = schema_problems(manifest, DERIVED_MANIFEST_SCHEMA)
    if problems:
        raise ValueError(f"a derived manifest kvtrace does not write: {problems[0]}")
    return manifest


def bare_file_refusal(flag: str, output: str, block_size: int) -> str | None:
    """Why a derived trace may not be written as a bare .jsonl (None when it may): no manifest
    goes with it, so every reader takes DEFAULT_BLOCK_SIZE for it, right only when it is that."""
    if is_folder_output(output) or block_size == DEFAULT_BLOCK_SIZE:
        return None
    return (
        f"{flag} {output}: a bare .jsonl keeps no manifest, so every reader would take block "
        f"size {DEFAULT_BLOCK_SIZE} for this trace of {block_size}-token blocks; give {flag} "
        f"DIR, a folder with the trace ({DERIVED_SHARD}) and its manifest.json"
    )
