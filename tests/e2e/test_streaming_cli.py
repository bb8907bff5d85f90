"""The streaming driver under exact watermark control (TestStream): windows publish once a request
past their end plus the allowed lateness came in and the source's watermark passed its arrival,
late requests are dead letters, and the windows concatenated are the batch job's output of the
same records. The timing rules and what cumulative.json says are pure, tested without Beam.

The whole CLI runs; the unit tests are in tests/pipelines/test_anonymize_streaming.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.testing.test_stream import TestStream
from helpers import write_jsonl

from kvtrace.cli import main
from kvtrace.pipelines.anonymize_config import AnonymizeConfig
from kvtrace.pipelines.anonymize_streaming import StreamingConfig, build
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.tokenize import tokenizer_sha256
from kvtrace.transforms.stats.audit import audit
from kvtrace.transforms.write.manifest import RUN_COUNTS, read_run_counts

SALT = "a-streaming-test-salt-0123456789abcdef"


MINUTE = 60_000


def chat(ts: int, i: int) -> dict:
    return {"timestamp": ts, "session_id": f"s{i % 2}", "output_length": 3, "messages": [
        {"role": "system", "content": "a shared system prompt about caches"},
        {"role": "user", "content": f"question {i} " + "the quick brown fox " * (i % 4)}]}


def message(record: dict) -> bytes:
    return json.dumps(record).encode()


def streaming_config(tmp_path: Path, tokenizer: str, lateness_ms: int = 0,
                     idle_ms: int = 10_000) -> StreamingConfig:
    output = tmp_path / "stream"
    output.mkdir()
    (tmp_path / "staging").mkdir()
    job = AnonymizeConfig(inputs=(), output=str(output), staging=str(tmp_path / "staging"),
                          tokenizer=tokenizer, salt=SaltSource("env", "KVTRACE_SALT"),
                          dead_letter=str(tmp_path / "stream-rejected"), block_size=4,
                          # As the command gives them: the digests the gate checks (the pure
                          # tests' "x" names no tokenizer folder).
                          tokenizer_sha256=tokenizer_sha256(tokenizer)
                          if Path(tokenizer).is_dir() else {})
    return StreamingConfig(job, "pubsub:projects/p/subscriptions/s", MINUTE, lateness_ms, idle_ms)


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


def check_letters_published_by_the_protocol(config: StreamingConfig) -> set[str]:
    """The dead-letter folder as publish.DeadLetterRun leaves it once every run has settled:
    one owner-only file per run, named by a published window (or by the cumulative.json
    written with lone letters), and the stream's run counts, nothing staged left; the runs'
    names."""
    folder = Path(config.job.dead_letter)
    windows = {p.name for p in Path(config.job.output).iterdir() if p.is_dir()}
    runs = set()
    assert (folder / RUN_COUNTS).stat().st_mode & 0o077 == 0
    for entry in set(folder.iterdir()) - {folder / RUN_COUNTS}:
        assert entry.is_file() and entry.name.startswith("rejected-") and \
            entry.name.endswith(".jsonl"), entry.name  # no staging folder left behind
        assert entry.stat().st_mode & 0o077 == 0  # private, as the batch job's letters
        runs.add(entry.name[len("rejected-"):-len(".jsonl")])
    assert {run for run in runs if not run.startswith("letters-")} <= windows
    return runs


@pytest.mark.slow  # a streaming pipeline: ~10 s
def test_windows_publish_at_the_watermark_late_ones_are_dead_letters_and_equal_batch(
        tiny_tokenizer, tmp_path, monkeypatch):
    """Requests of 1970 arriving now, as a backfill's: their own times open and close windows,
    the source's watermark (the wall clock here) only confirms what came before."""
    monkeypatch.setenv("KVTRACE_SALT", SALT)
    on_time = [chat(20_000 * i, i) for i in range(6)]  # windows [0, 60 s) and [60 s, 120 s)
    within_lateness = chat(59_000, 6)  # window 0, after its end but before end + lateness
    late = chat(30_000, 7)  # window 0, after it was published
    config = streaming_config(tmp_path, tiny_tokenizer, lateness_ms=5_000, idle_ms=3_600_000)
    # Past every arrival of this run, short of the idle rule: confirms what came in so far.
    arrived = int(time.time()) + 120
    stream = (TestStream()
              .add_elements([message(r) for r in on_time[:4]])  # up to 60 s: window 0 open
              .advance_watermark_to(arrived)
              .add_elements([message(within_lateness), b"not json", message(on_time[4])])
              .advance_watermark_to(arrived + 1)  # 80 s came in: window 0 published
              .add_elements([message(late), message(on_time[5])])
              .advance_watermark_to_infinity())
    run_stream(config, stream)
    windows = sorted(p for p in Path(config.job.output).iterdir() if p.is_dir())
    assert [w.name for w in windows] == ["window-000000", "window-000001"]
    # Each window exactly what kvtrace publishes, numbered on from the one before: the audit
    # of the stream's folder passes them in order.
    report = audit(config.job.output, tiny_tokenizer)
    assert report["publishable"] and list(report["windows"]) == [w.name for w in windows], \
        report["flags"]

    rejected = letters(Path(config.job.dead_letter))
    assert sorted(letter["error"] for letter in rejected) == ["invalid_json", "late"]
    # The bad record came in while window 0 was open: its letter is published with it.
    runs = check_letters_published_by_the_protocol(config)
    first = Path(config.job.dead_letter) / "rejected-window-000000.jsonl"
    assert [json.loads(line)["error"] for line in first.read_text().splitlines()] == \
        ["invalid_json"]
    late_letter = next(letter for letter in rejected if letter["error"] == "late")
    assert "after window-000000 was published" in late_letter["message"]
    assert "window-000000" in runs
    cumulative = json.loads((Path(config.job.output) / "cumulative.json").read_text())
    assert cumulative["rows"] == 7 and cumulative["windows"] == 2 and "rejected" not in cumulative
    assert read_run_counts(config.job.dead_letter) == {"read": 9, "exported": 7, "rejected": 2}
    assert cumulative["published_until_ms"] == 2 * MINUTE  # the trace's zero is at 0 here

    # The same records, less the late one, through the batch job.
    batch_input = write_jsonl(tmp_path / "batch.jsonl", on_time + [within_lateness])
    assert main(["anonymize", "--input", str(batch_input), "--tokenizer", tiny_tokenizer,
                 "--block-size", "4", "--output", str(tmp_path / "batch")]) == 0
    streamed = [line for window in windows for line in trace_lines(window)]
    assert streamed == trace_lines(tmp_path / "batch")


