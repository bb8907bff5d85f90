"""One kind of timestamp per input: a relative time among epoch dates (or the reverse) is a dead
letter of its own and never moves the origin; the same in both engines and as a transform."""

from __future__ import annotations

import pytest

import json

import apache_beam as beam
import numpy as np
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from conftest import anonymize, assert_same_output, chat, read_jsonl, trace, write_jsonl

from transforms.dead_letters import DEAD_LETTER_TAG
from transforms.encode.hashed_batch import REQUEST, HashedBatch
from transforms.encode.steps import OneTimestampKind
from transforms.encode.timestamp_kinds import TIMESTAMP_KIND_MISMATCH, keep_input_kind, kind_counts
from transforms.read.timestamps import EPOCH, RELATIVE, input_kind

EPOCH_MS = 1_700_000_000_000


def batch_of(timestamps: list[int]) -> HashedBatch:
    requests = np.zeros(len(timestamps), dtype=REQUEST)
    requests["timestamp_ms"] = timestamps
    requests["num_blocks"] = 1
    hashes = np.arange(2 * len(timestamps), dtype=np.uint64).reshape(-1, 2)
    return HashedBatch(requests, hashes)


def test_the_majority_decides_and_ties_go_to_epoch_dates():
    assert input_kind(relative=1, epoch=99) == EPOCH
    assert input_kind(relative=99, epoch=1) == RELATIVE
    assert input_kind(relative=3, epoch=3) == EPOCH


def test_the_minority_kind_is_dead_lettered_with_its_blocks_removed():
    batch = batch_of([EPOCH_MS, 5, EPOCH_MS + 1])
    kept, letters = keep_input_kind(batch, kind_counts(batch))
    assert kept.requests["timestamp_ms"].tolist() == [EPOCH_MS, EPOCH_MS + 1]
    assert kept.block_hashes.tolist() == [[0, 1], [4, 5]]
    assert [letter.reason for letter in letters] == [TIMESTAMP_KIND_MISMATCH]
    assert json.loads(letters[0].line)["timestamp_ms"] == 5


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_one_timestamp_kind_transform_decides_over_all_batches():
    batches = [batch_of([EPOCH_MS, 7]), batch_of([EPOCH_MS + 5]), batch_of([EPOCH_MS + 9])]
    with TestPipeline() as pipeline:
        agreed = pipeline | beam.Create(batches) | OneTimestampKind()
        assert_that(agreed.hashed | beam.FlatMap(lambda b: b.requests["timestamp_ms"].tolist()),
                    equal_to([EPOCH_MS, EPOCH_MS + 5, EPOCH_MS + 9]))
        assert_that(agreed[DEAD_LETTER_TAG] | beam.Map(lambda d: d.reason),
                    equal_to([TIMESTAMP_KIND_MISMATCH]), label="Letters")


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_a_relative_time_among_epoch_dates_never_moves_the_origin(tiny_tokenizer, tmp_path):
    records = [chat(i, EPOCH_MS + 1000 * i) for i in range(6)] + [chat(9, 250)]
    src = write_jsonl(tmp_path / "in.jsonl", records)
    for engine in ("local", "beam"):
        assert anonymize(tiny_tokenizer, [src], tmp_path / engine, "--engine", engine) == 0
        rows = trace(tmp_path / engine)
        assert [r["timestamp"] for r in rows] == [1000 * i for i in range(6)]
        letters = read_jsonl(next((tmp_path / f"{engine}-rejected").glob("*.jsonl")))
        assert [letter["error"] for letter in letters] == [TIMESTAMP_KIND_MISMATCH]
    assert_same_output(tmp_path / "local", tmp_path / "beam")
