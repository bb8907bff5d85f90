"""`kvtrace anonymize`: request logs in, an anonymized Mooncake trace out.

read -> parse -> render, tokenize, chain-hash -> dense ids (blocks, sessions) -> sorted shards,
plus dead letters, stats.json and manifest.json. From the numbering on, each step runs one
function of the night's end every engine shares (anonymize_night.py).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from kvtrace.pipelines import child_process
from kvtrace.pipelines.anonymize_config import ID_BATCH_BLOCKS, AnonymizeConfig
from kvtrace.pipelines.anonymize_night import (
    counts_from_night,
    finish_staged,
    kind_keys,
    map_reading,
    night_manifest,
    night_times,
    pass_gate,
    publish_staged,
    published_days,
    rows_origin_ms,
    run_segments,
    stage_night,
    stage_refusal,
    write_dead_letters,
    write_stats,
)
from kvtrace.pipelines.runner import pipeline_options, run, stop_grace_s
from kvtrace.transforms.dead_letters import (
    DAMAGED_FILE,
    DEAD_LETTER_TAG,
    DeadLetter,
    SortedRuns,
    StagedLetters,
)
from kvtrace.transforms.encode.hashed_batch import HashedBatch
from kvtrace.transforms.encode.schemes import engine_hashes
from kvtrace.transforms.encode.steps import Encode
from kvtrace.transforms.encode.timestamp_kinds import kind_counts, sum_kind_counts
from kvtrace.transforms.ids.dense_ids import new_batch_id
from kvtrace.transforms.ids.id_map import NightTimes, segment_files_by_shard
from kvtrace.transforms.ids.segments import SegmentFile
from kvtrace.transforms.ids.steps import AssignDenseIds, ReadIdMap, WriteSegmentShard
from kvtrace.transforms.read.records import ParseOptions
from kvtrace.transforms.read.steps import JoinBatchHalves, ReadRecords, RouteSessions, parse_records
from kvtrace.transforms.steps import REFUSED_TAG, BatchByWeight, CombineWith, metered, verdict
from kvtrace.transforms.write.coarsen import published_requests
from kvtrace.transforms.write.manifest import trace_origin_ms
from kvtrace.transforms.write.rows import assemble_rows, request_room
from kvtrace.transforms.write.shards import block_hashes_staging, shard_plan
from kvtrace.transforms.write.steps import NumberParents, WriteShard
from kvtrace.transforms.write.totals import ExportTotals, sum_totals

__all__ = ["AnonymizeConfig", "AnonymizeOutputs", "build", "run_beam"]


def run_beam(config: AnonymizeConfig, flags: Sequence[str]) -> None:
    """The night run on Beam, in a child process (child_process.run_in_child): Beam's local
    runner tokenizes in the process it runs in, and a native abort there must not be the
    CLI's silent death. The child stages the whole output and returns its manifest; this
    process, which holds the output's lock and answers a stop, publishes it, once the child's
    word of success has arrived whole: the process that reports is the one that publishes, so
    a child that dies or is stopped has published nothing (the command removes its staging)."""
    with run_segments(config):  # whatever the child wrote of the map's segments, and left
        manifest = child_process.run_in_child(
            functools.partial(_run_here, config, list(flags)),
            child_process.UNWIND_S + stop_grace_s(flags),
        )
    publish_staged(config, manifest)


def _run_here(config: AnonymizeConfig, flags: list[str]) -> dict:
    """In the child, the launcher on every runner: the pipeline run, which stages the output
    and the night's record; once the job has finished (run returns only then), the id map's
    commit and the manifest staged here (anonymize_night.finish_staged), never in a step,
    which on a remote runner runs where no one hears it. The manifest returned."""
    run(lambda pipeline: build(pipeline, config), pipeline_options(flags))
    return finish_staged(config)


class AnonymizeOutputs(NamedTuple):
    trace_files: beam.PCollection
    dead_letters: beam.PCollection  # how many letters the one dead-letter file holds, once written
    summary: beam.PCollection  # the night's record (anonymize_night.stage_night), once staged


def build(pipeline: beam.Pipeline, config: AnonymizeConfig) -> AnonymizeOutputs:
    read = pipeline | "Read" >> ReadRecords(
        config.inputs, config.parse.max_record_bytes, config.parse.withholds_letters
    )
    # Each pair of an OpenAI Batch input line and output line is one record from here on.
    joined = read.records | "JoinBatch" >> JoinBatchHalves(config.parse)
    records = joined["records"]
    parsed = records | "ParseRequests" >> ParseRequests(config.parse, config.route_sessions)
    # HashedBatch elements, every later step works per batch; of the input's timestamp kind only.
    encoded = parsed["requests"] | "Encode" >> Encode(
        config.encode,
        established=published_days(config),
        withhold=config.parse.withholds_letters,
        refuses=True,
    )
    earliest = (
        encoded["hashed"]
        | "EarliestInBatch" >> beam.FlatMap(lambda batch: _present(batch.earliest_ms()))
        | "Earliest" >> beam.CombineGlobally(min).without_defaults()
    )
    earliest_ms = beam.pvalue.AsSingleton(earliest, default_value=None)  # None: no request
    origin_ms = (
        pipeline
        | "Origin" >> beam.Create([config.timestamp_origin_ms])
        | "TraceOrigin" >> beam.Map(trace_origin_ms, earliest_ms)
    )
    origin = beam.pvalue.AsSingleton(origin_ms)
    # What the rows count from: the origin, or the night's own start (--time-origin night).
    rows_origin = (
        beam.pvalue.AsSingleton(
            origin_ms
            | "RowsOrigin"
            >> beam.Map(lambda ms, earliest: rows_origin_ms(config, ms, earliest), earliest_ms)
        )
        if counts_from_night(config)
        else origin
    )
    # Numbered, planned and sorted on what the rows publish (coarsen.published_requests). The
    # rounding waits on the origin's side input, a stage boundary: only when there is any.
    hashed = encoded["hashed"]
    if not config.coarsening.is_identity:
        hashed = hashed | "PublishedTimes" >> beam.Map(
            published_requests, origin, config.coarsening
        )
    batches = (
        hashed
        | "IdBatches"
        >> beam.ParDo(BatchByWeight(ID_BATCH_BLOCKS, lambda batch: len(batch.block_hashes)))
        | "NameBatches" >> beam.Map(lambda parts: (new_batch_id(), HashedBatch.concat(parts)))
    )
    # The night's end (anonymize_night.py), each step one of its functions.
    blocks = batches | "BlockIds" >> NumberIds(config, "blocks")
    sessions = batches | "SessionIds" >> NumberIds(config, "sessions")
    plan = beam.pvalue.AsSingleton(hashed | "PlanShards" >> PlanShards(rows_origin))
    rows = (
        {
            # Only the request columns meet the ids: the block hashes are in the lookups already
            # (their engine form rides along only when it is to be emitted).
            "requests": metered(
                batches
                | "RequestColumns"
                >> beam.MapTuple(
                    lambda k, b: (
                        k,
                        (
                            b.requests,
                            engine_hashes(b.block_hashes) if config.block_hashes else None,
                            b.links if config.emit_parents else None,
                        ),
                    )
                ),
                "requests",
            ),
            "blocks": metered(blocks["ids"], "blockIds"),
            "sessions": metered(sessions["ids"], "sessionIds"),
        }
        | "JoinIds" >> beam.CoGroupByKey()
        | "AssembleRows"
        >> beam.FlatMap(assemble_rows, plan, rows_origin, config.emit_output_hashes)
    )

    letter_sources = (
        read[DEAD_LETTER_TAG],
        joined[DEAD_LETTER_TAG],
        parsed[DEAD_LETTER_TAG],
        encoded[DEAD_LETTER_TAG],
    )
    # Written where they are made, as they come (in sorted runs: SortedRuns), never gathered
    # (even a Flatten of them no step reads is held whole by the local runner): only each
    # bundle's runs and tally travel on, and one step merges the runs into the file.
    staged = beam.pvalue.AsSingleton(
        [
            letters | f"StageRejected{i}" >> beam.ParDo(StageLetters(config.dead_letter))
            for i, letters in enumerate(letter_sources)
        ]
        | "AllStaged" >> beam.Flatten()
        | "SumStaged" >> beam.CombineGlobally(lambda parts: sum(parts, StagedLetters()))
    )
    # A damaged file's unreadable rest counts as one record read and rejected, so that
    # read = exported + rejected still holds and --max-rejected-fraction sees it; so does each
    # Batch line that pairs with none (a pair is one record, counted among the records).
    read_letters = (
        (read[DEAD_LETTER_TAG], joined[DEAD_LETTER_TAG])
        | "ReadRejected" >> beam.Flatten()
        # a Parquet file's share (read/sources.RowShare) is tallied, no record
        | "RecordsRejected" >> beam.Filter(lambda letter: letter.share is None)
        | "CountReadRejected" >> beam.combiners.Count.Globally()
    )
    gated = (
        records
        | "CountRead" >> beam.combiners.Count.Globally()
        | "PassGate"
        >> beam.FlatMap(
            lambda read, read_rejected, letters, earliest_ms: verdict(
                lambda: [
                    pass_gate(
                        config,
                        read + read_rejected,
                        letters.tally,
                        earliest_ms,
                        config.timestamp_origin_ms,
                    )
                ]
            ),
            beam.pvalue.AsSingleton(read_letters),
            staged,
            earliest_ms,
        ).with_outputs(REFUSED_TAG, main="counts")
    )
    counts = beam.pvalue.AsSingleton(gated.counts, default_value=None)  # None: refused
    # One file whatever the runner's parallelism or its order (sorted lines), named as the
    # local engine names it, into the run's letters staging folder (published with the run:
    # publish.DeadLetterRun); owner-only, as they hold raw prompts. The folder travels with
    # the step, as every path a step needs does (ReadRecords' ranges): Beam carries text
    # between steps as UTF-8, and a Linux name need not be.
    letters_written = (
        pipeline
        | "LettersFolder" >> beam.Create([None])
        | "WriteDeadLetters" >> beam.Map(lambda _, staged: _write_letters(config, staged), staged)
    )

    if config.emit_parents:  # ranks need each shard's rows whole: sorted once, here
        rows = rows | "NumberParents" >> NumberParents()
    written = rows | "WriteShards" >> WriteShards(config, plan, rows_origin, counts)
    trace_files = written.files
    totals = (
        hashed
        | "BatchTotals" >> beam.Map(ExportTotals.of_batch, config.coarsening)
        | "SumTotals" >> beam.CombineGlobally(sum_totals)
    )
    damaged_files = (
        read[DEAD_LETTER_TAG]
        | "DamagedFiles" >> beam.Filter(lambda letter: letter.reason == DAMAGED_FILE)
        | "CountDamaged" >> beam.combiners.Count.Globally()
    )
    stats = gated.counts | "WriteStats" >> beam.Map(
        lambda counts, totals, unique, damaged: write_stats(
            config, counts, totals, unique, damaged
        ),
        beam.pvalue.AsSingleton(totals),
        beam.pvalue.AsSingleton(blocks["unique"]),
        beam.pvalue.AsSingleton(damaged_files),
    )
    manifest = stats | "NightManifest" >> beam.Map(
        lambda stats, files, earliest_ms, origin_ms: night_manifest(
            config, files, stats, earliest_ms, origin_ms
        ),
        beam.pvalue.AsList(trace_files),
        earliest_ms,
        origin,
    )
    commit: tuple = ()  # what the id map's commit takes, if any
    if config.id_map:  # the output is published once the map version is
        days = (
            encoded["hashed"]
            | "NightDays" >> beam.Map(kind_counts)
            | "SumNightDays" >> beam.CombineGlobally(sum_kind_counts)
        )
        latest = (
            hashed
            | "LatestInBatch" >> beam.FlatMap(lambda batch: _present(_latest_ms(batch)))
            | "Latest" >> beam.CombineGlobally(max).without_defaults()
        )
        times = days | "NightTimes" >> beam.Map(
            lambda days, latest_ms, origin_ms: night_times(
                days, origin_ms if latest_ms is None else latest_ms, origin_ms
            ),
            beam.pvalue.AsSingleton(latest, default_value=None),
            origin,
        )
        commit = (
            beam.pvalue.AsList(blocks["segment_files"]),
            beam.pvalue.AsList(sessions["segment_files"]),
            beam.pvalue.AsSingleton(blocks["added_count"], default_value=0),
            beam.pvalue.AsSingleton(sessions["added_count"], default_value=0),
            earliest_ms,
            beam.pvalue.AsSingleton(times),
        )
    # Staged once the letters are written, the output's last file: the launcher commits the
    # map's version (if any), stages the manifest and publishes (run_beam), the job done; or
    # raises the night's refusal, which a step made a verdict of (verdict), never a raise.
    refusals = (
        encoded[REFUSED_TAG],
        gated[REFUSED_TAG],
        written[REFUSED_TAG],
    ) | "Refusals" >> beam.Flatten()
    summary = (
        pipeline
        | "NightEnd" >> beam.Create([None])
        | "StageNight"
        >> beam.Map(
            _stage_night,
            config,
            beam.pvalue.AsList(manifest),
            beam.pvalue.AsList(refusals),
            beam.pvalue.AsList(letters_written),
            *commit,
        )
    )
    return AnonymizeOutputs(trace_files, letters_written, summary)


def _write_letters(config: AnonymizeConfig, staged: StagedLetters) -> int:
    """The one dead-letter file written; out, how many letters it holds (not its path, which
    Beam could not carry to the next step when it is not UTF-8)."""
    write_dead_letters(config.dead_letter, (), staged)
    return staged.tally.count


class ParseRequests(beam.PTransform):
    """(source, record) in; Requests out ("requests"), each session's on one worker when
    routed (--route-sessions), and the records that are not requests as dead letters
    (DEAD_LETTER_TAG)."""

    def __init__(self, options: ParseOptions, route_sessions: bool):
        super().__init__()
        self._options = options
        self._route_sessions = route_sessions

    def expand(self, records: beam.PCollection) -> dict[str, beam.PCollection]:
        parsed = parse_records(records, self._options)
        if not self._route_sessions:
            return {"requests": parsed.requests, DEAD_LETTER_TAG: parsed[DEAD_LETTER_TAG]}
        routed = parsed.requests | "RouteSessions" >> RouteSessions(self._options)
        letters = (
            parsed[DEAD_LETTER_TAG],
            routed[DEAD_LETTER_TAG],
        ) | "AllRejected" >> beam.Flatten()
        return {"requests": routed.requests, DEAD_LETTER_TAG: letters}


class NumberIds(beam.PTransform):
    """anonymize_night.number_ids and write_segments on workers: dense ids for one kind of key
    (blocks or sessions), extending the id map when there is one (its rows joined in as
    map_reading says), the newly numbered ones written as a new segment."""

    def __init__(self, config: AnonymizeConfig, kind: str):
        super().__init__()
        self._config, self._kind = config, kind

    def expand(self, batches: beam.PCollection) -> dict[str, beam.PCollection]:
        config, kind = self._config, self._kind
        keys = kind_keys(config)[kind]
        reading = map_reading(config, kind)
        if reading is None:
            return batches | "Assign" >> AssignDenseIds(keys, config.hash_shards)
        inputs = {"batches": batches}
        runs = batches.pipeline | "FoldedFiles" >> beam.Create([])
        if reading.segments and reading.whole:
            inputs["map_rows"] = batches.pipeline | "ReadMap" >> ReadIdMap(
                reading.segments, config.hash_shards
            )
        elif reading.segments:
            inputs["map_files"] = batches.pipeline | "MapFiles" >> beam.Create(
                [
                    (shard, file)
                    for shard, files in segment_files_by_shard(reading.segments).items()
                    for file in files
                ]
            )
            if reading.folds:  # each shard's files fold into its new one
                runs = inputs["map_files"]
        ids = inputs | "Assign" >> AssignDenseIds(keys, config.hash_shards, reading.next_id)
        run = config.id_map
        ids["segment_files"] = (
            {"added": ids["added"], "runs": runs}
            | "SegmentShards" >> beam.CoGroupByKey()
            | "WriteSegment"
            >> beam.ParDo(WriteSegmentShard(run.directory, run.base.version + 1, run.run_id, kind))
        )
        return ids


class PlanShards(beam.PTransform):
    """The plan anonymize_night.write_shards makes: shards by published minute, planned on the
    published minutes (ms from the origin), so only the two columns the plan reads wait for the
    origin's side input."""

    def __init__(self, origin: beam.pvalue.AsSingleton):
        super().__init__()
        self._origin = origin

    def expand(self, hashed: beam.PCollection) -> beam.PCollection:
        return (
            hashed
            | "RoomColumns"
            >> beam.Map(lambda batch: (batch.requests["timestamp_ms"], batch.blocks_per_request()))
            | "PublishedRoom"
            >> beam.Map(lambda columns, origin_ms: request_room(*columns, origin_ms), self._origin)
            | "Plan" >> beam.CombineGlobally(CombineWith(shard_plan()))
        )


