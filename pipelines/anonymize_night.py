"""The end of an anonymize night, once, on plain values: what every engine does with the hashed
requests and dead letters of a night (or a stream's window) to publish its trace.

gate (rejected share, origin) -> number ids (extending the id map) -> write segments, shards,
dead letters, stats -> manifest -> commit the id map -> publish the trace (then block hashes)

The local engine (anonymize_local.py) and the stream's windows (anonymize_streaming.py) call
finish_night; the Beam pipeline (anonymize_beam.py) calls these same functions through named
steps that mirror them one to one, spreading the numbering and the shards over workers. No Beam
here.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import io
import logging
import os
import re
import stat
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import IO, Any, NamedTuple

import numpy as np

from kvtrace.pipelines.anonymize_config import AnonymizeConfig
from kvtrace.transforms import storage
from kvtrace.transforms.combiners import fold
from kvtrace.transforms.dead_letters import (
    DAMAGED_FILE,
    DeadLetter,
    StagedLetters,
    Tally,
    merge_runs,
    shown_name,
)
from kvtrace.transforms.encode.hashed_batch import HashedBatch
from kvtrace.transforms.encode.schemes import engine_hashes
from kvtrace.transforms.encode.segment_cache import CacheCounts
from kvtrace.transforms.encode.timestamp_kinds import keep_input_kind, kind_counts, sum_kind_counts
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.ids import id_map
from kvtrace.transforms.ids.dense_ids import (
    MAX_HASH_SHARDS,
    NUMBERED,
    KindIds,
    UniqueTotals,
    block_keys,
    dense_ids,
    session_keys,
    shard_of,
    split_by,
)
from kvtrace.transforms.ids.map_record import KINDS, MAX_DAYS, MAX_IDS, is_day, is_int, shown
from kvtrace.transforms.ids.segments import (
    DamagedFile,
    SegmentFile,
    check_listed,
    index_path,
    most_bytes,
    read_matching_files,
    read_segment,
)
from kvtrace.transforms.read.measured import join_measured
from kvtrace.transforms.read.paths import read_bytes
from kvtrace.transforms.read.timestamps import DAY_MS, EPOCH_CEILING_MS
from kvtrace.transforms.read.trace_inputs import MAX_MANIFEST_BYTES
from kvtrace.transforms.stats.audit import entry_kind_problem, entry_metadata_problems, row_flags
from kvtrace.transforms.trace_format import (
    CAPTURE_FIELD,
    CAPTURE_SCHEME,
    FORMAT,
    MANIFEST,
    MAX_TRACE_LINE_BYTES,
    NIGHT_ORIGIN,
    OUTPUT_IDS_FIELD,
    OUTPUT_LENGTH_FIELD,
    STATS,
    TIME_ORIGIN_FIELD,
    TIMESTAMP_FIELD,
    TRACE_FILE,
    canonical_json,
    capture_manifest,
    parse_json,
)
from kvtrace.transforms.write.coarsen import published_requests, round_to
from kvtrace.transforms.write.manifest import (
    KVTRACE_VERSION,
    RUN_COUNTS,
    RecordCounts,
    check_not_before_origin,
    check_rejected_fraction,
    id_map_start,
    manifest_path,
    public_model_name,
    public_template_kwargs,
    public_tokenizer,
    replay_contract,
    run_counts,
    trace_origin_ms,
    write_json,
    write_run_counts,
)
from kvtrace.transforms.write.parents import with_parents
from kvtrace.transforms.write.publish import (
    DEAD_LETTER_FILE,
    intend,
    publication,
    publish_folder,
    sha256_of,
)
from kvtrace.transforms.write.replayers import replay_commands
from kvtrace.transforms.write.rows import (
    RowBatch,
    request_room,
    row_batch,
    rows_by_shard,
    shard_count,
)
from kvtrace.transforms.write.shards import (
    BLOCK_HASHES_FILE,
    block_hashes_staging,
    publish_block_hashes,
    shard_plan,
    write_shard,
)
from kvtrace.transforms.write.totals import ExportTotals, export_stats

_LOG = logging.getLogger("kvtrace")


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
    # Why the fast tokenizer backend gave way to tokenizers in a worker, if it did
    # (fast_backend.py): the local engine then encodes the input again with tokenizers alone.
    backend_fallback: str | None = None
    # OpenAI Batch lines a local worker set aside to be joined: (partition, run, bytes) of each
    # run it wrote (read/batch_join.BatchSpill); they count as read once joined.
    batch_halves: tuple[tuple[int, str, int], ...] = ()


# Dense ids of one kind's keys (blocks, sessions), extending whatever holds the earlier ones.
NumberKind = Callable[[str, np.ndarray], KindIds]


class Night(NamedTuple):
    """A night's requests up to their numbering: what it numbers (kind_keys of `whole`) and
    what writing it needs once the ids are known (publish_night)."""

    whole: HashedBatch  # kept requests, times published (coarsened from origin)
    counts: RecordCounts
    rejected: Tally
    held: list[DeadLetter]  # letters in memory, merged with the staged ones when written
    staged: StagedLetters
    earliest_ms: int | None
    origin: int
    days: dict[int, int]  # requests per day, before times are rounded


def finish_night(
    config: AnonymizeConfig,
    encoded: Encoded,
    number: NumberKind | None = None,
    origin_ms: int | None = None,
    next_ids: dict[str, int] | None = None,
) -> dict:
    """Number encoded requests (number: by default number_ids, extending the run's id map if
    any; a stream numbers from its state, next_ids saying where its ids go on) and publish them:
    trace shards, dead letters, stats, manifest, then the id map's version and the trace. The
    trace's clock starts at origin_ms, else at the map's origin or the earliest request.
    Returns the manifest; raises JobStopped (nothing published) at the gate."""
    night = night_requests(config, encoded, origin_ms)
    number = number or (lambda kind, keys: number_ids(config, kind, keys))
    numbered = {kind: number(kind, keys(night.whole)) for kind, keys in kind_keys(config).items()}
    return publish_night(config, night, numbered, next_ids)


def night_requests(config: AnonymizeConfig, encoded: Encoded, origin_ms: int | None) -> Night:
    """finish_night up to its numbering, writing nothing: the requests kept (timestamp kind),
    the gate passed, times published from the origin. A stream numbers the keys of night.whole
    elsewhere (its id map in shard keys) and hands the ids to publish_night, which writes
    everything, letters first (a failed attempt of it is whole: a retry writes it again)."""
    whole = HashedBatch.concat(encoded.hashed) if encoded.hashed else HashedBatch.pack([])
    kept, mismatched = keep_input_kind(
        whole,
        sum_kind_counts([published_days(config), kind_counts(whole)]),
        config.parse.withholds_letters,
    )
    whole = kept if kept is not None else HashedBatch.pack([])
    days = kind_counts(whole)  # what the night adds to the map's, before times are rounded
    # Merged into their declared order (dead_letters.py): what the ranges wrote, a window's
    # held in memory, and the requests of the input's minority timestamp kind.
    held = encoded.rejected + mismatched
    rejected = encoded.staged.tally + Tally.of(held)

    earliest_ms = whole.earliest_ms()
    if origin_ms is None:
        origin_ms = config.timestamp_origin_ms
    counts = pass_gate(config, encoded.read, rejected, earliest_ms, origin_ms)
    origin = trace_origin_ms(origin_ms, earliest_ms)
    whole = published_requests(whole, origin, config.coarsening)
    return Night(whole, counts, rejected, held, encoded.staged, earliest_ms, origin, days)


def publish_night(
    config: AnonymizeConfig,
    night: Night,
    numbered: dict[str, KindIds],
    next_ids: dict[str, int] | None = None,
) -> dict:
    """finish_night from its ids on (numbered: each kind's ids of night.whole's keys): rows,
    shards, stats, manifest, the id map's version, then the trace published."""
    write_dead_letters(config.dead_letter, night.held, night.staged)
    whole, origin, earliest_ms = night.whole, night.origin, night.earliest_ms
    rows = row_batch(
        whole.requests,
        numbered["blocks"].ids,
        numbered["sessions"].ids,
        engine_hashes(whole.block_hashes) if config.block_hashes else None,
        config.emit_output_hashes,
        whole.links if config.emit_parents else None,
    )
    if config.emit_parents:
        rows = with_parents(rows)
    with run_segments(config):  # written here, settled by the commit, else removed
        segments = {kind: write_segments(config, kind, ids.added) for kind, ids in numbered.items()}
        files = write_shards(config, whole, rows, rows_origin_ms(config, origin, earliest_ms))
        totals = ExportTotals.of_batch(whole, config.coarsening)
        stats = write_stats(
            config,
            night.counts,
            totals,
            numbered["blocks"].unique,
            night.rejected.of_reason(DAMAGED_FILE),
        )
        manifest = night_manifest(config, files, stats, earliest_ms, origin, next_ids)
        manifest = commit_id_map(
            config,
            manifest,
            segments,
            {kind: ids.added_count for kind, ids in numbered.items()},
            earliest_ms,
            night_times(night.days, whole.requests["timestamp_ms"].max(initial=origin), origin),
        )
    return publish_trace(config, manifest)


