"""The Beam steps of reading: file ranges spread over workers, records parsed into Requests,
and, when asked, each session's requests routed to one worker."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam

from kvtrace.transforms.dead_letters import DEAD_LETTER_TAG, DeadLetter
from kvtrace.transforms.read.records import ParseOptions
from kvtrace.transforms.read.routing import Routed, arrived, route_key, routed
from kvtrace.transforms.read.sources import (
    FileRange,
    ReadProgress,
    file_ranges,
    parse_one,
    read_range,
)
from kvtrace.transforms.steps import tagged


class ReadFileRange(beam.DoFn):
    """A range's index in ranges in; (source, record) out, and a dead letter for each oversized
    record and each file that breaks off (the records before the break still go out). Beam
    carries text between steps as UTF-8, and a Linux name need not be: the ranges travel with
    the step (pickled whole), their index between steps, and `source` leaves it as read_range
    shows it (dead_letters.shown_name), as the local engine's letters show it."""

    def __init__(self, ranges: Sequence[FileRange], max_record_bytes: int, total_bytes: int):
        self._ranges = list(ranges)
        self._max_record_bytes = max_record_bytes
        self._total_bytes = total_bytes

    def setup(self) -> None:
        self._progress = ReadProgress(self._total_bytes)

    def process(self, index: int) -> Iterator[Any]:
        for item in read_range(self._ranges[index], self._max_record_bytes, self._progress):
            yield tagged(item) if isinstance(item, DeadLetter) else item


class ReadRecords(beam.PTransform):
    """(path, size) of every input file in; (source file, record) out, a record being a JSONL
    line's bytes or a Parquet row's dict; dead letters for oversized records and damaged
    files under DEAD_LETTER_TAG. Blank lines are not records."""

    def __init__(self, files: Sequence[tuple[str, int]], max_record_bytes: int):
        super().__init__()
        self._files = list(files)
        self._max_record_bytes = max_record_bytes

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.pvalue.DoOutputsTuple:
        total = sum(size for _, size in self._files)
        ranges = [r for path, size in self._files for r in file_ranges(path, size)]
        return (
            pipeline
            | "Ranges" >> beam.Create(range(len(ranges)))
            | "SpreadRanges" >> beam.Reshuffle()
            | "ReadRanges"
            >> beam.ParDo(ReadFileRange(ranges, self._max_record_bytes, total)).with_outputs(
                DEAD_LETTER_TAG, main="records"
            )
        )


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
