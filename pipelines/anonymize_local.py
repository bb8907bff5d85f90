"""`kvtrace anonymize` on this machine without Beam: the same stage functions as the Beam pipeline
(anonymize.py), called in one process, with byte-identical output (tests/test_local_engine.py).

Why a second engine: importing Beam and building and starting the pipeline cost ~8 s, more than
a small job's work, and Beam's local multi-process mode gets slower with more workers (the
runner's data plane, measured on 16 cores). Here the Rust tokenizer uses every core, rendering
and hashing overlap it, and numbering ids is one numpy sort over the whole night. Runs that
need the id map or a distributed runner use the Beam pipeline.

read -> parse -> batch -> render | tokenize (background thread) | hash -> number -> write
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

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
from transforms.read.records import Request
from transforms.read.sources import ReadProgress, file_ranges, parse_one, read_range
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

_LOG = logging.getLogger("kvtrace")
# The name Beam's WriteToText gives a one-shard output, so both engines write the same files.
DEAD_LETTER_FILE = "rejected-00000-of-00001.jsonl"


class _Tally:
    """Records read and rejected, counted as the Beam pipeline counts them."""

    def __init__(self) -> None:
        self.read = 0
        self.rejected: list[DeadLetter] = []

    def requests(self, config: AnonymizeConfig) -> Iterator[Request]:
        """Every input record parsed, in file order; dead letters kept aside."""
        progress = ReadProgress(sum(size for _, size in config.inputs))
        for path, size in config.inputs:
            for piece in file_ranges(path, size):
                for item in read_range(piece, config.parse.max_record_bytes, progress):
                    self.read += 1  # a damaged file's unreadable rest counts as one record
                    parsed = item if isinstance(item, DeadLetter) else parse_one(*item, config.parse)
                    if isinstance(parsed, DeadLetter):
                        self.rejected.append(parsed)
                    else:
                        yield parsed


def encode_all(encoder: RequestEncoder, batches: Iterable[list[Request]], tally: _Tally
               ) -> list[HashedBatch]:
    """Every batch rendered, tokenized and hashed. A background thread tokenizes batch N (Rust,
    on every core, without the GIL) while this thread reads and renders batch N+1."""
    hashed: list[HashedBatch] = []

    def finish(rendered, tokenized: Future) -> None:
        batch, rejected = encoder.hash(rendered, tokenized.result())
        tally.rejected.extend(rejected)
        if batch is not None:
            hashed.append(batch)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize") as tokenizing:
        pending = None
        for batch in batches:
            rendered, rejected = encoder.render(batch)
            tally.rejected.extend(rejected)
            tokenized = tokenizing.submit(encoder.tokenize, rendered)
            if pending is not None:
                finish(*pending)
            pending = (rendered, tokenized)
        if pending is not None:
            finish(*pending)
    return hashed


def dense_ids(batch: HashedBatch, keys: np.ndarray) -> tuple[np.ndarray, UniqueTotals]:
    """Each key's id in first-seen order, aligned with keys; the same numbering as the Beam
    pipeline's buckets, whose order is by timestamp first."""
    firsts = earliest(keys)
    unique = UniqueTotals(len(firsts), int(firsts["weight"].sum()))
    return resolve(number(firsts, 0), keys), unique


def run_local(config: AnonymizeConfig) -> dict:
    """Run the job; returns the manifest, written last. Raises JobStopped (nothing published)
    when too much input is rejected."""
    if config.id_map is not None:
        raise ValueError("the local engine does not extend id maps; use the Beam pipeline")
    tally = _Tally()
    encoder = RequestEncoder(load_tokenizer(config.tokenizer), config.block_size,
                             chain_seed(config.salt.load()), config.chat_template_kwargs)
    batches = batches_by_weight(tally.requests(config), TOKENIZE_BATCH_BYTES,
                                lambda request: len(request.line), TOKENIZE_BATCH_REQUESTS)
    hashed = encode_all(encoder, batches, tally)
    _write_dead_letters(config.dead_letter, tally.rejected)

    whole = HashedBatch.concat(hashed) if hashed else None
    timestamps = whole.requests["timestamp_ms"] if whole else np.empty(0, np.int64)
    earliest_ms = [int(timestamps.min())] if len(timestamps) else []
    counts = check_rejected_fraction(RecordCounts(tally.read, len(tally.rejected)),
                                     config.max_rejected_fraction)
    check_not_before_origin(counts, earliest_ms, config.timestamp_origin_ms)

    rows, unique = _rows(whole, config.block_size)
    origin = config.timestamp_origin_ms if config.timestamp_origin_ms is not None else (
        earliest_ms[0] if earliest_ms else 0)
    files = _write_shards(config.output, whole, rows, origin)
    totals = ExportTotals.of_batch(whole) if whole else ExportTotals()
    damaged = sum(letter.reason == DAMAGED_FILE for letter in tally.rejected)
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