def rows_origin_ms(config: AnonymizeConfig, origin_ms: int, earliest_ms: int | None) -> int:
    """Where the published rows' times count from: the trace's origin; with --time-origin night,
    this night's first published time on the map's clock (its manifest's id_map.time_from_ms),
    so its rows begin at 0. Only the rows move: what the map records of the night (its start,
    its times) stays on the map's clock, so the next night still follows it."""
    if not counts_from_night(config) or earliest_ms is None:
        return origin_ms
    start = id_map_start(
        config.id_map.base.next_id, earliest_ms, origin_ms, config.coarsening.timestamp_ms
    )
    return origin_ms + start["time_from_ms"]


def counts_from_night(config: AnonymizeConfig) -> bool:
    """Whether a night of an id map publishes its rows from its own start (--time-origin)."""
    return config.time_origin == NIGHT_ORIGIN and config.id_map is not None


def published_days(config: AnonymizeConfig) -> dict[int, int]:
    """Requests per day the id map's nights published (none without a map): a night's clock
    resets are judged against them with its own, as one run over every night judges them."""
    return config.id_map.base.days if config.id_map else {}


def night_times(days: dict[int, int], latest_ms: int, origin_ms: int) -> id_map.NightTimes:
    """What the id map records of a night: its requests per day, its last published time (from
    the origin; latest_ms is published already), None without a request."""
    return id_map.NightTimes(days, int(latest_ms - origin_ms) if days else None)


def pass_gate(
    config: AnonymizeConfig,
    read: int,
    rejected: Tally,
    earliest_ms: int | None,
    origin_ms: int | None,
) -> RecordCounts:
    """The night's record counts, once it may publish: not too much of its input rejected
    (--max-rejected-fraction, saying the top reasons), its timestamps of the id map's kind, no
    request before the clock's origin. Raises JobStopped before any trace file is written
    otherwise (epoch dates counted from a relative map's origin would not fit a trace row)."""
    if config.id_map is not None:
        id_map.check_night_kind(config.id_map.directory, config.id_map.base, earliest_ms)
    counts = check_rejected_fraction(
        RecordCounts(
            read,
            rejected.count,
            rejected.lost_bytes,
            config.input_bytes,
            tuple(sorted(rejected.reasons, key=lambda item: (-item[1], item[0]))),
            len(config.inputs),
            rejected.unserved_bytes,
        ),
        config.max_rejected_fraction,
        dict(rejected.reasons),
    )
    return check_not_before_origin(counts, earliest_ms, origin_ms)


def kind_keys(config: AnonymizeConfig) -> dict[str, Callable[[HashedBatch], np.ndarray]]:
    """What each kind of id numbers: a batch's block keys, and its session keys."""
    return {
        "blocks": functools.partial(block_keys, block_size=config.block_size),
        "sessions": session_keys,
    }


class MapReading(NamedTuple):
    """How a night reads one kind of the id map it extends."""

    segments: list[SegmentFile]  # the map's files of that kind
    next_id: int  # the kind's first new id
    # A night that re-splits the map into another shard count holds its rows whole and writes
    # them again; other nights read only the rows that can hold their keys.
    whole: bool
    # A compacting night (not re-splitting) merges each shard's old files into its new one.
    folds: bool


def map_reading(config: AnonymizeConfig, kind: str) -> MapReading | None:
    """How the night reads the id map's rows of one kind; None without an id map."""
    if config.id_map is None:
        return None
    base = config.id_map.base
    return MapReading(
        base.segment_files(config.id_map.directory, kind),
        base.next_id[kind],
        config.reshards_map,
        config.compacts_map and not config.reshards_map,
    )


def number_ids(config: AnonymizeConfig, kind: str, keys: np.ndarray) -> KindIds:
    """Dense ids of one kind, extending the id map when the run has one (map_reading)."""
    reading = map_reading(config, kind)
    if reading is None:
        return dense_ids(keys)
    if not reading.whole:
        return dense_ids(
            keys,
            lambda firsts: _matching_rows(reading.segments, config.hash_shards, firsts, kind),
            reading.next_id,
        )
    tables = [table for segment in reading.segments for _, table in read_segment(segment, 1)]
    everything = np.concatenate(tables + [np.empty(0, dtype=NUMBERED)])
    ids = dense_ids(keys, lambda _: everything, reading.next_id)
    return ids._replace(added=np.concatenate([ids.added, everything]))


