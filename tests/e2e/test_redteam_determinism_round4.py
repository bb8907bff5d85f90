"""Red team round 4 (rt4-det): determinism and time. Each test asserts a promise and fails
today."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SALT = "a-streaming-test-salt-0123456789abcdef"
MINUTE = 60_000
ZERO = 1_767_225_600_000  # 2026-01-01


def _chat(ts: int, i: int) -> dict:
    return {
        "timestamp": ts,
        "session_id": f"s{i % 2}",
        "output_length": 3,
        "messages": [
            {"role": "system", "content": "a shared system prompt about caches"},
            {"role": "user", "content": f"question {i} " + "the quick brown fox " * (i % 4)},
        ],
    }


def _stream(
    tmp_path: Path,
    tokenizer: str,
    batches: list[list[dict]],
    watermarks: list[int | None],
    **job: object,
) -> Path:
    """Run the streaming pipeline on a TestStream: each batch added, then the watermark moved
    to its entry (None: left); returns the stream's output folder."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
    from apache_beam.testing.test_stream import TestStream

    from kvtrace.pipelines.anonymize_config import AnonymizeConfig
    from kvtrace.pipelines.anonymize_streaming import StreamingConfig, build
    from kvtrace.transforms.encode.salt import SaltSource

    output = tmp_path / "stream"
    output.mkdir()
    (tmp_path / "staging").mkdir()
    config = AnonymizeConfig(
        inputs=(),
        output=str(output),
        staging=str(tmp_path / "staging"),
        tokenizer=tokenizer,
        salt=SaltSource("env", "KVTRACE_SALT"),
        dead_letter=str(tmp_path / "stream-rejected"),
        block_size=4,
        **job,
    )
    stream = TestStream()
    for batch, watermark in zip(batches, watermarks):
        stream = stream.add_elements([json.dumps(r).encode() for r in batch])
        if watermark is not None:
            stream = stream.advance_watermark_to(watermark)
    stream = stream.advance_watermark_to_infinity()
    with beam.Pipeline(
        runner=BundleBasedDirectRunner(), options=PipelineOptions(["--streaming"])
    ) as pipeline:
        build(
            pipeline | stream,
            StreamingConfig(config, "pubsub:projects/p/subscriptions/s", MINUTE, 0, 10_000),
        )
    return output


def test_a_stream_begun_by_a_relative_time_never_publishes_epoch_dates(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: nothing private is published; timestamps are ms from the trace's zero, never the
    wall clock (docs/ID_MAP.md 'The kind of time': 'counted from a relative origin, epoch dates
    would publish the wall clock'); streaming publishes what batch publishes. A stream whose
    first request is a relative time (a replay tool's offset, a stray 1 000 ms) publishes it as
    window 0 once the watermark passes, which fixes the stream's zero at 1 000 ms
    (Progress, anonymize_streaming.py). The epoch requests that follow are the bulk from then
    on, but nothing compares their kind with the zero's (as the map's check_night_kind does for
    a night): each is published as its epoch date minus one second, 2025-12-31T23:59:59 and on,
    the wall clock to the millisecond. The batch job dead-letters the stray
    (timestamp_kind_mismatch) and publishes the epoch requests from their own zero."""
    from helpers import write_jsonl
    from kvtrace.cli import main

    monkeypatch.setenv("KVTRACE_SALT", SALT)
    stray = [_chat(1_000, 0)]
    epoch = [_chat(ZERO + 7_000 * i, i) for i in range(10)]
    output = _stream(tmp_path, tiny_tokenizer, [stray, epoch], [int(time.time()) + 120, None])
    published = [
        json.loads(line)["timestamp"]
        for p in sorted(output.glob("window-*/trace-*.jsonl"))
        for line in p.read_text().splitlines()
    ]

    batch = write_jsonl(tmp_path / "batch.jsonl", stray + epoch)
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(batch),
                "--tokenizer",
                tiny_tokenizer,
                "--block-size",
                "4",
                "--output",
                str(tmp_path / "batch"),
            ]
        )
        == 0
    )
    assert (
        max(
            json.loads(line)["timestamp"]
            for line in (tmp_path / "batch" / "trace-00000-of-00001.jsonl").read_text().splitlines()
        )
        == 63_000
    )
    wall_clock = [t for t in published if t > 365 * 86_400_000]
    assert not wall_clock, (
        f"the stream published {len(wall_clock)} rows at epoch dates, e.g. {wall_clock[:2]} "
        f"(the requests' wall-clock times, counted from a relative zero)"
    )


def test_a_stream_never_publishes_a_window_after_a_newer_one(tiny_tokenizer, tmp_path, monkeypatch):
    """Promise (docs/STREAMING.md): due windows are published 'oldest first'; a request whose
    window is not newer than the last published one is late (a dead letter); with nothing late
    the windows concatenated are the batch output, byte for byte. Requests of 90-120 s come in
    first, then (before the watermark moves) requests of 0-20 s, which move the zero. Each open
    window is due on its own (Progress.due_ms: when a request past its deadline came in, by
    the wall clock at arrival): window [60 s, 120 s) was passed when the first batch came in,
    window [0, 60 s) only when the second did. The deadline timer fires at its own timestamp
    (the earlier one) and _publish_due publishes only the windows due by then: window-000000
    holds 90 s..110 s, window-000001 then holds 0 s..20 s (not late: nothing checks an older
    window still open), numbered after it. Times go back across windows, ids follow arrival
    order, and no letter says so."""
    import itertools

    from helpers import write_jsonl
    from kvtrace.cli import main
    from kvtrace.pipelines import anonymize_streaming

    monkeypatch.setenv("KVTRACE_SALT", SALT)
    clock = itertools.count(int(time.time() * 1000), 1_000)  # arrivals a second apart
    monkeypatch.setattr(anonymize_streaming, "source_now_ms", lambda: next(clock))
    later = [_chat(ZERO + 90_000 + 10_000 * i, i) for i in range(4)]
    earlier = [_chat(ZERO + 10_000 * i, 10 + i) for i in range(3)]
    output = _stream(tmp_path, tiny_tokenizer, [later, earlier], [None, None])
    windows = [
        [json.loads(line) for line in p.read_text().splitlines()]
        for p in sorted(output.glob("window-*/trace-*.jsonl"))
    ]
    letters = [
        line
        for p in (tmp_path / "stream-rejected").glob("*.jsonl")
        for line in p.read_text().splitlines()
    ]
    streamed = b"".join(p.read_bytes() for p in sorted(output.glob("window-*/trace-*.jsonl")))

    batch = write_jsonl(tmp_path / "batch.jsonl", later + earlier)
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(batch),
                "--tokenizer",
                tiny_tokenizer,
                "--block-size",
                "4",
                "--output",
                str(tmp_path / "batch"),
            ]
        )
        == 0
    )
    expected = (tmp_path / "batch" / "trace-00000-of-00001.jsonl").read_bytes()
    assert not letters and streamed == expected, (
        f"windows in publication order hold times {[[r['timestamp'] for r in w] for w in windows]}"
        f" ({len(letters)} letters): an older window published after a newer one"
    )
