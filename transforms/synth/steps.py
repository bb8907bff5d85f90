"""The synthesis stage's Beam steps: `kvtrace synthesize --engine beam` as one composite
(shards.py says how the work is cut).

Files are read in parallel. Blocks go to prefix shards, where conversations are counted per
prefix; conversations go whole to conversation shards, which meet their rows' shared counts and
are reshaped there; output rows go to time buckets, are ranked, and their label prefixes and
sessions are numbered by AssignDenseIds, as anonymize numbers block hashes. Each bucket writes
its part of the output, named by its first rank.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np

from kvtrace.transforms import storage
from kvtrace.transforms.combiners import BucketTotals
from kvtrace.transforms.ids.buckets import first_offsets
from kvtrace.transforms.ids.dense_ids import ids_in_request_order, split_by
from kvtrace.transforms.ids.steps import AssignDenseIds
from kvtrace.transforms.read.trace_io import read_trace
from kvtrace.transforms.steps import CombineWith
from kvtrace.transforms.synth.output import rows_jsonl
from kvtrace.transforms.synth.shards import (
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
from kvtrace.transforms.synth.synthesize import SynthConfig

# Shards of prefixes and of conversations: each holds 1/N of the trace in one worker.
SHARDS = 64


class SynthesizeTrace(beam.PTransform):
    """Trace files in; the output's parts written to parts_dir, their paths out (one per time
    bucket, named so that name order is output order)."""

    def __init__(
        self,
        inputs: tuple[str, ...],
        parts_dir: str,
        block_size: int,
        config: SynthConfig,
        shards: int = SHARDS,
    ):
        super().__init__()
        self._inputs, self._parts_dir, self._block_size = inputs, parts_dir, block_size
        self._config, self._shards = config, shards

    def expand(self, root: beam.pvalue.PBegin) -> beam.PCollection:
        inputs, shards, block_size, config = (
            self._inputs,
            self._shards,
            self._block_size,
            self._config,
        )
        split = (
            root
            | "Files" >> beam.Create(list(range(len(inputs))))  # names need not be UTF-8
            | "Read" >> beam.FlatMap(_read_file, inputs, shards).with_outputs("visits", main="rows")
        )
        shared = (
            split.visits
            | "GroupPrefixes" >> beam.GroupByKey()
            | "SharedCounts" >> beam.FlatMap(_shared_counts_by_shard, shards)
        )
        synthesized = (
            {"rows": split.rows, "shared": shared}
            | "MeetSharedCounts" >> beam.CoGroupByKey()
            | "Reshape"
            >> beam.MapTuple(
                lambda _, groups: reshape_conversations(
                    merge_conversations(list(groups["rows"])),
                    _concat(groups["shared"]),
                    block_size,
                    config,
                )
            )
            | "ByBucket" >> beam.FlatMap(split_by_bucket)
        )
        first_ranks = synthesized | "FirstRanks" >> beam.CombineGlobally(
            CombineWith(
                BucketTotals(
                    lambda kv: [(kv[0], len(kv[1]))], functools.partial(first_offsets, start=0)
                )
            )
        )
        batches = (
            synthesized
            | "GroupBuckets" >> beam.GroupByKey()
            | "Rank"
            >> beam.Map(
                lambda kv, ranks: (ranks[kv[0]], rank_bucket(list(kv[1]), ranks[kv[0]])),
                beam.pvalue.AsSingleton(first_ranks),
            ).with_output_types(tuple[int, Synthesized])
        )
        ids = batches | "NumberBlocks" >> AssignDenseIds(label_occurrences)
        sessions = batches | "NumberSessions" >> AssignDenseIds(session_occurrences)
        return (
            {"batch": batches, "ids": ids["ids"], "sessions": sessions["ids"]}
            | "MeetIds" >> beam.CoGroupByKey()
            | "WritePart" >> beam.Map(_write_part, self._parts_dir)
        )


def _read_file(index: int, files: tuple[str, ...], shards: int) -> Iterator:
    """One file's conversations and prefix visits, the file read as pinned when the files
    were listed (files[index] carries its pin: trace_inputs)."""
    trace = read_trace([files[index]])
    trace.file_index[:] = index
    trace.files = list(files)
    conversations, visits = split_file(trace, shards)
    yield from conversations
    for shard, table in split_by(visits, (visits["lo"] % np.uint64(shards)).astype(np.int64)):
        yield beam.pvalue.TaggedOutput("visits", (shard, table))


def _shared_counts_by_shard(
    element: tuple[int, Iterable[np.ndarray]], shards: int
) -> Iterator[tuple[int, np.ndarray]]:
    counts = shared_counts(np.concatenate(list(element[1])))
    return split_by(counts, (counts["unit"] % np.uint64(shards)).astype(np.int64))


def _concat(tables: Iterable[np.ndarray]) -> np.ndarray:
    tables = list(tables)
    return np.concatenate(tables) if tables else np.empty(0, dtype=SHARED)


def _write_part(element: tuple[int, dict], parts_dir: str) -> str:
    """A bucket's rows as JSON lines, named by its first rank so the names sort in order."""
    first_rank, groups = element
    (part,) = groups["batch"]
    ids = ids_in_request_order(groups["ids"], np.diff(part.offsets))
    has_session = (part.session != None) if part.session is not None else np.zeros(len(part), bool)  # noqa: E711
    session_ids = iter(
        ids_in_request_order(groups["sessions"], has_session.astype(np.int64)).tolist()
    )
    sessions = [next(session_ids) if has else None for has in has_session.tolist()]
    path = storage.join(parts_dir, f"{first_rank:015d}.jsonl")
    with storage.create(path) as handle:
        handle.write(
            rows_jsonl(
                part.rows["ts_out"], part.rows["isl"], part.rows["osl"], ids, part.offsets, sessions
            )
        )
    return path