def _matching_rows(
    segments: list[SegmentFile], shards: int, firsts: np.ndarray, kind: str
) -> np.ndarray:
    """The map rows holding any of firsts' keys: of each segment file, only the row groups that
    can hold the keys of its shard."""
    files = id_map.segment_files_by_shard(segments)
    looked_up = [
        (files[shard], keys)
        for shard, keys in split_by(firsts, shard_of(firsts, shards))
        if shard in files
    ]
    matched = [read_matching_files(shard_files, keys) for shard_files, keys in looked_up]
    if not len(firsts):
        return np.empty(0, dtype=NUMBERED)  # nothing looked up, nothing to say
    # One line per kind of id, saying what it counts: a map's files are few per shard, and a
    # night reads of them only the indexes and the row groups its keys may fall in.
    _LOG.info(
        "id map, %s: %d keys looked up in %d of its %d segment files (each with an index); "
        "read %.1f MiB, %d of their %d row groups",
        kind,
        len(firsts),
        sum(len(shard_files) for shard_files, _ in looked_up),
        len(segments),
        sum(m.bytes_read for m in matched) / 2**20,
        sum(m.row_groups_read for m in matched),
        sum(m.row_groups for m in matched),
    )
    return np.concatenate([m.rows for m in matched] + [np.empty(0, dtype=NUMBERED)])


def run_segments(config: AnonymizeConfig) -> AbstractContextManager[None]:
    """The run's segment folder, owned from before the night writes its first segment until its
    commit settles them or the night ends otherwise (id_map.run_segments: removed on every exit,
    whichever engine writes them); nothing without an id map."""
    run = config.id_map
    if run is None:
        return nullcontext()
    return id_map.run_segments(run.directory, run.base.version + 1, run.run_id)


def write_segments(config: AnonymizeConfig, kind: str, added: np.ndarray) -> list[SegmentFile]:
    """The run's new map rows as a segment, one file per hash shard; on a folding night each
    shard's old files are merged in. None without an id map."""
    reading = map_reading(config, kind)
    if reading is None:
        return []
    runs = id_map.segment_files_by_shard(reading.segments) if reading.folds else {}
    new = dict(split_by(added, shard_of(added, config.hash_shards)))
    run = config.id_map
    return [
        id_map.write_segment_shard(
            run.directory,
            run.base.version + 1,
            run.run_id,
            kind,
            shard,
            runs.get(shard, []),
            [new[shard]] if shard in new else [],
        )
        for shard in sorted(set(new) | set(runs))
    ]


def write_shards(
    config: AnonymizeConfig, whole: HashedBatch, rows: RowBatch, origin: int
) -> list[tuple[str, str]]:
    """Shards by published minute (write/shards.shard_plan); shard 0 always exists. Returns
    each file written with its sha256."""
    plan = fold(
        shard_plan(),
        [request_room(whole.requests["timestamp_ms"], whole.blocks_per_request(), origin)],
    )
    by_shard = dict(rows_by_shard(rows, plan, origin))
    shards = shard_count(plan)
    return [
        file
        for shard in range(shards)
        for file in write_shard(
            config.staging,
            shard,
            shards,
            [by_shard[shard]] if shard in by_shard else [],
            origin,
            config.coarsening,
            block_hashes_staging(config.block_hashes, config.staging),
            config.dead_letter,  # the letters' staging: private, published with the run
        )
    ]


def write_dead_letters(
    directory: str, letters: Iterable[DeadLetter], staged: StagedLetters = StagedLetters()
) -> str | None:
    """Into a run's letters staging folder (publish.DeadLetterRun), published with the run: the
    staged runs and letters merged in their declared order (dead_letters.py). Returns the
    file's path; None for a run that rejected nothing, which leaves no file to publish."""
    letters = list(letters)  # a few held in memory (a window's, the minority timestamp kind's)
    if staged.tally.count or letters:
        return merge_runs(storage.join(directory, DEAD_LETTER_FILE), staged, letters)
    # No file, never an empty one made and removed: an object store refuses an empty upload.
    storage.delete(list(staged.files))  # empty runs, if any were staged
    return None


def write_stats(
    config: AnonymizeConfig,
    counts: RecordCounts,
    totals: ExportTotals,
    unique: UniqueTotals,
    damaged: int,
) -> dict:
    """stats.json into the staging folder, and the run's own counts beside its dead letters
    (never published: write/manifest.run_counts). Returns the stats."""
    write_run_counts(config.dead_letter, run_counts(counts, totals, damaged))
    stats = export_stats(totals, unique.count, unique.weight)
    with storage.create(storage.join(config.staging, STATS)) as handle:
        handle.write(canonical_json(stats))
    return stats


def night_manifest(
    config: AnonymizeConfig,
    files: list[tuple[str, str]],
    stats: dict,
    earliest_ms: int | None,
    origin_ms: int,
    next_ids: dict[str, int] | None = None,
) -> dict:
    """The manifest, which lists every file of the output (files: the shards, each with its
    sha256; and stats.json) and is written last. Ids continue the id map's, or a stream's
    earlier windows' (next_ids), from where write/manifest.id_map_start says."""
    sha256 = {path.rsplit("/", 1)[-1]: digest for path, digest in files}
    sha256[STATS] = sha256_of(canonical_json(stats))
    if config.id_map is not None:
        next_ids = config.id_map.base.next_id
    exported = stats["requests"]
    capture = config.parse.capture
    return {
        "kvtrace_version": KVTRACE_VERSION,
        "format": FORMAT,
        "tokenizer": public_tokenizer(config.tokenizer, config.tokenizer_sha256),
        "block_size": config.block_size,
        # A capture night's keys are the engine's hashes re-keyed (encode/captures.py).
        "hash_scheme": CAPTURE_SCHEME if capture else config.hash_scheme.identity,
        "hash_scheme_keyed": True if capture else config.hash_scheme.keyed,
        "granularity": {
            "timestamp_ms": config.coarsening.timestamp_ms,
            OUTPUT_LENGTH_FIELD: config.coarsening.output_length,
        },
        # Whether engine hashes were written elsewhere; not where (a private location).
        OUTPUT_IDS_FIELD: config.emit_output_hashes,
        "chat_template_kwargs": public_template_kwargs(
            config.chat_template_kwargs, config.salt.load()
        ),
        # Only what the rows prove: the other counts are the operator's (write_run_counts).
        "records": {"exported": exported},
        # Where ids continue an id map's (a stream's) earlier nights; None: dense from 0.
        "id_map": id_map_start(next_ids, earliest_ms, origin_ms, config.coarsening.timestamp_ms),
        "files": sorted(sha256),
        "sha256": sha256,
        # How each replayer reads this folder, with this block size and ms timestamps.
        "replay": replay_commands(config.block_size, exported, list(sha256)),
        # The ids' scope and width, the hit rates' definitions.
        **replay_contract(),
        **public_model_name(config.model_name),
        **({CAPTURE_FIELD: capture_manifest(capture)} if capture else {}),
        # Rows from the night's own start (id_map.time_from_ms on the map's clock); absent: from
        # the map's origin.
        **({TIME_ORIGIN_FIELD: NIGHT_ORIGIN} if counts_from_night(config) else {}),
    }


