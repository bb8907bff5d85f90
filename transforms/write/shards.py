"""Write trace rows as sorted, deterministically named JSONL and Parquet shards.

Rows go to shards by published minute (ms from the origin, as the rows publish them; consecutive
minutes per shard, see plan_of), so shards are sorted across file names and their count and cuts
are a function of the published rows alone: `kvtrace audit` recomputes them (cuts_unlike_plan).

The engine block hashes (--emit-block-hashes FOLDER, private) are staged beside FOLDER as the
shards are written and published by the one write protocol (publish.publish_folder) right after
the trace output is: never before it, never written through a link in FOLDER (the staged folder
is renamed into place). FOLDER's manifest.json.sha256 names the output they belong to: the
sha256 of that output's manifest.json, so a consumer can tell hashes that do not belong to the
trace beside them (a run killed between the two publishes: docs/BLOCK_HASHES.md).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from kvtrace.transforms import storage
from kvtrace.transforms.combiners import BucketTotals
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.ids.buckets import plan_shards, shards_of
from kvtrace.transforms.read.measured import measured_bytes, measured_part
from kvtrace.transforms.trace_format import (
    MANIFEST,
    FormatError,
    TraceColumns,
    arrow_array,
    canonical_json,
    check_values,
    jsonl_bytes,
    parquet_bytes,
    shard_name,
    table_bytes,
)
from kvtrace.transforms.write.coarsen import Coarsening, coarsen
from kvtrace.transforms.write.publish import (
    OutputRefused,
    folder_writer,
    foreign_files,
    publish_folder,
    sha256_of,
    staging_folder,
)
from kvtrace.transforms.write.rows import RowBatch, room_by_minute, shard_count

# A shard is sorted in one worker's memory: 8M ids are ~64 MB as int64 and ~70 MB of JSONL.
MAX_BLOCKS_PER_SHARD = 8_000_000


def shard_plan() -> BucketTotals:
    """A combiner: each batch's (published minute, room) pairs in (rows.request_room), the output
    shard plan out (each minute's room summed over the batches, then planned)."""
    return BucketTotals(iter, planned)


def planned(totals: Mapping[int, int]) -> np.ndarray:
    """The plan of rows whose published minutes take these total rooms."""
    minutes = np.array(sorted(totals), dtype=np.int64)
    return plan_of(minutes, np.array([totals[m] for m in minutes.tolist()], dtype=np.int64))


def plan_of(minutes: np.ndarray, rooms: np.ndarray) -> np.ndarray:
    """The plan (each shard's first published minute) of rows whose published minutes (distinct,
    ascending) take these rooms: consecutive minutes up to MAX_BLOCKS_PER_SHARD, the next minute
    starting the next shard."""
    return plan_shards(minutes, rooms, MAX_BLOCKS_PER_SHARD)


def cuts_unlike_plan(shard_rooms: Sequence[tuple[np.ndarray, np.ndarray]]) -> str | None:
    """How shards, given each one's (published minutes, rooms) in file order
    (rows.published_room), are cut otherwise than kvtrace plans their rows; None when not."""
    minutes, rooms = room_by_minute(
        np.concatenate([m for m, _ in shard_rooms] + [np.empty(0, np.int64)]),
        np.concatenate([r for _, r in shard_rooms] + [np.empty(0, np.int64)]),
    )
    plan = plan_of(minutes, rooms)
    if len(shard_rooms) != shard_count(plan):
        return (
            f"the rows are in {len(shard_rooms)} trace shards, kvtrace cuts them into "
            f"{shard_count(plan)} (consecutive published minutes up to "
            f"{MAX_BLOCKS_PER_SHARD:,} blocks each)"
        )
    for shard, (shard_minutes, _) in enumerate(shard_rooms):
        if (shards_of(shard_minutes, plan) != shard).any():
            return (
                f"trace shard {shard} is not cut where kvtrace cuts the rows (consecutive "
                f"published minutes up to {MAX_BLOCKS_PER_SHARD:,} blocks each)"
            )
    return None


BLOCK_HASHES_PREFIX = "block-hashes-"
BLOCK_HASHES_FILE = re.compile(rf"{BLOCK_HASHES_PREFIX}\d{{5}}-of-\d{{5}}\.parquet", re.ASCII)
# Which output the hashes belong to, as `sha256sum -c` reads it inside that output's folder.
BLOCK_HASHES_OUTPUT = f"{MANIFEST}.sha256"
BLOCK_HASHES_SCHEMA = pa.schema(
    [
        pa.field("row", pa.int64(), nullable=False),
        pa.field("position", pa.int32(), nullable=False),
        pa.field("id", pa.int64(), nullable=False),
        pa.field("hash", pa.uint64(), nullable=False),
    ],
    metadata={
        "private": "unkeyed engine block hashes: whoever holds the tokenizer can confirm "
        "a guessed prompt from them; never publish"
    },
)


def published_columns(batch: RowBatch, origin_ms: int) -> TraceColumns:
    """A shard's sorted, coarsened rows as the format publishes them: ms from the origin."""
    rows = batch.rows
    return TraceColumns(
        rows["timestamp_ms"] - origin_ms,
        rows["input_length"],
        rows["output_length"],
        rows["num_ids"],
        batch.ids,
        rows["session_id"],
        rows["response_ms"],
        None if batch.output_ids is None else rows["num_output_ids"],
        batch.output_ids,
        rows["parent"] - 1,  # ROW holds parent + 1
    )


def block_hashes_bytes(batch: RowBatch) -> bytes:
    """One row per block of the shard's trace rows: the row (0-based, within the trace file of
    the same shard number), the block's position, its published id and its engine hash."""
    counts = batch.rows["num_ids"]
    row = np.repeat(np.arange(len(counts)), counts)
    position = np.arange(len(batch.ids)) - np.repeat(np.cumsum(counts) - counts, counts)
    table = pa.Table.from_arrays(
        [
            arrow_array(row),
            arrow_array(position, pa.int32()),
            arrow_array(batch.ids),
            pa.array(
                batch.hashes if batch.hashes is not None else np.empty(0, np.uint64), pa.uint64()
            ),
        ],
        schema=BLOCK_HASHES_SCHEMA,
    )
    return table_bytes(table)


def write_shard(
    directory: str,
    shard: int,
    shards: int,
    batches: Iterable[RowBatch],
    origin_ms: int,
    coarsening: Coarsening = Coarsening(),
    hashes_directory: str | None = None,
    measured_directory: str | None = None,
) -> list[tuple[str, str]]:
    """Sort one shard's rows and write them as JSONL and Parquet; returns (path, sha256) of the
    two. With hashes_directory, the rows' engine block hashes go there too, owner-only
    (block_hashes_bytes); with measured_directory (the letters' staging), the engine's
    cached-token counts of the rows that have one, owner-only (read/measured.py). A row past
    trace_format's ranges (those the audit holds every row to) stops the run before any write.
    """
    ordered = coarsen(RowBatch.concat(list(batches)), origin_ms, coarsening).sorted()
    columns = published_columns(ordered, origin_ms)
    try:  # numpy min and max per column, once per shard: no measurable cost beside the JSONL
        check_values(columns)
    except FormatError as err:
        raise JobStopped(f"trace shard {shard}: {err}; nothing published") from None
    measured = measured_bytes(shard, ordered.rows["cached_tokens"])
    if measured_directory is not None and measured is not None:
        path = storage.join(measured_directory, measured_part(shard))
        with storage.create(path, private=True) as handle:
            handle.write(measured)
    if hashes_directory is not None:
        path = storage.join(
            hashes_directory, f"{BLOCK_HASHES_PREFIX}{shard:05d}-of-{shards:05d}.parquet"
        )
        with storage.create(path, private=True) as handle:
            handle.write(block_hashes_bytes(ordered))
    written = []
    for suffix, payload in ((".jsonl", jsonl_bytes(columns)), (".parquet", parquet_bytes(columns))):
        path = storage.join(directory, shard_name(shard, shards, suffix))
        with storage.create(path) as handle:
            handle.write(payload)
        written.append((path, hashlib.sha256(payload).hexdigest()))
    return written


def block_hashes_staging(hashes: str | None, output_staging: str) -> str | None:
    """Where a run stages the block hashes of the output it stages in output_staging: beside
    their folder (so one rename publishes them), named after that staging folder (one run's):
    by its name's bytes, which need not be UTF-8 (Linux names are bytes)."""
    if hashes is None:
        return None
    return staging_folder(hashes, sha256_of(os.fsencode(output_staging))[:16])


def block_hashes_files(hashes: str) -> frozenset[str]:
    """The names in a block-hashes folder that kvtrace writes (the rest is foreign)."""
    names = (
        storage.files_in(hashes)
        if storage.is_url(hashes)
        else (os.listdir(hashes) if os.path.isdir(hashes) else [])
    )
    return frozenset(n for n in names if BLOCK_HASHES_FILE.fullmatch(n) or n == BLOCK_HASHES_OUTPUT)


def check_block_hashes_folder(hashes: str) -> None:
    """Refuse, before the work, a block-hashes folder holding anything kvtrace did not write
    there (a link by a shard's name included): it is replaced whole when published."""
    if not storage.is_url(hashes) and os.path.islink(hashes):  # publishing swaps the link away
        raise OutputRefused(f"--emit-block-hashes {hashes} is a link; give the folder itself")
    writer = folder_writer(hashes)  # its files are all listed by its manifest: none foreign
    if writer:
        raise OutputRefused(
            f"--emit-block-hashes {hashes} is an output of kvtrace {writer}; "
            f"block hashes never replace it: write elsewhere"
        )
    foreign = foreign_files(hashes, block_hashes_files(hashes))
    if foreign:
        raise OutputRefused(
            f"--emit-block-hashes {hashes} holds files kvtrace did not write "
            f"({', '.join(foreign[:5])}); it is replaced whole, so it must be new, "
            f"empty, or an earlier run's block hashes"
        )


def publish_block_hashes(hashes: str | None, output_staging: str, manifest: dict) -> dict:
    """Once the output is published (its manifest given): its block hashes, staged by
    write_shard, in hashes' place, whole and owner-only, saying which output they belong to.
    Returns the manifest."""
    if hashes is None:
        return manifest
    staged = block_hashes_staging(hashes, output_staging)
    with storage.create(storage.join(staged, BLOCK_HASHES_OUTPUT), private=True) as handle:
        handle.write(f"{sha256_of(canonical_json(manifest))}  {MANIFEST}\n".encode())
    publish_folder(
        staged,
        hashes,
        block_hashes_files(hashes) | block_hashes_files(staged),
        private=True,
        flag="--emit-block-hashes",
    )
    return manifest