class WriteShards(beam.PTransform):
    """anonymize_night.write_shards on workers: rows grouped by output shard, each shard written
    by one worker once the gate's counts have passed; shard 0 always exists. Out: each file
    written, with its sha256."""

    def __init__(
        self,
        config: AnonymizeConfig,
        plan: beam.pvalue.AsSingleton,
        origin: beam.pvalue.AsSingleton,
        counts: beam.pvalue.AsSingleton,
    ):
        super().__init__()
        self._config, self._plan, self._origin, self._counts = config, plan, origin, counts

    def expand(self, rows: beam.PCollection) -> beam.PCollection:
        config = self._config
        first_shard = rows.pipeline | "FirstShard" >> beam.Create([(0, None)])
        return (
            (metered(rows, "rows"), first_shard)
            | "WithFirstShard" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "Write"
            >> beam.ParDo(
                GatedShard(
                    config.staging,
                    config.coarsening,
                    block_hashes_staging(config.block_hashes, config.staging),
                    config.dead_letter,
                ),
                self._plan,
                self._origin,
                self._counts,
            ).with_outputs(REFUSED_TAG, main="files")
        )


class GatedShard(WriteShard):
    """WriteShard once the gate has passed (its counts; None: the night was refused, nothing is
    written), its refusal of a row (write_shard's) a verdict."""

    def process(
        self, element: tuple[int, Any], plan: Any, origin: int, gate: object
    ) -> Iterator[Any]:
        if gate is not None:
            yield from verdict(lambda: super(GatedShard, self).process(element, plan, origin, gate))


