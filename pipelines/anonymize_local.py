"""`kvtrace anonymize` on this machine without Beam: the same stage functions as the Beam pipeline
(anonymize.py), called in one process, with byte-identical output (tests/test_local_engine.py).

Why a second engine: importing Beam and building and starting the pipeline cost ~8 s, more than
a small job's work, and Beam's local multi-process mode gets slower with more workers (the
runner's data plane, measured on 16 cores). Here the Rust tokenizer uses every core, rendering
and hashing overlap it, and numbering ids is one numpy sort over the whole night. Runs that
need the id map or a distributed runner use the Beam pipeline.

read -> parse -> batch -> render | tokenize (background thread) | hash -> number -> write

With --processes N, file ranges are encoded in N worker processes (everything up to hashing is
per record, so it spreads); numbering and writing stay in this process.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from pipelines.anonymize_config import (
    TOKENIZE_BATCH_BYTES,
    TOKENIZE_BATCH_REQUESTS,
    AnonymizeConfig,
    write_stats,
)
from transforms import storage
from transforms.batching import batches_by_weight
from transforms.dead_letters import DAMAGED_FILE, DeadLetter
from transforms.encode.blocks import chain_seed
from transforms.encode.encode_requests import RequestEncoder
from transforms.encode.hashed_batch import HashedBatch
from transforms.encode.tokenize import load_tokenizer
from transforms.ids.buckets import buckets_of, plan_shards
from transforms.ids.dense_ids import (
    UniqueTotals,
    block_keys,
    earliest,
    number,
    resolve,
    session_keys,
)
from transforms.read.records import ParseOptions, Request
from transforms.read.sources import (
    FileRange,
    ReadProgress,
    file_ranges,
    parse_one,
    read_range,
)
from transforms.write.manifest import (
    RecordCounts,
    check_not_before_origin,
    check_rejected_fraction,
    manifest_path,
    write_json,
)
from transforms.write.rows import RowBatch, bucket_sizes, row_batch
from transforms.write.shards import MAX_BLOCKS_PER_SHARD, write_shard
from transforms.write.totals import ExportTotals

# The name Beam's WriteToText gives a one-shard output, so both engines write the same files.
DEAD_LETTER_FILE = "rejected-00000-of-00001.jsonl"


class Encoded(NamedTuple):
    """What encoding some input gives: hashed batches, dead letters, and records read (a damaged
    file's unreadable rest counts as one record read, as in the Beam pipeline)."""

    hashed: list[HashedBatch]
    rejected: list[DeadLetter]
    read: int


_WORKER: dict = {}  # per worker process: the encoder, built once by _start_worker


def encode_ranges(pieces: Iterable[FileRange], encoder: RequestEncoder, parse: ParseOptions,
                  progress: ReadProgress | None = None) -> Encoded:
    """Read, parse, batch, render, tokenize and hash the records of some file ranges. A
    background thread tokenizes batch N (Rust, on every core, without the GIL) while this thread
    reads and renders batch N+1."""
    hashed: list[HashedBatch] = []
    rejected: list[DeadLetter] = []
    read = 0

    def requests() -> Iterator[Request]:
        nonlocal read
        for piece in pieces:
            for item in read_range(piece, parse.max_record_bytes, progress):
                read += 1
                parsed = item if isinstance(item, DeadLetter) else parse_one(*item, parse)
                if isinstance(parsed, DeadLetter):
                    rejected.append(parsed)
                else:
                    yield parsed

    def finish(rendered, tokenized: Future) -> None:
        batch, empty = encoder.hash(rendered, tokenized.result())
        rejected.extend(empty)
        if batch is not None:
            hashed.append(batch)

    batches = batches_by_weight(requests(), TOKENIZE_BATCH_BYTES, lambda r: len(r.line),
                                TOKENIZE_BATCH_REQUESTS)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize") as tokenizing:
        pending = None
        for batch in batches:
            rendered, failed = encoder.render(batch)
            rejected.extend(failed)
            tokenized = tokenizing.submit(encoder.tokenize, rendered)
            if pending is not None:
                finish(*pending)
            pending = (rendered, tokenized)
        if pending is not None:
            finish(*pending)
    return Encoded(hashed, rejected, read)


def encode_inputs(config: AnonymizeConfig, processes: int) -> Encoded:
    """Every input record encoded: in this process, or spread over worker processes by file
    range (each range parsed, rendered, tokenized and hashed where it is read). Results are
    gathered in range order, so dead letters keep the input's order either way."""
    pieces = [piece for path, size in config.inputs for piece in file_ranges(path, size)]
    progress = ReadProgress(sum(size for _, size in config.inputs))
    if processes <= 1 or len(pieces) <= 1:
        return encode_ranges(pieces, _encoder(config), config.parse, progress)
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods()
                                          else "spawn")
    with ProcessPoolExecutor(processes, context, initializer=_start_worker,
                             initargs=(config,)) as pool:
        parts = list(pool.map(_encode_in_worker, pieces))
    return Encoded([b for p in parts for b in p.hashed], [d for p in parts for d in p.rejected],
                   sum(p.read for p in parts))


