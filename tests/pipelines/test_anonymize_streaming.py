"""The streaming driver under exact watermark control (TestStream): windows publish once the
watermark passes their end plus the allowed lateness, late requests are dead letters, and the
windows concatenated are the batch job's output of the same records."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.testing.test_stream import TestStream

from conftest import write_jsonl
from kvtrace.cli import main
from pipelines.anonymize_config import AnonymizeConfig
from pipelines.anonymize_streaming import StreamingConfig, build, by_window
from transforms.encode.hashed_batch import HashedBatch, HashedRequest
from transforms.encode.salt import SaltSource

SALT = "a-streaming-test-salt-0123456789abcdef"
MINUTE = 60_000


def chat(ts: int, i: int) -> dict:
    return {"timestamp": ts, "session_id": f"s{i % 2}", "output_length": 3, "messages": [
        {"role": "system", "content": "a shared system prompt about caches"},
        {"role": "user", "content": f"question {i} " + "the quick brown fox " * (i % 4)}]}


def message(record: dict) -> bytes:
    return json.dumps(record).encode()


def streaming_config(tmp_path: Path, tokenizer: str, lateness_ms: int = 0) -> StreamingConfig:
    output = tmp_path / "stream"
    output.mkdir()
    (tmp_path / "staging").mkdir()
    job = AnonymizeConfig(inputs=(), output=str(output), staging=str(tmp_path / "staging"),
                          tokenizer=tokenizer, salt=SaltSource("env", "KVTRACE_SALT"),
                          dead_letter=str(tmp_path / "stream-rejected"), block_size=4)
    return StreamingConfig(job, "pubsub:projects/p/subscriptions/s", MINUTE, lateness_ms)


def run_stream(config: StreamingConfig, stream: TestStream) -> None:
    with beam.Pipeline(runner=BundleBasedDirectRunner(),
                       options=PipelineOptions(["--streaming"])) as pipeline:
        build(pipeline | stream, config)


def trace_lines(folder: Path) -> list[str]:
    return [line for path in sorted(folder.glob("trace-*.jsonl"))
            for line in path.read_text().splitlines()]


def letters(folder: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(folder.rglob("rejected-*.jsonl"))
            for line in path.read_text().splitlines()]


@pytest.mark.slow  # a streaming pipeline: ~10 s
def test_windows_publish_at_the_watermark_late_ones_are_dead_letters_and_equal_batch(
        tiny_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("KVTRACE_SALT", SALT)
    on_time = [chat(20_000 * i, i) for i in range(6)]  # windows [0, 60 s) and [60 s, 120 s)
    within_lateness = chat(59_000, 6)  # window 0, after its end but before end + lateness
    late = chat(30_000, 7)  # window 0, after it was published
    config = streaming_config(tmp_path, tiny_tokenizer, lateness_ms=5_000)
    stream = (TestStream()
              .add_elements([message(r) for r in on_time[:4]])
              .advance_watermark_to(MINUTE / 1000 + 1)  # window 0 ended, still open for 5 s
              .add_elements([message(within_lateness), b"not json"])
              .advance_watermark_to((MINUTE + 5_000) / 1000 + 1)  # window 0 published
              .add_elements([message(late)] + [message(r) for r in on_time[4:]])
              .advance_watermark_to_infinity())
    run_stream(config, stream)
    windows = sorted(p for p in Path(config.job.output).iterdir() if p.is_dir())
    assert [w.name for w in windows] == ["window-19700101T000000000Z", "window-19700101T000100000Z"]
    assert all((w / "manifest.json").exists() for w in windows)  # published whole

    rejected = letters(Path(config.job.dead_letter))
    assert sorted(letter["error"] for letter in rejected) == ["invalid_json", "late"]
    cumulative = json.loads((Path(config.job.output) / "cumulative.json").read_text())
    assert cumulative["rows"] == 7 and cumulative["windows"] == 2 and cumulative["rejected"] == 2

    # The same records, less the late one, through the batch job.
    batch_input = write_jsonl(tmp_path / "batch.jsonl", on_time + [within_lateness])
    assert main(["anonymize", "--input", str(batch_input), "--tokenizer", tiny_tokenizer,
                 "--block-size", "4", "--output", str(tmp_path / "batch")]) == 0
    streamed = [line for window in windows for line in trace_lines(window)]
    assert streamed == trace_lines(tmp_path / "batch")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 10**7), min_size=1, max_size=30), st.integers(1, 10**6))
def test_every_request_lands_in_the_one_window_holding_its_timestamp(timestamps, window_ms):
    batch = HashedBatch.pack([HashedRequest(ts, i, 1, 1, b"", None) for i, ts in
                              enumerate(timestamps)])
    parts = list(by_window(batch, window_ms))
    assert sum(len(part) for _, part in parts) == len(timestamps)
    assert [start for start, _ in parts] == sorted({start for start, _ in parts})
    for start, part in parts:
        assert start % window_ms == 0
        assert ((start <= part.requests["timestamp_ms"])
                & (part.requests["timestamp_ms"] < start + window_ms)).all()


HOSTILE = [b"", b"\x00\xff\xfe garbage", b"[1, 2, 3]", b"null", b'{"timestamp": -5}',
           b'{"messages": [{"role": "user", "content": "no timestamp"}]}',
           b"[" * 100_000, b'{"timestamp": 1e999, "prompt": "x"}',
           b'{"timestamp": 1000, "prompt": "\xed\xa0\x80 lone surrogate bytes"}',
           b'{"timestamp": 2000, "prompt": {"not": "text"}}']


@pytest.mark.slow  # a streaming pipeline: ~5 s
def test_hostile_messages_are_dead_letters_and_the_counts_add_up(tiny_tokenizer, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setenv("KVTRACE_SALT", SALT)
    config = streaming_config(tmp_path, tiny_tokenizer)
    good = [message(chat(5_000, 1)), message(chat(6_000, 2))]
    run_stream(config, TestStream().add_elements(HOSTILE + good).advance_watermark_to_infinity())
    cumulative = json.loads((Path(config.job.output) / "cumulative.json").read_text())
    rejected = letters(Path(config.job.dead_letter))
    assert cumulative["rows"] + cumulative["rejected"] == len(HOSTILE) + len(good)
    assert len(rejected) == cumulative["rejected"] and all(r["error"] for r in rejected)
    assert (cumulative["rows"], cumulative["windows"]) == (len(good), 1)
