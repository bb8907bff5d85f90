"""`kvtrace anonymize`: request logs in, an anonymized Mooncake trace out.

read -> parse -> render, tokenize, chain-hash -> dense ids (blocks, sessions) -> sorted shards,
plus dead letters, stats.json and manifest.json.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue
from transforms import storage
from transforms.dead_letters import (
    DAMAGED_FILE,
    DEAD_LETTER_TAG,
    DeadLetter,
    SortedRuns,
    StagedLetters,
    merge_runs,
)
from transforms.ids.dense_ids import block_keys, new_batch_id, session_keys
from transforms.ids.steps import (
    AssignDenseIds,
    ReadIdMap,
    WriteSegmentShard,
)
from transforms.encode.schemes import engine_hashes
from transforms.encode.steps import Encode
from transforms.encode.hashed_batch import HashedBatch
from transforms.ids.id_map import publish_night, segment_files_by_shard
from transforms.write.coarsen import published_requests
from transforms.write.manifest import (RecordCounts, check_not_before_origin, id_map_start,
                                       check_rejected_fraction, trace_origin_ms)
from transforms.steps import BatchByWeight, CombineWith, metered
from transforms.read.records import ParseOptions
from transforms.read.steps import ReadRecords, RouteSessions, parse_records
from transforms.write.publish import DEAD_LETTER_FILE
from transforms.write.rows import assemble_rows, request_room
from transforms.write.totals import ExportTotals, sum_totals
from transforms.write.shards import block_hashes_staging, publish_block_hashes, shard_plan
from transforms.write.steps import WriteShard

from pipelines.anonymize_config import (
    ID_BATCH_BLOCKS,
    AnonymizeConfig,
    IdMapRun,
    publish_output,
    write_stats,
)

__all__ = ["AnonymizeConfig", "AnonymizeOutputs", "IdMapRun", "build"]


class AnonymizeOutputs(NamedTuple):
    trace_files: beam.PCollection
    dead_letters: beam.PCollection  # the path of the one dead-letter file, once written
    summary: beam.PCollection  # the manifest dict, once written


def build(pipeline: beam.Pipeline, config: AnonymizeConfig) -> AnonymizeOutputs:
    read = pipeline | "Read" >> ReadRecords(config.inputs, config.parse.max_record_bytes)
    parsed = read.records | "ParseRequests" >> ParseRequests(config.parse, config.route_sessions)
    # HashedBatch elements, every later step works per batch; of the input's timestamp kind only.
    encoded = parsed["requests"] | "Encode" >> Encode(config.encode)
    earliest = (
        encoded["hashed"]
        | "EarliestInBatch" >> beam.FlatMap(HashedBatch.earliest_ms)
        | "Earliest" >> beam.CombineGlobally(min).without_defaults()
    )
    origin = beam.pvalue.AsSingleton(
        pipeline
        | "Origin" >> beam.Create([config.timestamp_origin_ms])
        | "TraceOrigin" >> beam.Map(trace_origin_ms, beam.pvalue.AsList(earliest))
    )
    # Numbered, planned and sorted on what the rows publish (coarsen.published_requests). The
    # rounding waits on the origin's side input, a stage boundary: only when there is any.
    hashed = encoded["hashed"]
    if not config.coarsening.is_identity:
        hashed = hashed | "PublishedTimes" >> beam.Map(published_requests, origin,
                                                       config.coarsening)
    batches = (
        hashed
        | "IdBatches" >> beam.ParDo(
            BatchByWeight(ID_BATCH_BLOCKS, lambda batch: len(batch.block_hashes)))
        | "NameBatches" >> beam.Map(lambda parts: (new_batch_id(), HashedBatch.concat(parts)))
    )
    blocks = _dense_ids(
        pipeline, batches, "blocks", functools.partial(block_keys, block_size=config.block_size),
        config,
    )
    sessions = _dense_ids(pipeline, batches, "sessions", session_keys, config)

    # Planned on the published minutes (ms from the origin), so only the two columns the plan
    # reads wait for the origin's side input.
    plan = beam.pvalue.AsSingleton(
        hashed
        | "RoomColumns" >> beam.Map(
            lambda batch: (batch.requests["timestamp_ms"], batch.blocks_per_request()))
        | "PublishedRoom" >> beam.Map(lambda columns, origin_ms: request_room(*columns, origin_ms),
                                      origin)
        | "PlanShards" >> beam.CombineGlobally(CombineWith(shard_plan())))
    rows = (
        {
            # Only the request columns meet the ids: the block hashes are in the lookups already
            # (their engine form rides along only when it is to be emitted).
            "requests": metered(
                batches | "RequestColumns" >> beam.MapTuple(lambda k, b: (k, (
                    b.requests, engine_hashes(b.block_hashes) if config.block_hashes else None))),
                "requests"),
            "blocks": metered(blocks["ids"], "blockIds"),
            "sessions": metered(sessions["ids"], "sessionIds"),
        }
        | "JoinIds" >> beam.CoGroupByKey()
        | "AssembleRows" >> beam.FlatMap(assemble_rows, plan, origin, config.emit_output_hashes)
    )

    letter_sources = (read[DEAD_LETTER_TAG], parsed[DEAD_LETTER_TAG], encoded[DEAD_LETTER_TAG])
    # Written where they are made, as they come (in sorted runs: SortedRuns), never gathered
    # (even a Flatten of them no step reads is held whole by the local runner): only each
    # bundle's runs and tally travel on, and one step merges the runs into the file.
    staged = beam.pvalue.AsSingleton(
        [letters | f"StageRejected{i}" >> beam.ParDo(StageLetters(config.dead_letter))
         for i, letters in enumerate(letter_sources)]
        | "AllStaged" >> beam.Flatten()
        | "SumStaged" >> beam.CombineGlobally(lambda parts: sum(parts, StagedLetters())))
    # A damaged file's unreadable rest counts as one record read and rejected, so that
    # read = exported + rejected still holds and --max-rejected-fraction sees it.
    read_letters = read[DEAD_LETTER_TAG] | "CountReadRejected" >> beam.combiners.Count.Globally()
    counts = (
        read.records
        | "CountRead" >> beam.combiners.Count.Globally()
        | "Counts" >> beam.Map(
            lambda read, read_rejected, letters: RecordCounts(
                read + read_rejected, letters.tally.count, letters.tally.lost_bytes,
                config.input_bytes),
            beam.pvalue.AsSingleton(read_letters),
            staged,
        )
        # Per reason, for the message of a run refused for too much rejected input.
        | "CheckRejected" >> beam.Map(
            lambda counts, letters: check_rejected_fraction(
                counts, config.max_rejected_fraction, dict(letters.tally.reasons)),
            staged)
        | "CheckOrigin" >> beam.Map(
            check_not_before_origin, beam.pvalue.AsList(earliest), config.timestamp_origin_ms
        )
    )
    # One file whatever the runner's parallelism or its order (sorted lines), named as the
    # local engine names it, into the run's letters staging folder (published with the run:
    # publish.DeadLetterRun); owner-only, as they hold raw prompts.
    letters_path = storage.join(config.dead_letter, DEAD_LETTER_FILE)
    letters_written = pipeline | "LettersFile" >> beam.Create([letters_path]) | (
        "MergeRejected" >> beam.Map(merge_runs, staged))

    first_shard = pipeline | "FirstShard" >> beam.Create([(0, None)])
    trace_files = (
        (metered(rows, "rows"), first_shard)
        | "WithFirstShard" >> beam.Flatten()
        | "GroupByShard" >> beam.GroupByKey()
        | "WriteShards" >> beam.ParDo(
            WriteShard(config.staging, config.coarsening,
                       block_hashes_staging(config.block_hashes, config.staging)),
            plan,
            origin,
            beam.pvalue.AsSingleton(counts),  # the gate: written only once counts pass
        )
    )
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
    manifest = pipeline | "Summary" >> beam.Create([None]) | "WriteStats" >> beam.Map(
        lambda _, files, counts, totals, unique, damaged, earliest_ms, origin_ms: write_stats(
            config, files, counts, totals, unique, damaged,
            id_map_start(config.id_map.base.next_id if config.id_map else None, earliest_ms,
                         origin_ms, config.coarsening.timestamp_ms)),
        beam.pvalue.AsList(trace_files),
        beam.pvalue.AsSingleton(counts),
        beam.pvalue.AsSingleton(totals),
        beam.pvalue.AsSingleton(blocks["unique"]),
        beam.pvalue.AsSingleton(damaged_files),
        beam.pvalue.AsList(earliest),
        origin,
    )
    if config.id_map:
        id_map = config.id_map
        # The output is published once the map version is.
        manifest = manifest | "PublishIdMap" >> beam.Map(
            _publish_then_pass_on,
            id_map.directory,
            id_map.base,
            config.salt,
            id_map.marks,
            config.compacts_map,
            config.hash_shards,
            beam.pvalue.AsList(blocks["segment_files"]),
            beam.pvalue.AsList(sessions["segment_files"]),
            beam.pvalue.AsSingleton(blocks["added_count"], default_value=0),
            beam.pvalue.AsSingleton(sessions["added_count"], default_value=0),
            beam.pvalue.AsList(earliest),
        )
    # Published once the letters are written: they are published with the output; the block
    # hashes after it.
    summary = manifest | "PublishOutput" >> beam.Map(
        lambda m, _: publish_block_hashes(config.block_hashes, config.staging,
                                          publish_output(config, m)),
        beam.pvalue.AsList(letters_written))
    return AnonymizeOutputs(trace_files, letters_written, summary)


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
        letters = ((parsed[DEAD_LETTER_TAG], routed[DEAD_LETTER_TAG])
                   | "AllRejected" >> beam.Flatten())
        return {"requests": routed.requests, DEAD_LETTER_TAG: letters}


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


def _dense_ids(
    pipeline: beam.Pipeline, batches: beam.PCollection, kind: str, keys, config: AnonymizeConfig
) -> dict[str, beam.PCollection]:
    """Dense ids for one kind of key (blocks or sessions), extending the id map when there is
    one: its rows are joined in, and the newly numbered ones written as a new segment."""
    label = kind[:-1].capitalize()  # BlockIds, SessionIds
    if config.id_map is None:
        return batches | f"{label}Ids" >> AssignDenseIds(keys, config.hash_shards)
    id_map = config.id_map
    base = id_map.base
    inputs = {"batches": batches}
    runs = pipeline | f"{label}FoldedFiles" >> beam.Create([])
    segments = base.segment_files(id_map.directory, kind)
    if segments and config.reshards_map:
        inputs["map_rows"] = pipeline | f"Read{label}Map" >> ReadIdMap(segments, config.hash_shards)
    elif segments:
        inputs["map_files"] = pipeline | f"{label}MapFiles" >> beam.Create(
            [(shard, file) for shard, files in segment_files_by_shard(segments).items()
             for file in files])
        if config.compacts_map:  # each shard's files fold into its new one
            runs = inputs["map_files"]
    ids = inputs | f"{label}Ids" >> AssignDenseIds(keys, config.hash_shards, base.next_id[kind])
    ids["segment_files"] = (
        {"added": ids["added"], "runs": runs}
        | f"{label}SegmentShards" >> beam.CoGroupByKey()
        | f"Write{label}Segment" >> beam.ParDo(
            WriteSegmentShard(id_map.directory, base.version + 1, id_map.run_id, kind)
        )
    )
    return ids


def _publish_then_pass_on(manifest: dict, *publish_args: Any) -> dict:
    """The manifest as published: a rerun's names the start the map recorded for its night."""
    return publish_night(manifest, *publish_args)