def commit_id_map(
    config: AnonymizeConfig,
    manifest: dict,
    segments: dict[str, list[SegmentFile]],
    added: dict[str, int],
    earliest_ms: int | None,
    times: id_map.NightTimes = id_map.NightTimes(),
) -> dict:
    """The id map's new version (the segments written, the ids added of each kind, the night
    the manifest describes) committed before the trace that uses it is published. The commit,
    its mark and its cleanup are one publication (publish.publication): a stop waits for them,
    and once they stand it names the version committed (what the CLI's stop line says; the
    Beam engine runs this in its launcher, once the job is done: finish_staged). Returns the manifest to publish: a night the
    map recorded already (a rerun after a run killed past its commit) names the start
    recorded for it (id_map.publish_night)."""
    run = config.id_map
    if run is None:
        return manifest
    # One publication: a stop waits for the commit, and once it stands the stop's line names it
    # (publish.published_here; from a Beam child, through its parent: forward_publications).
    # A hard end that stops waiting is told the version this run's commit created, if any:
    # never one read from the map, which another run may have extended in its place.
    committed: list[int] = []
    with publication(functools.partial(_committed, run.directory, committed)) as published:
        manifest, version = id_map.publish_night(
            manifest,
            run.directory,
            run.base,
            config.salt,
            run.marks,
            config.compacts_map,
            config.hash_shards,
            segments["blocks"],
            segments["sessions"],
            added["blocks"],
            added["sessions"],
            earliest_ms,
            config.staging,
            times,
            committed,
            functools.partial(_intending, run.directory),
        )
        if version is not None:
            published.append(_version_name(run.directory, version))
    return manifest


def _committed(directory: str, committed: list[int]) -> list[str]:
    """The version of the id map at directory this run committed, if any (id_map.publish)."""
    return [_version_name(directory, version) for version in committed]


def _intending(directory: str, version: int, path: str, data: bytes) -> None:
    """The commit's record, told before it is created (publish.intend): a Beam child's parent
    then names the version if the child dies with it standing, at whatever point."""
    intend(_version_name(directory, version), path, data)


def _version_name(directory: str, version: int) -> str:
    return f"version {version} of the id map {directory}"


# What a Beam night stages for its launcher (stage_night): beside the run's letters, in their
# owner-only staging folder, of which only the letters and the measured file are published.
NIGHT_RECORD = "night.json"
REFUSED = "refused"  # a refused night's record holds only its one line
# Bounded as the manifest it holds is, plus each kind's segment files (an entry is ~0.4 KiB)
# and the night's days (~30 bytes each, MAX_DAYS at most).
MAX_NIGHT_RECORD_BYTES = MAX_MANIFEST_BYTES + len(KINDS) * MAX_HASH_SHARDS * 1024 + MAX_DAYS * 64


def stage_night(
    config: AnonymizeConfig,
    manifest: dict,
    segments: dict[str, list[SegmentFile]],
    added: dict[str, int],
    earliest_ms: int | None,
    times: id_map.NightTimes,
) -> dict:
    """The night as a Beam job ends it: its manifest, and what its id map's commit takes (the
    segment files written, the ids added of each kind, its earliest time, its times), as one
    small owner-only record (NIGHT_RECORD) the launcher reads once the job has finished
    (finish_staged): no step of a job commits, so on every runner the order is job done ->
    commit -> publish, and the process that commits is the one that tells (publish.intend).
    A segment file is recorded by its hash shard: its path is the run's (id_map.segment_path);
    the letters, run counts and block hashes by their digests (staged_beside). Returns the
    record."""
    record: dict = {"manifest": manifest, BESIDE: staged_beside(config).files}
    if config.id_map is not None:
        record |= {
            "segments": {
                kind: [
                    {
                        "shard": id_map.shard_of_segment(f.path),
                        "data": f.data,
                        "index": f.index,
                        "rows": f.rows,
                    }
                    for f in segments[kind]
                ]
                for kind in KINDS
            },
            "added": {kind: int(added[kind]) for kind in KINDS},
            "earliest_ms": earliest_ms,
            "times": {
                "days": {str(day): n for day, n in times.days.items()},
                "last_ms": times.last_ms,
            },
        }
    return _stage_record(config, record)


def stage_refusal(config: AnonymizeConfig, reason: str) -> dict:
    """A night a step of its job refused (JobStopped's one line), staged as its record in place
    of stage_night's: the job finishes, as a step that raises is retried by a remote runner
    (Flink: its restart strategy, a traceback each attempt), and the launcher raises the
    refusal (finish_staged) before any commit or publication. Returns the record."""
    return _stage_record(config, {REFUSED: reason})


def _stage_record(config: AnonymizeConfig, record: dict) -> dict:
    with storage.create(storage.join(config.dead_letter, NIGHT_RECORD), private=True) as handle:
        handle.write(canonical_json(record))
    return record


def finish_staged(config: AnonymizeConfig) -> StagedNight:
    """In the launcher, once the job that staged the night (stage_night) has finished: the id
    map's version committed (commit_id_map), then the manifest staged, as the local engine's
    driver does (publish_night). Returns the night to publish (publish_staged). Nothing of
    the record is taken on its word: its manifest must be the one the staging folder itself
    gives (staged_manifest), its facts those of the staged rows (RowTimes), its letters, run
    counts and block hashes those their staging folders hold (staged_beside, _check_counts),
    its commit that of the run's segment folder (_staged_commit). A record missing, damaged or
    out of bounds, or the night refused by a step (stage_refusal), is a one-line JobStopped:
    nothing committed, nothing published."""
    path = storage.join(config.dead_letter, NIGHT_RECORD)
    try:
        record = parse_json(read_bytes(path, MAX_NIGHT_RECORD_BYTES))
        refused = _refusal(record)
        if refused is None:
            staged = _bounded(config, record)
            earliest_ms, times = staged.earliest_ms, staged.times
            manifest = staged_manifest(config, staged.manifest, earliest_ms, times)
            beside = staged_beside(config)
            if canonical_json(beside.files) != canonical_json(staged.beside):
                raise ValueError(
                    "its letters, run counts or block hashes are not those staged beside it"
                )
            _check_counts(beside, manifest)
            segments, added = _staged_commit(config, staged)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        if config.id_map is not None:  # the run's files discarded by a run that won the race
            id_map.check_not_extended(config.id_map.directory, config.id_map.base)
        raise JobStopped(
            f"the job's staged night {path} cannot be read ({err}); nothing was published"
        ) from None
    if refused is not None:
        raise JobStopped(refused)
    manifest = commit_id_map(config, manifest, segments, added, earliest_ms, times)
    return StagedNight(stage_manifest(config, manifest), beside.files)


