"""The export's summary files: stats.json and manifest.json, written last.

manifest.json is written after every trace file, so its presence marks a complete export.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from transforms import storage
from transforms.errors import JobStopped
from transforms.write.shards import TRACE_FILE_PREFIX


@dataclass(frozen=True)
class RecordCounts:
    read: int
    rejected: int
    # Bytes of damaged files that became no record (dead_letters.DeadLetter.lost_bytes), and all
    # input bytes as stored: a file cut in its middle loses bytes, not only one record.
    lost_bytes: int = 0
    input_bytes: int = 0

    def rejected_fraction(self) -> float:
        """The larger of the records rejected and the input bytes lost (decoded bytes against
        stored ones: a compressed file's loss weighs more, never less, than it was)."""
        records = self.rejected / self.read if self.read else 0.0
        lost = self.lost_bytes / self.input_bytes if self.input_bytes else 0.0
        return max(records, lost)


def check_rejected_fraction(counts: RecordCounts, max_fraction: float | None) -> RecordCounts:
    """Fail the job, before any trace file is written, when too much input was rejected."""
    if max_fraction is not None and counts.rejected_fraction() > max_fraction:
        raise JobStopped(
            f"too much input rejected: {counts.rejected} of {counts.read} records, "
            f"{counts.lost_bytes} of {counts.input_bytes} bytes lost in damaged files "
            f"({counts.rejected_fraction():.1%}) > --max-rejected-fraction {max_fraction}"
        )
    return counts


def check_not_before_origin(
    counts: RecordCounts, earliest_ms: list[int], origin_ms: int | None
) -> RecordCounts:
    """Fail the job, before any trace file is written, when requests precede the id map's
    timestamp origin: their timestamps would come out negative."""
    if origin_ms is not None and earliest_ms and min(earliest_ms) < origin_ms:
        raise JobStopped(
            f"the earliest request ({min(earliest_ms)} ms) precedes the id "
            f"map's timestamp origin ({origin_ms} ms, the first request the map ever saw). A map "
            f"extends forward in time; anonymize earlier logs with a new map."
        )
    return counts


MANIFEST = "manifest.json"


def manifest_path(directory: str) -> str:
    return storage.join(directory, MANIFEST)


def remove_manifest(directory: str) -> None:
    """A run starts by removing the last run's manifest: until this one completes, the folder
    must not claim to hold a complete export."""
    path = manifest_path(directory)
    if storage.exists(path):
        storage.delete([path])


def write_json(path: str, payload: dict) -> None:
    with storage.create(path) as handle:
        handle.write((json.dumps(payload, indent=2, sort_keys=True) + "\n").encode())


def remove_stale_shards(directory: str, written: list[str]) -> None:
    """Trace shards from an earlier run with another shard count would mix into this export."""
    keep = set(written)
    stale = [p for p in storage.match(storage.join(directory, TRACE_FILE_PREFIX + "*"))
             if p not in keep]
    if stale:
        storage.delete(stale)
