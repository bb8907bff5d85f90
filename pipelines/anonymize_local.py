"""`kvtrace anonymize` on this machine without Beam: the same stage functions as the Beam pipeline
(anonymize_beam.py), called in one process, with byte-identical output (tests/pipelines/test_local_engine.py).

Why a second engine: importing Beam and building and starting the pipeline cost ~8 s, more than
a small job's work, and Beam's local multi-process mode gets slower with more workers (the
runner's data plane, measured on 16 cores). Here the Rust tokenizer uses every core, rendering
and hashing overlap it, and numbering ids is one numpy sort over the whole night. Of an id map,
a night reads only the row groups that can hold its keys (segments.py); a compaction night
holds the whole map (24 bytes per id): maps beyond ~1e8 ids, like nights beyond one machine,
belong on a distributed runner through the Beam pipeline.

read -> parse -> batch -> render | tokenize (background thread) | hash -> number -> write

With --processes N, file ranges are encoded in N worker processes (everything up to hashing is
per record, so it spreads), forked from this one once it has loaded the tokenizer; numbering and
writing stay in this process.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, MutableSequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, NamedTuple

import numpy as np

from pipelines.anonymize_config import (
    TOKENIZE_BATCH_BYTES,
    TOKENIZE_BATCH_REQUESTS,
    AnonymizeConfig,
    publish_output,
    write_stats,
)
from pipelines.processes import busy_threads
from transforms import storage
from transforms.batching import batches_by_weight
from transforms.combiners import fold
from transforms.dead_letters import (
    DAMAGED_FILE,
    DeadLetter,
    SortedRuns,
    StagedLetters,
    Tally,
    merge_runs,
)
from transforms.encode.encode_requests import (EncodedBatch, OverlappedEncoder, RequestEncoder,
                                               open_encoder)
from transforms.encode.schemes import engine_hashes
from transforms.encode.segment_cache import CacheCounts, log_counts
from transforms.encode.hashed_batch import HashedBatch
from transforms.encode.native_stderr import last_words
from transforms.encode.timestamp_kinds import keep_input_kind, kind_counts
from transforms.errors import JobStopped
from transforms.garbage import settle_after_start_up
from transforms.ids.dense_ids import (
    NUMBERED,
    KindIds,
    block_keys,
    dense_ids,
    session_keys,
    shard_of,
    split_by,
)
from transforms.ids.id_map import publish_night, segment_files_by_shard, write_segment_shard
from transforms.ids.segments import SegmentFile, read_matching_files, read_segment
from transforms.read.records import ParseOptions, Request
from transforms.read.sources import (
    READ_SPLIT_BYTES,
    FileRange,
    ReadProgress,
    file_ranges,
    parse_one,
    read_range,
)
from transforms.write.coarsen import published_requests
from transforms.write.manifest import (RecordCounts, check_not_before_origin, id_map_start,
                                       check_rejected_fraction, trace_origin_ms)
from transforms.write.publish import DEAD_LETTER_FILE
from transforms.write.rows import RowBatch, request_room, row_batch, rows_by_shard, shard_count
from transforms.write.shards import (block_hashes_staging, publish_block_hashes, shard_plan,
                                     write_shard)
from transforms.write.totals import ExportTotals

_LOG = logging.getLogger("kvtrace")
# Where forking is unsafe (_can_fork), worker processes start from a clean server process.
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"  # read by the Rust tokenizer
# Workers claim input in ranges this size: the last ones to finish are ~0.3 s of a core apart
# (8 MB ranges, ~1.3 s of tokenizing each, left one worker waiting up to that long).
CLAIM_BYTES = 2 << 20
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# A worker still running this long after SIGTERM is killed (it ends at once, by default action).
END_WORKERS_S = 0.5


class Encoded(NamedTuple):
    """What encoding some input gives: hashed batches, dead letters, and records read (a damaged
    file's unreadable rest counts as one record read, as in the Beam pipeline). Dead letters
    are written to sorted runs as they come (staged); `rejected` holds a few in memory (a
    stream's window's) merged in with them when published."""

    hashed: list[HashedBatch]
    rejected: list[DeadLetter]
    read: int
    cache: CacheCounts = CacheCounts()  # what the segment cache did (not part of the output)
    staged: StagedLetters = StagedLetters()


_WORKER: dict = {}  # per worker process: the encoder, built once by _start_worker


def encode_ranges(pieces: Iterable[FileRange], encoder: RequestEncoder, parse: ParseOptions,
                  letters: str, progress: ReadProgress | None = None) -> Encoded:
    """Read, parse, batch, render, tokenize and hash the records of some file ranges (tokenizing
    in a background thread, encode_requests.OverlappedEncoder); their dead letters written as
    they come into sorted runs in the folder letters (dead_letters.SortedRuns)."""
    rejected = SortedRuns(letters)
    hashed, read = _encode(pieces, encoder, parse, rejected, progress)
    return Encoded(hashed, [], read, encoder.take_cache_counts(), rejected.close())


def _encode(pieces: Iterable[FileRange], encoder: RequestEncoder, parse: ParseOptions,
            rejected: SortedRuns, progress: ReadProgress | None) -> tuple[list[HashedBatch], int]:
    hashed: list[HashedBatch] = []
    read = 0

    def requests() -> Iterator[Request]:
        nonlocal read
        for piece in pieces:
            for item in read_range(piece, parse.max_record_bytes, progress):
                read += 1
                parsed = item if isinstance(item, DeadLetter) else parse_one(*item, parse)
                if isinstance(parsed, DeadLetter):
                    rejected.add(parsed)
                else:
                    yield parsed

    def finish(encoded: EncodedBatch | None) -> None:
        if encoded is not None:
            batch, empty = encoded
            for letter in empty:
                rejected.add(letter)
            if batch is not None:
                hashed.append(batch)

    encoding = OverlappedEncoder(encoder)
    try:
        for batch in batches_by_weight(requests(), TOKENIZE_BATCH_BYTES, lambda r: len(r.line),
                                       TOKENIZE_BATCH_REQUESTS):
            failed, previous = encoding.push(batch)
            for letter in failed:
                rejected.add(letter)
            finish(previous)
        finish(encoding.flush())
    finally:
        encoding.close()
    return hashed, read


def worker_count(processes: int, input_bytes: int) -> int:
    """--processes: 0 means one per core this process may run on, at most one per read split of
    input (a small input stays in this process: nothing to split, no pool to start)."""
    if processes:
        return processes
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, -(-input_bytes // READ_SPLIT_BYTES)))


def encode_inputs(config: AnonymizeConfig, processes: int) -> Encoded:
    """Every input record encoded: in this process, or spread over worker processes in runs of
    file ranges (each range parsed, rendered, tokenized and hashed where it is read). Results
    are gathered in range order; dead letters are merged into their declared order when
    published (dead_letters.py), whichever worker wrote them."""
    pieces = [piece for path, size in config.inputs
              for piece in file_ranges(path, size, CLAIM_BYTES)]
    total_bytes = sum(size for _, size in config.inputs)
    processes = min(worker_count(processes, total_bytes), len(pieces))
    if processes <= 1:
        encoder = _encoder(config)
        settle_after_start_up()
        return encode_ranges(pieces, encoder, config.parse, config.dead_letter,
                             ReadProgress(total_bytes))
    forked = _can_fork()
    context = multiprocessing.get_context("fork" if forked else START_METHOD)
    bounds = context.Array("q", run_bounds(len(pieces), processes))
    if forked:
        encoder = _encoder(config)
        _warm_up(encoder, pieces[0], config.parse)
        settle_after_start_up()
        _WORKER.update(encoder=encoder, parse=config.parse, progress=ReadProgress(total_bytes),
                       pieces=pieces, bounds=bounds, letters=config.dead_letter)
        pool = ProcessPoolExecutor(processes, context, initializer=_leave_stopping_to_parent)
        _LOG.info("encoding %d file ranges in %d worker processes forked from this one",
                  len(pieces), processes)
    else:
        pool = ProcessPoolExecutor(processes, context, initializer=_start_worker,
                                   initargs=(config, total_bytes, pieces, bounds))
        _LOG.info("encoding %d file ranges in %d worker processes started clean (this process "
                  "runs other threads or loaded gRPC)", len(pieces), processes)
    try:
        with _stop_signals_held(), _single_threaded_tokenizers_in_children():
            futures = [pool.submit(_encode_claimed, worker) for worker in range(processes)]
        parts = [part for _, part in sorted(p for f in futures for p in f.result())]
    except BrokenProcessPool:  # a worker died (its Python would have raised): say how, and why
        workers = list((pool._processes or {}).values())
        _end_workers(pool)
        raise JobStopped(_worker_death(workers)) from None
    except BaseException:  # a stop (Ctrl-C, SIGTERM) or a failure: no worker outlives the run
        _end_workers(pool)
        raise
    finally:
        _WORKER.clear()  # the encoder and its cache, which forked workers took from here
    pool.shutdown()
    return Encoded([b for p in parts for b in p.hashed], [], sum(p.read for p in parts),
                   functools.reduce(CacheCounts.add, (p.cache for p in parts), CacheCounts()),
                   sum((p.staged for p in parts), StagedLetters()))


@contextlib.contextmanager
def _stop_signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back while workers start: a worker forked meanwhile begins with
    them held and with this process's handlers, and lets them through only once
    _leave_stopping_to_parent has set its own (this process gets them when this ends)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _leave_stopping_to_parent() -> None:
    """In a worker: Ctrl-C (sent to the terminal's whole process group) is the parent's to act
    on, and SIGTERM, from the parent ending its workers, ends the worker at once, without a
    traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _end_workers(pool: ProcessPoolExecutor) -> None:
    """Workers ended at once, their work abandoned: shutting the pool down would wait for it."""
    workers = list((pool._processes or {}).values())  # the executor has no public handle on them
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.join(END_WORKERS_S)
        if worker.is_alive():
            worker.kill()


def _worker_death(workers: list[Any]) -> str:
    """One line: which signal ended a worker (the pool ends the others with SIGTERM) and the
    last words its native code wrote (a Rust abort says why there, nowhere else), which are
    logged at WARNING too."""
    codes = [worker.exitcode for worker in workers if worker.exitcode]
    cause = next((code for code in codes if code != -signal.SIGTERM), codes[0] if codes else None)
    how = ("" if cause is None else f" by {signal.Signals(-cause).name}" if cause < 0
           else f" with exit code {cause}")
    words = last_words()
    for line in words:
        _LOG.warning("native: %s", line)
    said = f"; its native code's last words: {' | '.join(words[-2:])}" if words else ""
    return f"a worker process died{how}{said}"


def _can_fork() -> bool:
    """Whether workers may fork from this process, inheriting its loaded tokenizer and imported
    renderer (~1.5 s of a core per worker otherwise): only where nothing but this thread runs
    and gRPC was never loaded (a Beam run in this process leaves threads whose locks a fork
    would copy held). The tokenizer's own thread pool is fork-aware."""
    return ("fork" in multiprocessing.get_all_start_methods() and busy_threads() == 0
            and "grpc" not in sys.modules)


def _warm_up(encoder: RequestEncoder, first: FileRange, parse: ParseOptions) -> None:
    """Render the input's first record here, so that forked workers inherit the template
    renderer imported and the template compiled; prompt-only input never imports it."""
    for item in read_range(first, parse.max_record_bytes):
        request = item if isinstance(item, DeadLetter) else parse_one(*item, parse)
        if not isinstance(request, DeadLetter):
            encoder.render([request])
        return


@contextlib.contextmanager
def _single_threaded_tokenizers_in_children() -> Iterator[None]:
    """Workers tokenize on one thread each (a worker per core), said through the variable the
    tokenizer reads when a process starts or forks (a forked one would otherwise warn that it
    turns its threads off, this process having used them)."""
    before = os.environ.get(TOKENIZERS_PARALLELISM)
    os.environ[TOKENIZERS_PARALLELISM] = "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ[TOKENIZERS_PARALLELISM]
        else:
            os.environ[TOKENIZERS_PARALLELISM] = before


def _encoder(config: AnonymizeConfig) -> RequestEncoder:
    return open_encoder(config.encode)


def _start_worker(config: AnonymizeConfig, total_bytes: int, pieces: list[FileRange],
                  bounds: Any) -> None:
    _leave_stopping_to_parent()
    _WORKER.update(encoder=_encoder(config), parse=config.parse,
                   progress=ReadProgress(total_bytes), pieces=pieces, bounds=bounds,
                   letters=config.dead_letter)
    settle_after_start_up()


def run_bounds(count: int, processes: int) -> list[int]:
    """One run of neighbouring ranges per worker, as [front, back) pairs flattened. A session's
    requests sit near each other in a log, so each worker's segment cache learns a session's
    history once; ranges dealt out in turn made every worker learn every session's history
    again at each range (agent logs: 87.6% of tokens from the cache with 2 workers, 89.9% in
    runs, 91.1% in one process)."""
    return [count * (w + side) // processes for w in range(processes) for side in (0, 1)]


def claim(bounds: MutableSequence[int], worker: int) -> int | None:
    """The next range for a worker: the front of its own run, then, once that is done, the back
    of the run with most left, so a worker slowed by its ranges or its core is helped rather
    than waited for, and what is taken from a run stays a neighbour of what its thief took
    before. None when every range is taken."""
    front, back = bounds[2 * worker], bounds[2 * worker + 1]
    if front < back:
        bounds[2 * worker] = front + 1
        return front
    victim = max(range(len(bounds) // 2), key=lambda v: bounds[2 * v + 1] - bounds[2 * v])
    if bounds[2 * victim + 1] <= bounds[2 * victim]:
        return None
    bounds[2 * victim + 1] -= 1
    return bounds[2 * victim + 1]


def _encode_claimed(worker: int) -> list[tuple[int, Encoded]]:
    """Ranges encoded by one worker, each with its place in the input (results are put back in
    input order, whoever encoded them)."""
    pieces, bounds, done = _WORKER["pieces"], _WORKER["bounds"], []
    while True:
        with bounds.get_lock():
            index = claim(bounds, worker)
        if index is None:
            return done
        done.append((index, encode_ranges([pieces[index]], _WORKER["encoder"], _WORKER["parse"],
                                          _WORKER["letters"],
                                          _WORKER["progress"])))


def run_local(config: AnonymizeConfig, processes: int = 0) -> dict:
    """Run the job; returns the manifest, written last. Raises JobStopped (nothing published)
    when too much input is rejected."""
    encoded = encode_inputs(config, processes)
    log_counts(encoded.cache)
    return publish_encoded(config, encoded, lambda kind, keys: _kind_ids(config, kind, keys))


def publish_encoded(config: AnonymizeConfig, encoded: Encoded,
                    kind_ids: Callable[[str, np.ndarray], KindIds],
                    origin_ms: int | None = None, next_ids: dict[str, int] | None = None) -> dict:
    """Number encoded requests (kind_ids: dense ids of one kind's keys, extending whatever map
    holds the earlier ones: the id map's, or a stream's from next_ids) and publish them:
    trace shards, dead letters, stats, manifest. The trace's clock starts at origin_ms, else at
    the map's origin or the earliest request."""
    whole = HashedBatch.concat(encoded.hashed) if encoded.hashed else HashedBatch.pack([])
    kept, mismatched = keep_input_kind(whole, kind_counts(whole))
    whole = kept if kept is not None else HashedBatch.pack([])
    # Merged into their declared order (dead_letters.py): what the ranges wrote, a window's
    # held in memory, and the requests of the input's minority timestamp kind.
    held = encoded.rejected + mismatched
    rejected = encoded.staged.tally + Tally.of(held)
    write_dead_letters(config.dead_letter, held, encoded.staged)

    earliest_ms = whole.earliest_ms()
    if origin_ms is None:
        origin_ms = config.timestamp_origin_ms
    counts = check_rejected_fraction(
        RecordCounts(encoded.read, rejected.count, rejected.lost_bytes, config.input_bytes),
        config.max_rejected_fraction, dict(rejected.reasons))
    check_not_before_origin(counts, earliest_ms, origin_ms)
    origin = trace_origin_ms(origin_ms, earliest_ms)
    whole = published_requests(whole, origin, config.coarsening)

    kinds = {"blocks": block_keys(whole, config.block_size), "sessions": session_keys(whole)}
    numbered = {kind: kind_ids(kind, keys) for kind, keys in kinds.items()}
    rows = row_batch(whole.requests, numbered["blocks"].ids, numbered["sessions"].ids,
                     engine_hashes(whole.block_hashes) if config.block_hashes else None,
                     config.emit_output_hashes)
    segments = {kind: _write_segments(config, kind, ids.added) for kind, ids in numbered.items()}
    files = _write_shards(config, whole, rows, origin)
    totals = ExportTotals.of_batch(whole, config.coarsening)
    damaged = rejected.of_reason(DAMAGED_FILE)
    if config.id_map is not None:
        next_ids = config.id_map.base.next_id
    manifest = write_stats(config, files, counts, totals, numbered["blocks"].unique, damaged,
                           id_map_start(next_ids, earliest_ms, origin,
                                        config.coarsening.timestamp_ms))
    if config.id_map:  # the output is published once the map's version is
        id_map = config.id_map
        manifest = publish_night(manifest, id_map.directory, id_map.base, config.salt,
                                 id_map.marks, config.compacts_map, config.hash_shards,
                                 segments["blocks"], segments["sessions"],
                                 numbered["blocks"].added_count,
                                 numbered["sessions"].added_count, earliest_ms)
    # The block hashes after the output they belong to, never before it.
    return publish_block_hashes(config.block_hashes, config.staging,
                                publish_output(config, manifest))


def _kind_ids(config: AnonymizeConfig, kind: str, keys: np.ndarray) -> KindIds:
    """Dense ids of one kind, extending the id map when the run has one. A night that re-splits
    the map into another shard count holds its rows of that kind whole and writes them again."""
    id_map = config.id_map
    if id_map is None:
        return dense_ids(keys)
    segments = id_map.base.segment_files(id_map.directory, kind)
    next_id = id_map.base.next_id[kind]
    if not config.reshards_map:
        return dense_ids(keys, lambda firsts: _matching_rows(segments, config.hash_shards, firsts),
                         next_id)
    tables = [table for segment in segments for _, table in read_segment(segment, 1)]
    everything = np.concatenate(tables + [np.empty(0, dtype=NUMBERED)])
    ids = dense_ids(keys, lambda _: everything, next_id)
    return ids._replace(added=np.concatenate([ids.added, everything]))


def _matching_rows(segments: list[SegmentFile], shards: int, firsts: np.ndarray) -> np.ndarray:
    """The map rows holding any of firsts' keys: of each segment file, only the row groups that
    can hold the keys of its shard."""
    files = segment_files_by_shard(segments)
    matched = [read_matching_files(files[shard], keys)
               for shard, keys in split_by(firsts, shard_of(firsts, shards)) if shard in files]
    _LOG.info("id map: read %.1f MiB, %d of %d row groups",
              sum(m.bytes_read for m in matched) / 2**20,
              sum(m.row_groups_read for m in matched), sum(m.row_groups for m in matched))
    return np.concatenate([m.rows for m in matched] + [np.empty(0, dtype=NUMBERED)])


def _write_segments(config: AnonymizeConfig, kind: str, added: np.ndarray) -> list[SegmentFile]:
    """The run's new map rows as a segment, one file per hash shard; on a folding night each
    shard's old files are merged in."""
    id_map = config.id_map
    if id_map is None:
        return []
    runs: dict[int, list[SegmentFile]] = {}
    if config.compacts_map and not config.reshards_map:
        runs = segment_files_by_shard(id_map.base.segment_files(id_map.directory, kind))
    new = dict(split_by(added, shard_of(added, config.hash_shards)))
    return [write_segment_shard(id_map.directory, id_map.base.version + 1, id_map.run_id, kind,
                                shard, runs.get(shard, []), [new[shard]] if shard in new else [])
            for shard in sorted(set(new) | set(runs))]


def _write_shards(config: AnonymizeConfig, whole: HashedBatch, rows: RowBatch,
                  origin: int) -> list[tuple[str, str]]:
    """Shards by published minute (write/shards.shard_plan); shard 0 always exists."""
    plan = fold(shard_plan(), [request_room(whole.requests["timestamp_ms"],
                                             whole.blocks_per_request(), origin)])
    by_shard = dict(rows_by_shard(rows, plan, origin))
    shards = shard_count(plan)
    return [file for shard in range(shards)
            for file in write_shard(config.staging, shard, shards,
                                    [by_shard[shard]] if shard in by_shard else [], origin,
                                    config.coarsening,
                                    block_hashes_staging(config.block_hashes, config.staging))]


def write_dead_letters(directory: str, letters: Iterable[DeadLetter],
                       staged: StagedLetters = StagedLetters()) -> None:
    """Into a run's letters staging folder (publish.DeadLetterRun), published with the run: the
    staged runs and letters merged in their declared order (dead_letters.py)."""
    merge_runs(storage.join(directory, DEAD_LETTER_FILE), staged, letters)