class StageLetters(beam.DoFn):
    """Dead letters in, written as they come into sorted runs in the run's letters staging
    folder; out, once per bundle, the runs and their tally (StagedLetters)."""

    def __init__(self, folder: str):
        self._folder = folder

    def start_bundle(self) -> None:
        self._runs = SortedRuns(self._folder)

    def process(self, letter: DeadLetter) -> None:
        self._runs.add(letter)

    def finish_bundle(self) -> Iterator[WindowedValue]:
        yield WindowedValue(self._runs.close(), GlobalWindow().max_timestamp(), [GlobalWindow()])


def _stage_night(
    _: None,
    config: AnonymizeConfig,
    manifests: list[dict],
    refusals: list[bytes],
    letters_written: list[int],
    block_files: Sequence[SegmentFile] = (),
    session_files: Sequence[SegmentFile] = (),
    added_blocks: int = 0,
    added_sessions: int = 0,
    earliest_ms: int | None = None,
    times: NightTimes = NightTimes(),
) -> dict:
    """The night's record staged for the launcher (anonymize_night.stage_night), once the
    letters are written (letters_written: waited for, not read); without an id map, its
    manifest alone. A night refused (refusals: steps' verdicts) is staged as its refusal, the
    first in order, whatever the runner's order (stage_refusal)."""
    if refusals:  # then no manifest: the gate refused, or a shard, which the manifest awaits
        return stage_refusal(config, min(refusals).decode("utf-8", "surrogateescape"))
    return stage_night(
        config,
        manifests[0],
        {"blocks": list(block_files), "sessions": list(session_files)},
        {"blocks": added_blocks, "sessions": added_sessions},
        earliest_ms,
        times,
    )


def _latest_ms(batch: HashedBatch) -> int | None:
    """The batch's latest (published) request time; None for an empty batch."""
    timestamps = batch.requests["timestamp_ms"]
    return int(timestamps.max()) if len(timestamps) else None


def _present(value: int | None) -> list[int]:
    """An optional value as the elements Beam carries: none, or the one."""
    return [] if value is None else [value]
