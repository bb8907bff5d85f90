"""The Beam steps of reading: file ranges spread over workers, OpenAI Batch files' lines joined
by custom_id, records parsed into Requests, and, when asked, each session's requests routed to
one worker."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

from kvtrace.transforms.dead_letters import DEAD_LETTER_TAG, DeadLetter
from kvtrace.transforms.read.batch_join import Half, batch_half, join_halves
from kvtrace.transforms.read.records import ParseOptions
from kvtrace.transforms.read.routing import Routed, arrived, route_key, routed
from kvtrace.transforms.read.sources import (
    FileRange,
    file_ranges,
    parse_one,
    read_range,
    stored_bytes,
)
from kvtrace.transforms.steps import tagged

_LOG = logging.getLogger("kvtrace")
PROGRESS_INTERVAL_S = 30.0


class ReadFileRange(beam.DoFn):
    """A range's index in ranges in; (source, record) out, and a dead letter for each oversized
    record and each file that breaks off (the records before the break still go out). Beam
    carries text between steps as UTF-8, and a Linux name need not be: the ranges travel with
    the step (pickled whole), their index between steps, and `source` leaves it as read_range
    shows it (dead_letters.shown_name), as the local engine's letters show it. Each range read
    counts its bytes as stored in the metric kvtrace/stored_bytes_read (the runner's console
    sums the workers'), and each worker logs its own at most every PROGRESS_INTERVAL_S."""

    def __init__(
        self,
        ranges: Sequence[FileRange],
        max_record_bytes: int,
        range_bytes: Sequence[int],
        withhold: bool = False,
    ):
        self._ranges = list(ranges)
        self._max_record_bytes = max_record_bytes
        self._range_bytes = list(range_bytes)
        self._withhold = withhold

    def setup(self) -> None:
        self._stored_read = Metrics.counter("kvtrace", "stored_bytes_read")
        self._read_here = 0
        self._logged_at = time.monotonic()

    def process(self, index: int) -> Iterator[Any]:
        for item in read_range(
            self._ranges[index], self._max_record_bytes, withhold=self._withhold
        ):
            yield tagged(item) if isinstance(item, DeadLetter) else item
        self._count_read(self._range_bytes[index])

    def _count_read(self, stored: int) -> None:
        self._stored_read.inc(stored)
        self._read_here += stored
        if time.monotonic() - self._logged_at >= PROGRESS_INTERVAL_S:
            self._logged_at = time.monotonic()
            _LOG.info(
                "this worker has read %.1f of the input's %.1f MB as stored",
                self._read_here / 1e6,
                sum(self._range_bytes) / 1e6,
            )


class ReadRecords(beam.PTransform):
    """(path, size) of every input file in; (source file, record) out, a record being a JSONL
    line's bytes or a Parquet row's dict; dead letters for oversized records and damaged
    files under DEAD_LETTER_TAG (withhold: as read_range's). Blank lines are not records."""

    def __init__(
        self, files: Sequence[tuple[str, int]], max_record_bytes: int, withhold: bool = False
    ):
        super().__init__()
        self._files = list(files)
        self._max_record_bytes = max_record_bytes
        self._withhold = withhold

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.pvalue.DoOutputsTuple:
        sized = [(r, size) for path, size in self._files for r in file_ranges(path, size)]
        ranges = [r for r, _ in sized]
        range_bytes = [stored_bytes(r, size) for r, size in sized]
        return (
            pipeline
            | "Ranges" >> beam.Create(range(len(ranges)))
            | "SpreadRanges" >> beam.Reshuffle()
            | "ReadRanges"
            >> beam.ParDo(
                ReadFileRange(ranges, self._max_record_bytes, range_bytes, self._withhold)
            ).with_outputs(DEAD_LETTER_TAG, main="records")
        )


HALVES_TAG = "batch_halves"


class SetAsideHalves(beam.DoFn):
    """(source, record) in; the lines of OpenAI Batch files out under HALVES_TAG, keyed by
    custom_id (batch_join.batch_half), every other record as it came."""

    def __init__(self, options: ParseOptions):
        self._options = options

    def process(self, element: tuple[str, Any]) -> Iterator[Any]:
        half = batch_half(element[1], self._options)
        if half is None:
            yield element
        else:
            yield beam.pvalue.TaggedOutput(HALVES_TAG, (half[0], Half(half[1], *element, half[2])))


class JoinGroup(beam.DoFn):
    """(custom_id, its lines) in; the joined record (source, line) or dead letters out
    (batch_join.join_halves)."""

    def process(self, element: tuple[str, Iterable[Half]]) -> Iterator[Any]:
        for item in join_halves(*element):
            yield tagged(item) if isinstance(item, DeadLetter) else item


class JoinBatchHalves(beam.PTransform):
    """(source, record) in; the same out ("records"), but each pair of an OpenAI Batch input
    line and output line is one joined record, met by custom_id in a GroupByKey (the runner's
    shuffle bounds its memory), and the lines that do not pair are dead letters
    (DEAD_LETTER_TAG): the local engine's join (batch_join.py), one function."""

    def __init__(self, options: ParseOptions):
        super().__init__()
        self._options = options

    def expand(self, records: beam.PCollection) -> dict[str, beam.PCollection]:
        split = records | "SetAsideHalves" >> beam.ParDo(
            SetAsideHalves(self._options)
        ).with_outputs(HALVES_TAG, main="records")
        joined = (
            split[HALVES_TAG]
            | "GroupByCustomId" >> beam.GroupByKey()
            | "JoinHalves" >> beam.ParDo(JoinGroup()).with_outputs(DEAD_LETTER_TAG, main="records")
        )
        return {
            "records": (split.records, joined.records) | "WithJoined" >> beam.Flatten(),
            DEAD_LETTER_TAG: joined[DEAD_LETTER_TAG],
        }


class ParseRecords(beam.DoFn):
    """(source, record) in; Requests out, and dead letters for records that are not requests."""

    def __init__(self, options: ParseOptions):
        self._options = options

    def process(self, element: tuple[str, Any]) -> Iterator[Any]:
        parsed = parse_one(*element, self._options)
        yield tagged(parsed) if isinstance(parsed, DeadLetter) else parsed


def parse_records(records: beam.PCollection, options: ParseOptions) -> beam.pvalue.DoOutputsTuple:
    return records | "Parse" >> beam.ParDo(ParseRecords(options)).with_outputs(
        DEAD_LETTER_TAG, main="requests"
    )


class ParseArrived(beam.DoFn):
    """(key, routed requests) after the shuffle in; the Requests out (parsed again where they
    travelled as lines), a dead letter for any that would not parse (none should)."""

    def __init__(self, options: ParseOptions):
        self._options = options

    def process(self, element: tuple[str, Iterable[Routed]]) -> Iterator[Any]:
        for payload in element[1]:
            request = arrived(payload, self._options)
            yield tagged(request) if isinstance(request, DeadLetter) else request


class RouteSessions(beam.PTransform):
    """Requests in; the same Requests out, each session's on one worker (routing.py), dead
    letters under DEAD_LETTER_TAG."""

    def __init__(self, options: ParseOptions):
        super().__init__()
        self._options = options

    def expand(self, requests: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        return (
            requests
            | "KeyBySession" >> beam.Map(lambda request: (route_key(request), routed(request)))
            | "GroupBySession" >> beam.GroupByKey()
            | "ParseArrived"
            >> beam.ParDo(ParseArrived(self._options)).with_outputs(
                DEAD_LETTER_TAG, main="requests"
            )
        )
