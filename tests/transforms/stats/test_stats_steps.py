"""The statistics stage's shard step and the pure helpers around it."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kvtrace.transforms.ids.buckets import BUCKET_MS
from kvtrace.transforms.read.trace_inputs import trace_files
from kvtrace.transforms.stats.trace_shards import ROW, by_shard, warmup_key, warmup_plan

BLOCK = np.dtype([("id", "<i8"), ("pos", "<i8")])


def blocks(ids: list[int]) -> np.ndarray:
    table = np.zeros(len(ids), dtype=BLOCK)
    table["id"] = ids
    return table


@pytest.mark.beam
def test_each_shard_gets_all_its_keys_from_every_chunk():
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.stats.steps import ShardStep

    chunks = [SimpleNamespace(blocks=blocks([0, 1, 2, 3])), SimpleNamespace(blocks=blocks([4, 6]))]
    with TestPipeline() as pipeline:
        sizes = (
            pipeline
            | beam.Create(chunks)
            | ShardStep(
                lambda b: b["id"], lambda tables: sorted(np.concatenate(tables)["id"].tolist()), 2
            )
        )
        assert_that(sizes, equal_to([[0, 2, 4, 6], [1, 3]]))


def test_by_shard_splits_by_key_modulo_shards():
    parts = dict(by_shard(blocks([5, 2, 7]), np.array([5, 2, 7], dtype=np.uint64), 3))
    assert {shard: part["id"].tolist() for shard, part in parts.items()} == {2: [5, 2], 1: [7]}


def test_the_warmup_row_is_found_by_bucket_and_rank():
    plan = warmup_plan({10: 3, 11: 4}, 0.5)  # 7 rows: the 4th (rank 3) is bucket 11's first
    assert plan == (11, 0)
    assert warmup_key([(5.0, 9), (2.0, 4)], plan) == (2.0, 4)
    assert warmup_plan({}, 0.5) is None and warmup_key([], None) is None


def rows(times: list[float], first_rowkey: int) -> SimpleNamespace:
    table = np.zeros(len(times), dtype=ROW)
    table["ts"], table["rowkey"] = times, np.arange(first_rowkey, first_rowkey + len(times))
    return SimpleNamespace(rows=table)


@pytest.mark.beam
@pytest.mark.slow  # two side-input joins: ~2 s on the embedded runner
def test_warmup_key_and_minute_counts_over_chunks_of_several_files():
    # Five rows over two files and two time buckets; rank floor(0.5 x 5) = 2 is the third row in
    # (timestamp, rowkey) order: (BUCKET_MS + 1, 11).
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.stats.steps import MinuteCounts, WarmupKey

    chunks = [
        rows([0.0, BUCKET_MS + 1.0], 10),
        rows([BUCKET_MS + 2.0, 7.0, BUCKET_MS + 1.0], 20),
        rows([], 30),
    ]
    with TestPipeline() as pipeline:
        files = pipeline | beam.Create(chunks)
        assert_that(files | WarmupKey(0.5), equal_to([(BUCKET_MS + 1.0, 11)]), label="Warmup")
        assert_that(files | MinuteCounts(), equal_to([Counter({0: 2, 1: 3})]), label="Minutes")


def _published(folder: Path, shards: list[list[int]]) -> Path:
    """A folder as kvtrace publishes it (JSONL shards of rows of these input lengths, a manifest
    listing them), enough for the readers."""
    folder.mkdir()
    for index, lengths in enumerate(shards):
        (folder / f"trace-{index:05d}-of-{len(shards):05d}.jsonl").write_text(
            "".join(
                json.dumps({"timestamp": i, "input_length": n, "hash_ids": [i]}) + "\n"
                for i, n in enumerate(lengths)
            )
        )
    sha256 = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    (folder / "manifest.json").write_text(
        json.dumps(
            {
                "format": "mooncake-trace",
                "block_size": 4,
                "sha256": sha256,
                "records": {"exported": sum(map(len, shards))},
            }
        )
    )
    return folder


@pytest.mark.beam
def test_the_workers_read_each_file_as_pinned_when_the_files_were_listed(tmp_path, monkeypatch):
    """The next night published over the folder after it was listed: every worker's read is of
    the output listed (the pinned folder), never a mix."""
    from kvtrace.transforms.read import trace_inputs

    # Held whatever pins other tests of this worker keep (they count against the cap).
    monkeypatch.setattr(trace_inputs, "MAX_HELD_FOLDERS", 1 << 20)
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.stats.steps import ReadTraceFiles

    out = _published(tmp_path / "out", [[8, 8], [8, 8, 8]])
    staged = _published(tmp_path / "next", [[9], [9, 9, 9]])
    files = tuple(trace_files([str(out)]))
    os.rename(out, tmp_path / "previous")
    os.rename(staged, out)
    with TestPipeline() as pipeline:
        read = (
            pipeline
            | ReadTraceFiles(files, 4)
            | beam.Map(lambda chunk: (chunk.index, chunk.rows["isl"].tolist()))
        )
        assert_that(read, equal_to([(0, [8, 8]), (1, [8, 8, 8])]))