class StagedNight(NamedTuple):
    """A night as its launcher verified and staged it (finish_staged), for the process that
    publishes it (publish_staged), which holds the staging folders to it once more: the
    manifest staged, and what is published beside it (staged_beside's files; None where the
    process that publishes wrote them itself, the local engine)."""

    manifest: dict
    beside: dict | None = None


# What a Beam night publishes beside its trace, as stage_night records it (staged_beside).
BESIDE = "beside"
_MAX_RUN_COUNTS_BYTES = 1 << 20  # five counts and a few reasons: KBs


class Beside(NamedTuple):
    files: dict  # the letters (sha256, lines), the run counts' sha256, the block hashes' sha256
    run_counts: bytes | None  # as digested


def staged_beside(config: AnonymizeConfig) -> Beside:
    """What a night publishes beside its trace, as its staging folders hold it: the run's
    letters file (its sha256 and its lines: one letter each), its run counts (their sha256)
    and each block hashes file (its sha256), every file read once."""
    letters = _digest(storage.join(config.dead_letter, DEAD_LETTER_FILE), lines=True)
    counts_path = storage.join(config.dead_letter, RUN_COUNTS)
    counts = _small(counts_path, _MAX_RUN_COUNTS_BYTES) if _present(counts_path) else None
    hashes = block_hashes_staging(config.block_hashes, config.staging)
    files = {
        "letters": letters,
        "run_counts": None if counts is None else sha256_of(counts),
        "block_hashes": (
            {}
            if hashes is None or not _present(hashes)
            else staged_files(hashes, writes=lambda name: bool(BLOCK_HASHES_FILE.fullmatch(name)))
        ),
    }
    return Beside(files, counts)


def _check_counts(beside: Beside, manifest: dict) -> None:
    """The run counts (what the summary says) as the staged night gives them: its exported
    those of its rows (the manifest's), its rejected the letters' lines, read = exported +
    rejected."""
    if beside.run_counts is None:
        raise ValueError(f"it staged no {RUN_COUNTS}")
    counts = parse_json(beside.run_counts)
    exported = manifest["records"]["exported"]
    rejected = 0 if beside.files["letters"] is None else beside.files["letters"]["lines"]
    said = [counts.get(k) for k in ("read", "exported", "rejected")] if type(counts) is dict else []
    if said != [exported + rejected, exported, rejected] or not all(type(n) is int for n in said):
        raise ValueError(
            f"its {RUN_COUNTS} do not say read = its {exported} rows + its {rejected} staged "
            "letters"
        )


def _refusal(record: object) -> str | None:
    """The one line of a refused night's record (stage_refusal); None for a night's record."""
    if not isinstance(record, dict) or REFUSED not in record:
        return None
    reason = record[REFUSED]
    if not isinstance(reason, str) or not reason or "\n" in reason:
        raise ValueError("its refusal is not one line of text")
    return reason


def staged_manifest(
    config: AnonymizeConfig, recorded: Any, earliest_ms: int | None, times: id_map.NightTimes
) -> dict:
    """The manifest of the night staged in config.staging, derived from the folder itself in
    one pass (staged_files: every file it holds, nothing more, nothing less, each digest from
    its bytes) with night_manifest, as the job derived it; the record's (recorded) must be it
    byte for byte, and the record's times those of the rows read in that pass. The files are
    then held to the audit's own row, twin and stats checks (stats/audit.row_flags), their
    bytes those digested: a worker's rows kvtrace does not write are never published. Returns
    it; a ValueError names the first difference."""
    origin = trace_origin_ms(config.timestamp_origin_ms, earliest_ms)
    rows = RowTimes(
        rows_origin_ms(config, origin, earliest_ms), origin, config.coarsening.timestamp_ms
    )
    digests = staged_files(config.staging, rows)
    stats = parse_json(read_bytes(storage.join(config.staging, STATS), MAX_MANIFEST_BYTES))
    files = [(name, digest) for name, digest in digests.items() if name != STATS]
    manifest = night_manifest(config, files, stats, earliest_ms, origin)
    if manifest["sha256"] != digests:  # stats.json not as night_manifest writes its digest
        raise ValueError(f"its staged {STATS} is not the stats kvtrace writes")
    flags, read = row_flags(config.staging, sorted(digests), manifest)
    if flags:
        raise ValueError(f"its staged output is not what kvtrace writes ({flags[0]})")
    if any(digests.get(name) != digest for name, digest in read.items()):
        raise ValueError("its staged files changed while they were checked")
    if type(recorded) is not dict:
        raise ValueError("its manifest is not an object")
    if canonical_json(recorded) != canonical_json(manifest):
        odd = sorted(
            k for k in manifest.keys() | recorded.keys() if recorded.get(k) != manifest.get(k)
        )
        raise ValueError(
            f"its manifest is not the staging folder's (its {odd[0][:40] if odd else 'bytes'!r} "
            "differs)"
        )
    if config.id_map is not None:
        rows.check(earliest_ms, times)
    return manifest


# A row as kvtrace writes it begins with its timestamp (trace_format.jsonl_bytes), a published
# int: below 2^40, at most 13 digits (read here at most 16, so no value overflows).
_ROW_START = np.frombuffer(b'{"' + TIMESTAMP_FIELD.encode() + b'": ', np.uint8)
_TIME_DIGITS = 16
_POWERS = 10 ** np.arange(_TIME_DIGITS + 1, dtype=np.int64)
_READ_BYTES = 1 << 20


def _trace_file(name: str) -> bool:
    """A name kvtrace writes in a trace's staging folder."""
    return name in (MANIFEST, STATS) or TRACE_FILE.fullmatch(name) is not None


# A trace's files: each shard's two (99,999 shards at most: TRACE_FILE), stats and manifest.
_MOST_STAGED_FILES = 2 * 99_999 + 2


