"""`kvtrace synthesize --engine beam`: the local engine's output, byte for byte, from traces
beyond one machine (transforms/synth/shards.py says how the work is cut).

Files are read in parallel. Blocks go to prefix shards, where conversations are counted per
prefix; conversations go whole to conversation shards, which meet their rows' shared counts and
are reshaped there; output rows go to time buckets, are ranked, and their label prefixes and
sessions are numbered by AssignDenseIds, as anonymize numbers block hashes. Each bucket writes
its part of the output; the launcher concatenates the parts in order.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator

import apache_beam as beam
import numpy as np
from pipelines.synthesize_local import SynthesizeConfig
from transforms import storage
from transforms.ids.buckets import first_offsets
from transforms.ids.dense_ids import ids_in_request_order, split_by
from transforms.ids.steps import AssignDenseIds
from transforms.read.trace_io import read_trace
from transforms.storage import is_url
from transforms.synth.output import rows_jsonl
from transforms.synth.summary import before_and_after
from transforms.synth.shards import (
    SHARED,
    Synthesized,
    label_occurrences,
    merge_conversations,
    rank_bucket,
    reshape_conversations,
    session_occurrences,
    shared_counts,
    split_by_bucket,
    split_file,
)
from transforms.synth.synthesize import SynthConfig

_LOG = logging.getLogger("kvtrace")

# Shards of prefixes and of conversations: each holds 1/N of the trace in one worker.
SHARDS = 64


def build(pipeline: beam.Pipeline, inputs: tuple[str, ...], parts_dir: str, block_size: int,
          config: SynthConfig, shards: int = SHARDS) -> beam.PCollection:
    """The pipeline; its output is the paths of the parts written (one per time bucket)."""
    split = (
        pipeline
        | "Files" >> beam.Create(list(enumerate(inputs)))
        | "Read" >> beam.FlatMap(_read_file, inputs, shards).with_outputs("visits", main="rows")
    )
    shared = (
        split.visits
        | "GroupPrefixes" >> beam.GroupByKey()
        | "SharedCounts" >> beam.FlatMap(lambda kv: split_by(
            counts := shared_counts(np.concatenate(list(kv[1]))),
            (counts["unit"] % np.uint64(shards)).astype(np.int64)))
    )
    synthesized = (
        {"rows": split.rows, "shared": shared}
        | "MeetSharedCounts" >> beam.CoGroupByKey()
        | "Reshape" >> beam.MapTuple(lambda _, groups: reshape_conversations(
            merge_conversations(list(groups["rows"])), _concat(groups["shared"]), block_size,
            config))
        | "ByBucket" >> beam.FlatMap(split_by_bucket)
    )
    first_ranks = (
        synthesized
        | "BucketSizes" >> beam.MapTuple(lambda bucket, part: (bucket, len(part)))
        | "SumPerBucket" >> beam.CombinePerKey(sum)
        | "AllSizes" >> beam.combiners.ToDict()
        | "FirstRanks" >> beam.Map(first_offsets)
    )
    batches = (
        synthesized
        | "GroupBuckets" >> beam.GroupByKey()
        | "Rank" >> beam.Map(
            lambda kv, ranks: (ranks[kv[0]], rank_bucket(list(kv[1]), ranks[kv[0]])),
            beam.pvalue.AsSingleton(first_ranks)).with_output_types(tuple[int, Synthesized])
    )
    ids = batches | "NumberBlocks" >> AssignDenseIds(label_occurrences)
    sessions = batches | "NumberSessions" >> AssignDenseIds(session_occurrences)
    return (
        {"batch": batches, "ids": ids["ids"], "sessions": sessions["ids"]}
        | "MeetIds" >> beam.CoGroupByKey()
        | "WritePart" >> beam.Map(_write_part, parts_dir)
    )


def _read_file(indexed: tuple[int, str], files: tuple[str, ...], shards: int) -> Iterator:
    index, path = indexed
    trace = read_trace([path])
    trace.file_index[:] = index
    trace.files = list(files)
    conversations, visits = split_file(trace, shards)
    yield from conversations
    for shard, table in split_by(visits, (visits["lo"] % np.uint64(shards)).astype(np.int64)):
        yield beam.pvalue.TaggedOutput("visits", (shard, table))


def _concat(tables) -> np.ndarray:
    tables = list(tables)
    return np.concatenate(tables) if tables else np.empty(0, dtype=SHARED)


def _write_part(element: tuple[int, dict], parts_dir: str) -> str:
    """A bucket's rows as JSON lines, named by its first rank so the names sort in order."""
    first_rank, groups = element
    (part,) = groups["batch"]
    ids = ids_in_request_order(groups["ids"], np.diff(part.offsets))
    has_session = (part.session != None) if part.session is not None else np.zeros(len(part), bool)  # noqa: E711
    session_ids = iter(ids_in_request_order(groups["sessions"], has_session.astype(np.int64)).tolist())
    sessions = [next(session_ids) if has else None for has in has_session.tolist()]
    path = storage.join(parts_dir, f"{first_rank:015d}.jsonl")
    with storage.create(path) as handle:
        handle.write(rows_jsonl(part.rows["ts_out"], part.rows["isl"], part.rows["osl"], ids,
                                part.offsets, sessions))
    return path


def run_synthesize_beam(config: SynthesizeConfig, beam_flags: list[str]) -> dict:
    """The Beam engine (embedded runner unless --runner says otherwise). --num-requests draws
    from the whole prefix tree at once, so it stays on the local engine."""
    from transforms.errors import ConfigError
    from pipelines.analyze_local import AnalyzeConfig
    from pipelines.analyze_beam import analyze_beam
    from pipelines.runner import is_remote, pipeline_options, run

    if config.synth.num_requests is not None:
        raise ConfigError("--num-requests needs the whole trace in one place: use --engine local")
    config.synth.check()
    options = pipeline_options(beam_flags)
    remote = is_remote(options)
    if remote and not is_url(config.output):
        raise ConfigError("--engine beam on a remote runner needs -o on a filesystem its "
                          "workers can write (gs://, s3://)")
    started = time.perf_counter()
    parts_dir = config.output + ".parts"
    run(lambda p: build(p, config.inputs, parts_dir, config.block_size, config.synth), options)
    parts = storage.match(storage.join(parts_dir, "*.jsonl"))
    with storage.create(config.output) as handle:
        for part in parts:  # named by first rank: name order is output order
            with storage.open_read(part) as piece:
                shutil.copyfileobj(piece, handle)
    storage.delete(parts)
    if not is_url(parts_dir) and os.path.isdir(parts_dir):  # an empty trace writes no part
        os.rmdir(parts_dir)
    _LOG.info("synthesized %s from %d file(s) in %.1f s", config.output, len(config.inputs),
              time.perf_counter() - started)
    # Remote runners write their reports where the launcher can read them back.
    reports = (parts_dir + "-before", parts_dir + "-after") if remote else (None, None)
    before = analyze_beam(AnalyzeConfig(config.inputs, config.block_size), beam_flags, reports[0])
    after = analyze_beam(AnalyzeConfig((config.output,), config.block_size), beam_flags,
                         reports[1])
    return before_and_after(before, after)
