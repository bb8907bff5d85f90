"""The streaming driver under exact watermark control (TestStream): windows publish once a request
past their end plus the allowed lateness came in and the source's watermark passed its arrival,
late requests are dead letters, and the windows concatenated are the batch job's output of the
same records. The timing rules and what cumulative.json says are pure, tested without Beam.

The whole CLI runs; the unit tests are in tests/pipelines/test_anonymize_streaming.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from helpers import (
    MINUTE,
    STREAM_SALT,
    check_letters_published_by_the_protocol,
    letters,
    message,
    run_stream,
    stream_chat,
    stream_counts,
    streaming_config,
    write_jsonl,
)
from kvtrace.cli import main
from kvtrace.transforms.stats.audit import audit

pytestmark = pytest.mark.beam  # imports Beam: its tests share one worker


def trace_lines(folder: Path) -> list[str]:
    return [
        line
        for path in sorted(folder.glob("trace-*.jsonl"))
        for line in path.read_text().splitlines()
    ]


@pytest.mark.slow  # a streaming pipeline: ~10 s
def test_windows_publish_at_the_watermark_late_ones_are_dead_letters_and_equal_batch(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Requests of 1970 arriving now, as a backfill's: their own times open and close windows,
    the source's watermark (the wall clock here) only confirms what came before."""
    from apache_beam.testing.test_stream import TestStream

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    on_time = [stream_chat(20_000 * i, i) for i in range(6)]  # windows [0, 60 s) and [60 s, 120 s)
    within_lateness = stream_chat(59_000, 6)  # window 0, after its end but before end + lateness
    late = stream_chat(30_000, 7)  # window 0, after it was published
    config = streaming_config(tmp_path, tiny_tokenizer, lateness_ms=5_000, idle_ms=3_600_000)
    # Past every arrival of this run, short of the idle rule: confirms what came in so far.
    arrived = int(time.time()) + 120
    stream = (
        TestStream()
        .add_elements([message(r) for r in on_time[:4]])  # up to 60 s: window 0 open
        .advance_watermark_to(arrived)
        .add_elements([message(within_lateness), b"not json", message(on_time[4])])
        .advance_watermark_to(arrived + 1)  # 80 s came in: window 0 published
        .add_elements([message(late), message(on_time[5])])
        .advance_watermark_to_infinity()
    )
    run_stream(config, stream)
    windows = sorted(p for p in Path(config.job.output).iterdir() if p.is_dir())
    assert [w.name for w in windows] == ["window-000000", "window-000001"]
    # Each window exactly what kvtrace publishes, numbered on from the one before: the audit
    # of the stream's folder passes them in order.
    report = audit(config.job.output, tiny_tokenizer)
    assert report["publishable"] and list(report["windows"]) == [w.name for w in windows], report[
        "flags"
    ]

    rejected = letters(Path(config.job.dead_letter))
    assert sorted(letter["error"] for letter in rejected) == ["invalid_json", "late"]
    # The bad record came in while window 0 was open: its letter is published with it.
    runs = check_letters_published_by_the_protocol(config)
    first = Path(config.job.dead_letter) / f"rejected-{config.run_name('window-000000')}.jsonl"
    assert [json.loads(line)["error"] for line in first.read_text().splitlines()] == [
        "invalid_json"
    ]
    late_letter = next(letter for letter in rejected if letter["error"] == "late")
    assert "after window-000000 was published" in late_letter["message"]
    assert "window-000000" in runs
    cumulative = json.loads((Path(config.job.output) / "cumulative.json").read_text())
    assert cumulative["rows"] == 7 and cumulative["windows"] == 2 and "rejected" not in cumulative
    assert stream_counts(config.job.dead_letter) == {"read": 9, "exported": 7, "rejected": 2}
    assert cumulative["published_until_ms"] == 2 * MINUTE  # the trace's zero is at 0 here

    # The same records, less the late one, through the batch job.
    batch_input = write_jsonl(tmp_path / "batch.jsonl", on_time + [within_lateness])
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(batch_input),
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
    streamed = [line for window in windows for line in trace_lines(window)]
    assert streamed == trace_lines(tmp_path / "batch")