def staged_files(
    folder: str, rows: RowTimes | None = None, writes: Callable[[str], bool] = _trace_file
) -> dict[str, str]:
    """Every file in folder, by name -> the sha256 of its bytes, read once, once every entry
    is one kvtrace writes there (_listed); rows, if given, fed each JSONL shard's rows in that
    same read."""
    digests = {}
    for name in _listed(folder, writes):
        digest = hashlib.sha256()
        pending = b""
        with _opened(storage.join(folder, name)) as handle:
            while chunk := handle.read(_READ_BYTES):
                digest.update(chunk)
                if rows is not None and name.endswith(".jsonl"):
                    lines, newline, pending = (pending + chunk).rpartition(b"\n")
                    rows.add(lines + newline, name)
                    if len(pending) > MAX_TRACE_LINE_BYTES:
                        raise ValueError(
                            f"a row of {shown(name)} is over {MAX_TRACE_LINE_BYTES} bytes"
                        )
        if pending:
            raise ValueError(f"{shown(name)} ends inside a row")
        digests[name] = digest.hexdigest()
    return digests


def _listed(folder: str, writes: Callable[[str], bool]) -> list[str]:
    """The names of a staging folder's files, sorted, once each entry is one kvtrace writes
    there: a name it writes (writes), a regular file of one link carrying nothing kvtrace does
    not set (the audit's own entry checks: entry_kind_problem, entry_metadata_problems), in a
    folder that is no link; a ValueError at the first other entry, and past the most files
    kvtrace writes, as the folder is listed: leftovers by the hundred thousand are never held,
    nor digested. An object store's folder (no links, no metadata read) by its names."""
    if storage.is_url(folder):
        names = storage.files_in(folder, nested=True)
        odd = [name for name in names if not writes(name)]
        if odd:
            raise ValueError(f"{folder} holds a file kvtrace does not write there: {shown(odd[0])}")
        return names
    if not stat.S_ISDIR(os.lstat(folder).st_mode):
        raise ValueError(f"{folder} is not a folder of its own (a link?)")
    names = []
    with os.scandir(folder) as entries:
        for entry in entries:
            problem = (
                None if writes(entry.name) else f"a file kvtrace does not write there: {entry.name}"
            )
            problem = problem or entry_kind_problem(entry)
            problem = problem or next(iter(entry_metadata_problems(entry.path, entry.name)), None)
            if problem:
                raise ValueError(f"{shown_name(folder)} holds {shown_name(problem)}")
            names.append(entry.name)
            if len(names) > _MOST_STAGED_FILES:
                raise ValueError(f"{folder} holds more files than kvtrace writes")
    return sorted(names)


def _opened(path: str) -> IO[bytes]:
    """A staged file opened to read, never through a link (storage.open_regular) where local."""
    return storage.open_read(path) if storage.is_url(path) else storage.open_regular(path)[0]


def _present(path: str) -> bool:
    return storage.exists(path) if storage.is_url(path) else os.path.lexists(path)


def _small(path: str, limit: int) -> bytes:
    """A small staged file's bytes, read once; a ValueError past limit."""
    with _opened(path) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than kvtrace writes it")
    return data


def _digest(path: str, lines: bool = False) -> dict | None:
    """A staged file's sha256 (and its lines, if asked), read once in chunks; None if absent."""
    if not _present(path):
        return None
    digest, count = hashlib.sha256(), 0
    with _opened(path) as handle:
        while chunk := handle.read(_READ_BYTES):
            digest.update(chunk)
            count += chunk.count(b"\n")
    return {"sha256": digest.hexdigest(), **({"lines": count} if lines else {})}


