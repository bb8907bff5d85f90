"""Plausible timestamps only: a relative time among epoch dates (or the reverse) and a clock reset
to a plausible date are dead letters of their own and never move the origin; the same in both
engines, as a transform and across a stream's windows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import chat, stream_counts
from kvtrace.pipelines.anonymize_config import AnonymizeConfig
from kvtrace.transforms.dead_letters import DEAD_LETTER_TAG
from kvtrace.transforms.encode.hashed_batch import REQUEST, HashedBatch
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.timestamp_kinds import (
    IMPLAUSIBLE_TIMESTAMP,
    TIMESTAMP_KIND_MISMATCH,
    keep_input_kind,
    keep_plausible_windows,
    kind_counts,
    sum_kind_counts,
)
from kvtrace.transforms.read.timestamps import DAY_MS

EPOCH_MS = 1_700_000_000_000


def batch_of(timestamps: list[int]) -> HashedBatch:
    requests = np.zeros(len(timestamps), dtype=REQUEST)
    requests["timestamp_ms"] = timestamps
    requests["num_blocks"] = 1
    hashes = np.arange(2 * len(timestamps), dtype=np.uint64).reshape(-1, 2)
    return HashedBatch(requests, hashes)


def test_counts_per_day_add_up_over_any_split():
    batch = batch_of([EPOCH_MS, 5, EPOCH_MS + 1, EPOCH_MS + DAY_MS])
    first = np.arange(4) < 2
    halves = [kind_counts(batch.select(first)), kind_counts(batch.select(~first))]
    assert (
        sum_kind_counts(halves)
        == kind_counts(batch)
        == {0: 1, EPOCH_MS // DAY_MS: 2, EPOCH_MS // DAY_MS + 1: 1}
    )


def test_a_clock_reset_to_a_plausible_date_is_an_implausible_timestamp():
    reset = 946_684_800_000  # 2000-01-01, inside the calendar range of log dates
    batch = batch_of([EPOCH_MS, reset, EPOCH_MS + 1])
    kept, letters = keep_input_kind(batch, kind_counts(batch))
    assert kept.requests["timestamp_ms"].tolist() == [EPOCH_MS, EPOCH_MS + 1]
    assert [letter.reason for letter in letters] == [IMPLAUSIBLE_TIMESTAMP]
    assert json.loads(letters[0].line)["timestamp_ms"] == reset


def test_stray_windows_are_dead_letters_when_judged_with_the_others():
    windows = [
        (0, batch_of([5])),
        (EPOCH_MS, batch_of([EPOCH_MS, EPOCH_MS + 1])),
        (EPOCH_MS + 60_000, batch_of([EPOCH_MS + 60_000])),
    ]
    kept, letters = keep_plausible_windows(windows)
    assert [window for window, _ in kept] == [EPOCH_MS, EPOCH_MS + 60_000]
    assert [letter.reason for letter in letters] == [TIMESTAMP_KIND_MISMATCH]


def test_the_minority_kind_is_dead_lettered_with_its_blocks_removed():
    batch = batch_of([EPOCH_MS, 5, EPOCH_MS + 1])
    kept, letters = keep_input_kind(batch, kind_counts(batch))
    assert kept.requests["timestamp_ms"].tolist() == [EPOCH_MS, EPOCH_MS + 1]
    assert kept.block_hashes.tolist() == [[0, 1], [4, 5]]
    assert [letter.reason for letter in letters] == [TIMESTAMP_KIND_MISMATCH]
    assert json.loads(letters[0].line)["timestamp_ms"] == 5


@pytest.mark.beam
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_one_timestamp_kind_transform_decides_over_all_batches():
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.encode.steps import OneTimestampKind

    batches = [batch_of([EPOCH_MS, 7]), batch_of([EPOCH_MS + 5]), batch_of([EPOCH_MS + 9])]
    with TestPipeline() as pipeline:
        agreed = pipeline | beam.Create(batches) | OneTimestampKind()
        assert_that(
            agreed.hashed | beam.FlatMap(lambda b: b.requests["timestamp_ms"].tolist()),
            equal_to([EPOCH_MS, EPOCH_MS + 5, EPOCH_MS + 9]),
        )
        assert_that(
            agreed[DEAD_LETTER_TAG] | beam.Map(lambda d: d.reason),
            equal_to([TIMESTAMP_KIND_MISMATCH]),
            label="Letters",
        )


def _stream(
    tokenizer: str, folder: Path, records: list[dict]
) -> tuple[list[str], list[dict], dict, dict]:
    """The records through the streaming driver, all before the watermark passes any window:
    (the windows' trace lines in order, the dead letters, the cumulative summary, the stream's
    run counts beside its dead letters)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
    from apache_beam.testing.test_stream import TestStream

    from kvtrace.pipelines.anonymize_streaming import StreamingConfig, build

    folder.mkdir()
    job = AnonymizeConfig(
        inputs=(),
        output=str(folder / "out"),
        staging=str(folder / "staging"),
        tokenizer=tokenizer,
        salt=SaltSource("env", "KVTRACE_SALT"),
        dead_letter=str(folder / "rejected"),
        block_size=4,
    )
    (folder / "out").mkdir()
    (folder / "staging").mkdir()
    config = StreamingConfig(job, "pubsub:projects/p/subscriptions/s", 60_000)
    stream = (
        TestStream()
        .add_elements([json.dumps(r).encode() for r in records])
        .advance_watermark_to_infinity()
    )
    with beam.Pipeline(
        runner=BundleBasedDirectRunner(), options=PipelineOptions(["--streaming"])
    ) as pipeline:
        build(pipeline | stream, config)
    lines = [
        line
        for window in sorted(p for p in (folder / "out").iterdir() if p.is_dir())
        for path in sorted(window.glob("trace-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    letters = [
        json.loads(line)
        for path in sorted((folder / "rejected").rglob("rejected-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    return (
        lines,
        letters,
        json.loads((folder / "out" / "cumulative.json").read_text()),
        stream_counts(folder / "rejected"),
    )


@pytest.mark.beam
@pytest.mark.slow  # two streaming pipelines: ~20 s
def test_a_stray_window_never_becomes_the_streams_origin(tiny_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("KVTRACE_SALT", "a-streaming-test-salt-0123456789abcdef")
    night = [chat(i, EPOCH_MS + 20_000 * i) for i in range(6)]  # three one-minute windows
    strays = [chat(9, 946_684_800_000), chat(8, 5)]
    alone = _stream(tiny_tokenizer, tmp_path / "alone", night)
    lines, letters, cumulative, counts = _stream(
        tiny_tokenizer, tmp_path / "strays", strays + night
    )
    assert lines == alone[0] and len(lines) == 6
    assert sorted(letter["error"] for letter in letters) == [
        IMPLAUSIBLE_TIMESTAMP,
        TIMESTAMP_KIND_MISMATCH,
    ]
    # same rows from the same zero: the stream published up to the same time after its origin
    assert cumulative["published_until_ms"] == alone[2]["published_until_ms"]
    assert cumulative["rows"] == counts["exported"] == 6 and "rejected" not in cumulative
    assert counts["rejected"] == len(letters) == 2  # read = exported + rejected: nothing lost
    assert counts["read"] == 8
