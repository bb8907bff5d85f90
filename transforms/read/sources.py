"""Read request logs: JSONL (plain, .gz, .zst) and Parquet, from local paths or Beam filesystems."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.coders import BytesCoder
from apache_beam.io.parquetio import ReadAllFromParquet
from apache_beam.io.textio import ReadAllFromText

from transforms.dead_letters import DEAD_LETTER_TAG, dead_letter
from transforms.errors import Rejected
from transforms.read.paths import PARQUET_SUFFIXES
from transforms.read.records import parse_record, request_from_object

# Splits of uncompressed files that workers read in parallel: small enough that a single large
# file keeps every worker busy, large enough that per-split overhead stays negligible.
READ_SPLIT_BYTES = 8 << 20


class ReadRecords(beam.PTransform):
    """Files in; (source file, record) out, where record is a JSONL line's bytes or a Parquet
    row's dict. Blank lines are not records."""

    def __init__(self, files: Sequence[str]):
        super().__init__()
        self._files = list(files)

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        parquet = [f for f in self._files if f.lower().endswith(PARQUET_SUFFIXES)]
        text = [f for f in self._files if not f.lower().endswith(PARQUET_SUFFIXES)]
        parts = []
        if text:
            parts.append(
                pipeline
                | "TextFiles" >> beam.Create(text)
                # Bytes, not str: a line of invalid UTF-8 must become a dead letter, not a crash.
                | "ReadLines" >> ReadAllFromText(
                    with_filename=True, coder=BytesCoder(), desired_bundle_size=READ_SPLIT_BYTES
                )
                | "DropBlankLines" >> beam.Filter(lambda kv: bool(kv[1].strip()))
            )
        if parquet:
            parts.append(
                pipeline
                | "ParquetFiles" >> beam.Create(parquet)
                | "ReadRows" >> ReadAllFromParquet(with_filename=True)
            )
        if not parts:
            return pipeline | "NoFiles" >> beam.Create([])
        return parts | "AllRecords" >> beam.Flatten()


class ParseRecords(beam.DoFn):
    """(source, record) in; Requests out, and dead letters for records that are not requests."""

    def __init__(self, input_format: str):
        self._input_format = input_format

    def process(self, element: tuple[str, Any]) -> Iterator[Any]:
        source, record = element
        is_line = isinstance(record, bytes)
        line = record if is_line else json.dumps(record, default=str, ensure_ascii=False).encode()
        try:
            if is_line:
                yield parse_record(line, source, self._input_format)
            else:
                yield request_from_object(record, line, source, self._input_format)
        except Rejected as err:
            yield dead_letter(source, line, err.reason, err.message)


def parse_records(records: beam.PCollection, input_format: str) -> beam.pvalue.DoOutputsTuple:
    return records | "Parse" >> beam.ParDo(ParseRecords(input_format)).with_outputs(
        DEAD_LETTER_TAG, main="requests"
    )
