"""`kvtrace anonymize`: request logs in, an anonymized Mooncake trace out.

read -> parse -> render, tokenize, chain-hash -> dense ids (blocks, sessions) -> sorted shards,
plus dead letters, stats.json and manifest.json.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import apache_beam as beam

from kvtrace import __version__
from kvtrace.transforms.blocks import HASH_SCHEME
from kvtrace.transforms.dead_letters import DEAD_LETTER_TAG
from kvtrace.transforms.dense_ids import (
    DEFAULT_HASH_SHARDS,
    AssignDenseIds,
    block_keys,
    new_batch_id,
    session_keys,
)
from kvtrace.transforms.encode import EncodeRequests
from kvtrace.transforms.manifest import (
    RecordCounts,
    check_rejected_fraction,
    remove_stale_shards,
    write_json,
)
from kvtrace.transforms.read import ReadRecords, parse_records
from kvtrace.transforms.rows import assemble_rows
from kvtrace.transforms.stats import TotalRows, export_stats
from kvtrace.transforms.write import WriteTrace

# Batches big enough for the fast tokenizer to use every core, small enough that a batch of
# 10k-token prompts (~40 kB of text each) stays within tens of MB.
TOKENIZE_BATCH = dict(min_batch_size=32, max_batch_size=256)
# The id join moves one element per batch and shard: larger batches, fewer elements.
ID_BATCH = dict(min_batch_size=256, max_batch_size=4096)


@dataclass(frozen=True)
class AnonymizeConfig:
    inputs: tuple[str, ...]  # files, already expanded from the user's globs
    output: str
    tokenizer: str
    salt: bytes = field(repr=False)
    dead_letter: str
    block_size: int = 512
    input_format: str = "auto"
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_rejected_fraction: float | None = None
    hash_shards: int = DEFAULT_HASH_SHARDS
    tokenizer_sha256: dict[str, str] = field(default_factory=dict)


class AnonymizeOutputs(NamedTuple):
    trace_files: beam.PCollection
    dead_letters: beam.PCollection
    summary: beam.PCollection  # the manifest dict, once written


def build(pipeline: beam.Pipeline, config: AnonymizeConfig) -> AnonymizeOutputs:
    records = pipeline | "Read" >> ReadRecords(config.inputs)
    parsed = parse_records(records, config.input_format)
    encoded = (
        parsed.requests
        | "TokenizeBatches" >> beam.BatchElements(**TOKENIZE_BATCH)
        | "RenderTokenizeHash" >> beam.ParDo(
            EncodeRequests(
                config.tokenizer, config.block_size, config.salt, config.chat_template_kwargs
            )
        ).with_outputs(DEAD_LETTER_TAG, main="hashed")
    )
    batches = (
        encoded.hashed
        | "IdBatches" >> beam.BatchElements(**ID_BATCH)
        | "NameBatches" >> beam.Map(lambda batch: (new_batch_id(), batch))
    )
    blocks = batches | "BlockIds" >> AssignDenseIds(
        functools.partial(block_keys, block_size=config.block_size), config.hash_shards
    )
    sessions = batches | "SessionIds" >> AssignDenseIds(session_keys, config.hash_shards)
    rows = (
        {"requests": batches, "blocks": blocks["ids"], "sessions": sessions["ids"]}
        | "JoinIds" >> beam.CoGroupByKey()
        | "AssembleRows" >> beam.FlatMap(assemble_rows)
    )

    dead_letters = (
        parsed[DEAD_LETTER_TAG],
        encoded[DEAD_LETTER_TAG],
    ) | "AllRejected" >> beam.Flatten()
    rejected_count = dead_letters | "CountRejected" >> beam.combiners.Count.Globally()
    counts = (
        records
        | "CountRead" >> beam.combiners.Count.Globally()
        | "Counts" >> beam.Map(
            lambda read, rejected: RecordCounts(read, rejected),
            beam.pvalue.AsSingleton(rejected_count),
        )
        | "CheckRejected" >> beam.Map(check_rejected_fraction, config.max_rejected_fraction)
    )
    _ = (
        dead_letters
        | "DeadLetterJson" >> beam.Map(lambda d: d.to_json())
        | "WriteDeadLetters" >> beam.io.WriteToText(
            f"{config.dead_letter.rstrip('/')}/rejected", file_name_suffix=".jsonl"
        )
    )

    trace_files = rows | "WriteTrace" >> WriteTrace(config.output, gate=counts)
    totals = rows | "Totals" >> TotalRows()
    summary = pipeline | "Summary" >> beam.Create([None]) | "WriteSummary" >> beam.Map(
        lambda _, files, counts, totals, unique: _write_summary(
            config, sorted(files), counts, totals, unique
        ),
        beam.pvalue.AsList(trace_files),
        beam.pvalue.AsSingleton(counts),
        beam.pvalue.AsSingleton(totals),
        beam.pvalue.AsSingleton(blocks["unique"]),
    )
    return AnonymizeOutputs(trace_files, dead_letters, summary)


def _write_summary(config: AnonymizeConfig, files, counts, totals, unique) -> dict:
    stats = export_stats(totals, unique.count, unique.weight)
    manifest = {
        "kvtrace_version": __version__,
        "format": "mooncake-trace",
        "tokenizer": {"name": config.tokenizer, "sha256": config.tokenizer_sha256},
        "block_size": config.block_size,
        "hash_scheme": HASH_SCHEME,
        "input_format": config.input_format,
        "chat_template_kwargs": config.chat_template_kwargs,
        "records": {
            "read": counts.read,
            "exported": totals.requests,
            "rejected": counts.rejected,
            "without_timestamp": totals.requests_without_timestamp,
            "without_output_length": totals.requests_without_output_length,
        },
        "files": [f.rsplit("/", 1)[-1] for f in files] + ["stats.json"],
    }
    remove_stale_shards(config.output, files)
    write_json(f"{config.output.rstrip('/')}/stats.json", stats)
    write_json(f"{config.output.rstrip('/')}/manifest.json", manifest)
    return manifest