class RowTimes:
    """The times of a night's rows, fed its JSONL shards' lines (each row begins with its
    time): how many, the first and the last on the map's clock (ms from the origin), and, for
    each span of days its unrounded time may lie in (a row's time is rounded half up to the
    granularity), how many rows. check holds the record's facts to them."""

    def __init__(self, rows_origin_ms: int, origin_ms: int, step: int) -> None:
        self._origin, self._shift, self._step = origin_ms, rows_origin_ms - origin_ms, step
        self.count, self.first, self.last = 0, None, None
        self._spans: dict[tuple[int, int], int] = {}

    def add(self, lines: bytes, name: str) -> None:
        """Whole lines of a shard (each ends with its newline)."""
        times = _leading_times(lines)
        if times is None:
            raise ValueError(f"a row of {shown(name)} does not begin with its time")
        if not len(times):
            return
        times += self._shift
        self.count += len(times)
        low, high = int(times.min()), int(times.max())
        self.first = low if self.first is None else min(self.first, low)
        self.last = high if self.last is None else max(self.last, high)
        earliest = self._origin + times - self._step // 2  # round_to's half up, undone
        first_day = earliest // DAY_MS
        # (first day, days more) as one int: a span is under 2^20 days (2100 is day 47,482)
        spans = first_day << 20 | ((earliest + self._step - 1) // DAY_MS - first_day)
        for span, n in zip(*np.unique(spans, return_counts=True)):
            key = (int(span) >> 20, (int(span) >> 20) + (int(span) & 0xFFFFF))
            self._spans[key] = self._spans.get(key, 0) + int(n)

    def check(self, earliest_ms: int | None, times: id_map.NightTimes) -> None:
        """The record's facts as the rows give them: the night's first time (rounded as the
        rows are: the manifest's id_map.time_from_ms), its last, and its requests per day,
        which must be an assignment of each row to a day its span holds (_days_fit)."""
        if earliest_ms is not None:
            first = int(round_to(np.int64(earliest_ms - self._origin), self._step))
            if first != self.first:
                raise ValueError(
                    f"its earliest time starts the night at {first}, its rows at {self.first}"
                )
        if times.last_ms != self.last:
            raise ValueError(f"its last time is {times.last_ms}, its rows' {self.last}")
        if sum(times.days.values()) != self.count or not _days_fit(self._spans, times.days):
            raise ValueError(f"its requests per day are not those of its {self.count} rows")


def _leading_times(lines: bytes) -> np.ndarray | None:
    """Each line's leading time, read with numpy (no Python object per row); None if a line
    does not begin `{"timestamp": N,` with N a decimal kvtrace writes."""
    data = np.frombuffer(lines, np.uint8)
    ends = np.flatnonzero(data == ord("\n"))
    starts = np.concatenate(([0], ends + 1))[: len(ends)]
    width = len(_ROW_START) + _TIME_DIGITS + 1
    padded = np.concatenate((data, np.zeros(width, np.uint8)))  # a short line reads zeros
    window = padded[starts[:, None] + np.arange(width)]
    digits = window[:, len(_ROW_START) :].astype(np.int64) - ord("0")
    is_digit = (digits >= 0) & (digits <= 9)
    count = np.argmin(is_digit, axis=1)  # the first byte past the digits (never all digits)
    after = window[np.arange(len(starts)), len(_ROW_START) + count]
    if not (
        (window[:, : len(_ROW_START)] == _ROW_START).all()
        and (count >= 1).all()
        and (after == ord(",")).all()
        and ((count == 1) | (digits[:, 0] != 0)).all()  # no leading zero
    ):
        return None
    # The digits as one 16-digit number (those past the terminator zeroed), then cut to count.
    digits = np.where(np.arange(_TIME_DIGITS) < count[:, None], digits[:, :_TIME_DIGITS], 0)
    return digits @ _POWERS[_TIME_DIGITS - 1 :: -1] // _POWERS[_TIME_DIGITS - count]


def _days_fit(spans: dict[tuple[int, int], int], days: dict[int, int]) -> bool:
    """Whether rows (spans: (first day, last day) -> rows) can be given one day each so that
    each day gets the count days says (the counts summing to the rows): day by day, each
    day's count taken from the rows available whose span ends first (earliest deadline first,
    which finds an assignment whenever one exists)."""
    waiting = sorted(spans.items())
    open_: list[list[int]] = []  # [last day, rows] of spans begun
    i = 0
    for day in sorted(days):
        while i < len(waiting) and waiting[i][0][0] <= day:
            heapq.heappush(open_, [waiting[i][0][1], waiting[i][1]])
            i += 1
        if open_ and open_[0][0] < day:
            return False  # rows whose span ended before this day got none
        need = days[day]
        while need and open_:
            take = min(need, open_[0][1])
            open_[0][1] -= take
            need -= take
            if not open_[0][1]:
                heapq.heappop(open_)
        if need:
            return False
    return not open_ and i == len(waiting)


def _staged_commit(
    config: AnonymizeConfig, staged: StagedRecord
) -> tuple[dict[str, list[SegmentFile]], dict[str, int]]:
    """commit_id_map's segments and ids added from a night's record; a ValueError where one is
    not what stage_night writes. The commit is derived from the run's own segment folder, not
    taken on the record's word: the record must list exactly the files the job left there, each
    checked against its checksums (the carried-files check), and the ids added are the rows
    their verified footers hold. A record damaged on its way back from the job commits
    nothing."""
    run = config.id_map
    if run is None:
        return {}, {}
    version = run.base.version + 1
    segments = {
        kind: [
            SegmentFile(id_map.segment_path(run.directory, version, run.run_id, kind, shard), *sums)
            for shard, sums in staged.segments[kind]
        ]
        for kind in KINDS
    }
    _check_run_folder(id_map.run_folder(run.directory, version, run.run_id), segments)
    segments = {kind: [_verified(segment) for segment in segments[kind]] for kind in KINDS}
    added = {kind: _added(config, kind, segments[kind]) for kind in KINDS}
    for kind in KINDS:
        if added[kind] != staged.added[kind]:
            raise ValueError(f"it says {kind} ids were added that its segment files do not hold")
    if any(added.values()) and staged.times.last_ms is None:
        raise ValueError("it adds ids for a night without a request")
    return segments, added


class StagedRecord(NamedTuple):
    """A night's record (stage_night) once each field is what kvtrace writes there, in its
    bounds: nothing more is known of it (staged_manifest, _staged_commit judge the rest)."""

    manifest: Any
    beside: Any  # staged_beside's files: compared with the folders', never read otherwise
    segments: dict[str, list[tuple[int, tuple[dict, dict, int]]]]  # by kind: shard, checksums
    added: dict[str, int]
    earliest_ms: int | None
    times: id_map.NightTimes


def _bounded(config: AnonymizeConfig, record: Any) -> StagedRecord:
    """The record's fields exactly, each of its type and in its range (without an id map, the
    record is its manifest alone), before any is used."""
    if config.id_map is None:
        _items(record, {"manifest", BESIDE})
        return StagedRecord(record["manifest"], record[BESIDE], {}, {}, None, id_map.NightTimes())
    _items(record, _RECORD_KEYS)
    segments = {
        kind: _staged_files(config, entries, kind)
        for kind, entries in _items(record["segments"], KINDS).items()
    }
    added = {kind: _whole(n, MAX_IDS) for kind, n in _items(record["added"], KINDS).items()}
    return StagedRecord(record["manifest"], record[BESIDE], segments, added, *_staged_times(record))


def _items(value: Any, keys: Iterable[str]) -> dict:
    """An object of the record with exactly the keys stage_night writes."""
    wanted = f"an object of {', '.join(sorted(keys))}"
    if type(value) is not dict:
        raise ValueError(f"{shown(value)} where {wanted} belongs")
    odd = sorted(value.keys() ^ set(keys))
    if odd:
        which = "no" if odd[0] in keys else "an unknown"
        raise ValueError(f"{which} key {odd[0][:40]!r} in {wanted}")
    return value


# The record's fields as stage_night writes them: with an id map, and without one.
_RECORD_KEYS = {"manifest", BESIDE, "segments", "added", "earliest_ms", "times"}
_ENTRY_KEYS = ("shard", "data", "index", "rows")
# A segment file's checksums as segments.parquet_checksum and checksum write them.
_DATA_KEYS, _INDEX_KEYS = ("sha256", "bytes", "footer_sha256"), ("sha256", "bytes")
_MAX_FILE_BYTES = 10**16 - 1  # the map's own bound on a listed size (map_record.CHECKSUMS)
_HEX64 = re.compile("[0-9a-f]{64}")


def _staged_files(
    config: AnonymizeConfig, entries: Any, kind: str
) -> list[tuple[int, tuple[dict, dict, int]]]:
    """Each staged segment entry of a kind: its hash shard, its checksums and its rows."""
    if type(entries) is not list or len(entries) > config.hash_shards:
        raise ValueError(f"its {kind} segment files are not a list of at most one per hash shard")
    entries = [_items(entry, _ENTRY_KEYS) for entry in entries]
    shards = [_whole(entry["shard"], config.hash_shards - 1) for entry in entries]
    if len(set(shards)) != len(shards):
        raise ValueError(f"a hash shard of {kind} twice")
    return [
        (
            shard,
            (
                _checksums(entry["data"], _DATA_KEYS),
                _checksums(entry["index"], _INDEX_KEYS),
                _whole(entry["rows"], MAX_IDS),
            ),
        )
        for shard, entry in zip(shards, entries)
    ]


def _checksums(value: Any, keys: tuple[str, ...]) -> dict:
    """A file's checksums as kvtrace writes them: digests in hex, a size within the map's."""
    sums = _items(value, keys)
    _whole(sums["bytes"], _MAX_FILE_BYTES)
    if not all(type(sums[k]) is str and _HEX64.fullmatch(sums[k]) for k in keys if k != "bytes"):
        raise ValueError(f"{shown(sums)} where a file's checksums belong")
    return sums


def _check_run_folder(folder: str, segments: dict[str, list[SegmentFile]]) -> None:
    """The files the record lists (each segment file and its index) are exactly those in the
    run's segment folder, each index of the size the record gives it, and each file no larger
    than write_segment writes for the rows the record says it holds (segments.most_bytes),
    found before a byte is read: a file left out of the record would be in no version, and a
    huge one is refused by its size."""
    listed = {
        name.rsplit("/", 1)[1]
        for kind in KINDS
        for segment in segments[kind]
        for name in (segment.path, index_path(segment.path))
    }
    found = set(storage.files_in(folder))
    if found != listed:
        odd = sorted(found ^ listed)
        raise ValueError(
            f"it does not list the files the job wrote in {folder} "
            f"({len(odd)} differ, {shown(odd[0])} first)"
        )
    for segment in (segment for kind in KINDS for segment in segments[kind]):
        with storage.open_read(index_path(segment.path)) as handle:
            size = handle.seek(0, io.SEEK_END)
        if size != segment.index["bytes"]:
            raise ValueError(
                f"it says {index_path(segment.path)} is {segment.index['bytes']} bytes, not {size}"
            )
        most = most_bytes(segment.rows)
        with storage.open_read(segment.path) as handle:
            data = handle.seek(0, io.SEEK_END)
        for path, found, bound in (
            (segment.path, data, most[0]),
            (index_path(segment.path), size, most[2]),
        ):
            if found > bound:
                raise ValueError(
                    f"{path} is {found} bytes, more than kvtrace writes for its "
                    f"{segment.rows} rows ({bound})"
                )


def _verified(segment: SegmentFile) -> SegmentFile:
    """The segment once its file matches its checksums, its rows those of its verified footer."""
    try:
        rows = check_listed(segment)
    except DamagedFile as err:  # a file no version lists: no backup of the map restores it
        raise ValueError(
            f"its checksums of {segment.path} are not the file's ({err.why})"
        ) from None
    if rows != segment.rows:
        raise ValueError(f"it says {segment.path} holds {segment.rows} rows, its footer {rows}")
    return segment


def _added(config: AnonymizeConfig, kind: str, segments: list[SegmentFile]) -> int:
    """The ids of a kind the night added, from its segment files' rows: a compacting night's
    files hold every id of the map (each id is one row), another's only the new ones."""
    added = sum(segment.rows for segment in segments)
    if config.compacts_map:
        added -= config.id_map.base.next_id[kind]
    if added < 0:
        raise ValueError(f"its {kind} segment files hold fewer rows than the map's ids")
    return added


def _staged_times(record: dict) -> tuple[int | None, id_map.NightTimes]:
    """The night's earliest time and its times, as stage_night writes them: null only for a
    night without a request."""
    earliest = record["earliest_ms"]
    times = _items(record["times"], ("days", "last_ms"))
    if type(times["days"]) is not dict or len(times["days"]) > MAX_DAYS:
        raise ValueError(f"its days are not an object of at most {MAX_DAYS}")
    days = {_day(day): _whole(n, MAX_IDS, low=1) for day, n in times["days"].items()}
    last = times["last_ms"]
    nulls = {earliest is None, not days, last is None}
    if len(nulls) != 1:
        raise ValueError("its times are not those of a night with requests, nor of one without")
    return (
        None if earliest is None else _whole(earliest, EPOCH_CEILING_MS),
        id_map.NightTimes(days, None if last is None else _whole(last, EPOCH_CEILING_MS)),
    )


def _whole(value: Any, high: int, low: int = 0) -> int:
    if not is_int(value, low, high):
        raise ValueError(f"{shown(value)} where a whole number from {low} to {high} belongs")
    return value


def _day(name: str) -> int:
    """A day as the record names it: as a map's published_days does (map_record.is_day)."""
    if not is_day(name):
        raise ValueError(f"{shown(name)} where a day's number belongs")
    return int(name)


def publish_trace(config: AnonymizeConfig, manifest: dict) -> dict:
    """The run's last step, once the id map (if any) has committed: the manifest staged, then
    published with the rest (publish_staged). Returns the manifest."""
    stage_manifest(config, manifest)
    return publish_staged(config, StagedNight(manifest))


def stage_manifest(config: AnonymizeConfig, manifest: dict) -> dict:
    """The manifest into the staging folder, the last file staged. Returns it."""
    write_json(manifest_path(config.staging), manifest)
    return manifest


def publish_staged(config: AnonymizeConfig, night: StagedNight) -> dict:
    """The staging folder, its manifest staged, in the output's place, whole; the block hashes
    after the output they belong to, never before it. One publication: a stop waits for both,
    and block hashes that cannot be published put the trace back. Run by the process that
    reports (the Beam engine's parent: anonymize_beam.run_beam), once check_staged holds the
    folders to the night it was given (the Beam engine's: what its child verified and staged).
    Returns the manifest."""
    # The measured parts joined first, while nothing is published: from the publication on,
    # settling the run's letters is renames only (publish.DeadLetterRun).
    check_staged(config, night)
    join_measured(config.dead_letter, sha256_of(canonical_json(night.manifest)))
    with publication():
        publish_folder(config.staging, config.output)
        return publish_block_hashes(config.block_hashes, config.staging, night.manifest)


def check_staged(config: AnonymizeConfig, night: StagedNight) -> None:
    """Last before the swap, from the bytes about to be published: the staged manifest is the
    night's (canonical JSON of night.manifest, never read back on the folder's word), the
    staging folder holds exactly the files it lists, each with the digest it gives (a file
    written after the manifest took its digest, a retried task's attempt still writing), and
    what is published beside it is what night.beside says (the letters, run counts and block
    hashes the launcher verified). Else a one-line JobStopped, nothing published."""
    folder, manifest = config.staging, canonical_json(night.manifest)
    try:
        if _small(manifest_path(folder), MAX_MANIFEST_BYTES) != manifest:
            raise ValueError(f"its {MANIFEST} is not the manifest the night staged")
        listed = dict(night.manifest["sha256"]) | {MANIFEST: sha256_of(manifest)}
        found = staged_files(folder, writes=listed.__contains__)
        odd = sorted(k for k in found.keys() | listed.keys() if found.get(k) != listed.get(k))
        if odd:
            raise ValueError(
                f"{shown(odd[0])} differs from what its manifest lists (written after its "
                "digest, or not listed)"
            )
        if night.beside is not None and staged_beside(config).files != night.beside:
            raise ValueError("its letters, run counts or block hashes changed since verified")
    except (OSError, ValueError) as err:
        raise JobStopped(
            f"the staged output {folder} is not what was verified ({err}); nothing was published"
        ) from None