def _encoder(config: AnonymizeConfig) -> RequestEncoder:
    return RequestEncoder(load_tokenizer(config.tokenizer), config.block_size,
                          chain_seed(config.salt.load()), config.chat_template_kwargs)


def _start_worker(config: AnonymizeConfig) -> None:
    _WORKER["encoder"], _WORKER["parse"] = _encoder(config), config.parse


def _encode_in_worker(piece: FileRange) -> Encoded:
    return encode_ranges([piece], _WORKER["encoder"], _WORKER["parse"])


def dense_ids(batch: HashedBatch, keys: np.ndarray) -> tuple[np.ndarray, UniqueTotals]:
    """Each key's id in first-seen order, aligned with keys; the same numbering as the Beam
    pipeline's buckets, whose order is by timestamp first."""
    firsts = earliest(keys)
    unique = UniqueTotals(len(firsts), int(firsts["weight"].sum()))
    return resolve(number(firsts, 0), keys), unique


def run_local(config: AnonymizeConfig, processes: int = 1) -> dict:
    """Run the job; returns the manifest, written last. Raises JobStopped (nothing published)
    when too much input is rejected."""
    if config.id_map is not None:
        raise ValueError("the local engine does not extend id maps; use the Beam pipeline")
    encoded = encode_inputs(config, processes)
    _write_dead_letters(config.dead_letter, encoded.rejected)

    whole = HashedBatch.concat(encoded.hashed) if encoded.hashed else None
    timestamps = whole.requests["timestamp_ms"] if whole else np.empty(0, np.int64)
    earliest_ms = [int(timestamps.min())] if len(timestamps) else []
    counts = check_rejected_fraction(RecordCounts(encoded.read, len(encoded.rejected)),
                                     config.max_rejected_fraction)
    check_not_before_origin(counts, earliest_ms, config.timestamp_origin_ms)

    rows, unique = _rows(whole, config.block_size)
    origin = config.timestamp_origin_ms if config.timestamp_origin_ms is not None else (
        earliest_ms[0] if earliest_ms else 0)
    files = _write_shards(config.output, whole, rows, origin)
    totals = ExportTotals.of_batch(whole) if whole else ExportTotals()
    damaged = sum(letter.reason == DAMAGED_FILE for letter in encoded.rejected)
    manifest = write_stats(config, sorted(files), counts, totals, unique, damaged)
    write_json(manifest_path(config.output), manifest)
    return manifest


def _rows(whole: HashedBatch | None, block_size: int) -> tuple[RowBatch, UniqueTotals]:
    if whole is None:
        return RowBatch.concat([]), UniqueTotals(0, 0)
    block_ids, unique = dense_ids(whole, block_keys(whole, block_size))
    session_ids, _ = dense_ids(whole, session_keys(whole))
    return row_batch(whole.requests, block_ids, session_ids), unique


def _write_shards(directory: str, whole: HashedBatch | None, rows: RowBatch, origin: int
                  ) -> list[str]:
    """Shards by time bucket, as the Beam pipeline plans them; shard 0 always exists."""
    if whole is None:
        return write_shard(directory, 0, 1, [], origin)
    sizes: dict[int, int] = {}
    for bucket, size in bucket_sizes(whole):
        sizes[bucket] = sizes.get(bucket, 0) + size
    plan = plan_shards(sizes, MAX_BLOCKS_PER_SHARD)
    shards = max(plan.values(), default=0) + 1
    row_shards = np.array([plan[b] for b in buckets_of(rows.rows["timestamp_ms"]).tolist()])
    files = []
    for shard in range(shards):
        part = rows.select(np.flatnonzero(row_shards == shard))
        files += write_shard(directory, shard, shards, [part], origin)
    return files


def _write_dead_letters(directory: str, letters: list[DeadLetter]) -> None:
    with storage.create(storage.join(directory, DEAD_LETTER_FILE)) as handle:
        handle.write("".join(letter.to_json() + "\n" for letter in letters).encode())