@pytest.mark.slow  # a streaming pipeline: ~10 s
def test_windows_are_cut_from_the_traces_zero_and_equal_batch(tiny_tokenizer, tmp_path,
                                                              monkeypatch):
    """The first request at 00:37:12.345 of a day, one-minute windows: window k holds [zero + k
    min, zero + (k + 1) min), not the epoch's minutes (which would publish the zero's seconds
    and ms). A request earlier than those before it, before any window is published, moves the
    zero and the windows with it."""
    monkeypatch.setenv("KVTRACE_SALT", SALT)
    zero = 1_767_225_600_000 + 37 * MINUTE + 12_345
    offsets = [20_000, 0, 59_999, 60_000, 119_000, 150_000]
    records = [chat(zero + offset, i) for i, offset in enumerate(offsets)]
    config = streaming_config(tmp_path, tiny_tokenizer)
    stream = (TestStream().add_elements([message(records[0])])
              .advance_watermark_to(10)  # long before any window is due: the zero is 20 s
              .add_elements([message(r) for r in records[1:]])
              .advance_watermark_to_infinity())
    run_stream(config, stream)
    windows = sorted(p for p in Path(config.job.output).iterdir() if p.is_dir())
    published = [[json.loads(line)["timestamp"] for line in trace_lines(w)] for w in windows]
    assert published == [[0, 20_000, 59_999], [60_000, 119_000], [150_000]]
    cumulative = json.loads((Path(config.job.output) / "cumulative.json").read_text())
    assert (cumulative["windows"], cumulative["published_until_ms"]) == (3, 3 * MINUTE)
    batch_input = write_jsonl(tmp_path / "batch.jsonl", records)
    assert main(["anonymize", "--input", str(batch_input), "--tokenizer", tiny_tokenizer,
                 "--block-size", "4", "--output", str(tmp_path / "batch")]) == 0
    assert [line for w in windows for line in trace_lines(w)] == trace_lines(tmp_path / "batch")