@pytest.mark.slow  # a streaming pipeline: ~10 s
def test_windows_are_cut_from_the_traces_zero_and_equal_batch(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """The first request at 00:37:12.345 of a day, one-minute windows: window k holds [zero + k
    min, zero + (k + 1) min), not the epoch's minutes (which would publish the zero's seconds
    and ms). A request earlier than those before it, before any window is published, moves the
    zero and the windows with it."""
    from apache_beam.testing.test_stream import TestStream

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    zero = 1_767_225_600_000 + 37 * MINUTE + 12_345
    offsets = [20_000, 0, 59_999, 60_000, 119_000, 150_000]
    records = [stream_chat(zero + offset, i) for i, offset in enumerate(offsets)]
    config = streaming_config(tmp_path, tiny_tokenizer)
    stream = (
        TestStream()
        .add_elements([message(records[0])])
        .advance_watermark_to(10)  # long before any window is due: the zero is 20 s
        .add_elements([message(r) for r in records[1:]])
        .advance_watermark_to_infinity()
    )
    run_stream(config, stream)
    windows = sorted(p for p in Path(config.job.output).iterdir() if p.is_dir())
    published = [[json.loads(line)["timestamp"] for line in trace_lines(w)] for w in windows]
    assert published == [[0, 20_000, 59_999], [60_000, 119_000], [150_000]]
    cumulative = json.loads((Path(config.job.output) / "cumulative.json").read_text())
    assert (cumulative["windows"], cumulative["published_until_ms"]) == (3, 3 * MINUTE)
    batch_input = write_jsonl(tmp_path / "batch.jsonl", records)
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(batch_input),
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
    assert [line for w in windows for line in trace_lines(w)] == trace_lines(tmp_path / "batch")


def published_files(folder: Path, key: str = "\0") -> dict[str, bytes]:
    """Each file's bytes by its name, a stream's key (its output's, naming its letters and
    counts) taken out of names (no name holds the default)."""
    return {
        str(p.relative_to(folder)).replace(key, "KEY"): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file()
    }


@pytest.mark.slow  # two streaming pipelines: ~20 s
def test_the_id_maps_shard_count_never_changes_a_byte(tiny_tokenizer, tmp_path, monkeypatch):
    """One key or seven holding the map: every window's files, cumulative.json and the letters
    are the same bytes, and the windows concatenated are the batch job's trace (ids shared
    across windows, so each window's ids come from stores fed by earlier windows)."""
    import dataclasses

    from apache_beam.testing.test_stream import TestStream

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    # Sessions and prompts repeat across the windows: later windows reuse earlier ids.
    records = [stream_chat(15_000 * i, i % 5) for i in range(12)]
    outputs = {}
    for shards in (1, 7):
        folder = tmp_path / f"shards-{shards}"
        folder.mkdir()
        config = dataclasses.replace(streaming_config(folder, tiny_tokenizer), id_shards=shards)
        stream = (
            TestStream()
            .add_elements([message(r) for r in records[:6]] + [b"not json"])
            .advance_watermark_to(10)
            .add_elements([message(r) for r in records[6:]])
            .advance_watermark_to_infinity()
        )
        run_stream(config, stream)
        outputs[shards] = (
            published_files(Path(config.job.output)),
            published_files(Path(config.job.dead_letter), config.stream_key()),
        )
    windows = sorted({name.split("/")[0] for name in outputs[1][0] if "/" in name})
    assert windows == ["window-000000", "window-000001", "window-000002"]
    assert outputs[1] == outputs[7]
    batch_input = write_jsonl(tmp_path / "batch.jsonl", records)
    arguments = ["anonymize", "--input", str(batch_input), "--tokenizer", tiny_tokenizer]
    assert main([*arguments, "--block-size", "4", "--output", str(tmp_path / "batch")]) == 0
    streamed = [
        line
        for window in windows
        for line in trace_lines(tmp_path / "shards-7" / "stream" / window)
    ]
    assert streamed == trace_lines(tmp_path / "batch")
