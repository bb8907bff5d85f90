"""Red team round 3 (t33-rt3-det): determinism and time. Each test asserts a promise and fails
today."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.slow

SALT = "a-streaming-test-salt-0123456789abcdef"
MINUTE = 60_000
DAY_MS = 86_400_000


def _stream_chat(ts: int, i: int) -> dict:
    return {
        "timestamp": ts,
        "session_id": f"s{i % 2}",
        "output_length": 3,
        "messages": [
            {"role": "system", "content": "a shared system prompt about caches"},
            {"role": "user", "content": f"question {i} " + "the quick brown fox " * (i % 4)},
        ],
    }


@pytest.mark.beam  # the stream runs on Beam in this process
def test_a_clock_reset_in_a_stream_does_not_close_its_windows_early(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: streaming publishes what batch publishes for the same records; a clock reset
    is a dead letter, never the stream's clock. One request a year ahead (a clock gone wrong)
    is dead-lettered at the window's publication (keep_plausible_windows), but its time stays
    the stream's latest_ms (Progress.saw): every open window's deadline counts as passed, the
    window closes as soon as the watermark passes, and a request of that window arriving a
    moment later (30 s into a one-minute window) is late: not exported (here not even a
    published letter: a late letter with no later window waits on a real-time timer the
    stream's end never fires, so 5 requests in, 3 rows + 1 letter out). The batch job exports
    it (only the reset is a letter)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
    from apache_beam.testing.test_stream import TestStream

    from helpers import write_jsonl
    from kvtrace.cli import main
    from kvtrace.pipelines.anonymize_config import AnonymizeConfig
    from kvtrace.pipelines.anonymize_streaming import StreamingConfig, build
    from kvtrace.transforms.encode.salt import SaltSource

    monkeypatch.setenv("KVTRACE_SALT", SALT)
    zero = 1_767_225_600_000
    first = [_stream_chat(zero + 10_000 * i, i) for i in range(3)]
    reset = _stream_chat(zero + 365 * DAY_MS, 3)
    after = _stream_chat(zero + 30_000, 4)  # window 0, well inside it
    output = tmp_path / "stream"
    output.mkdir()
    (tmp_path / "staging").mkdir()
    job = AnonymizeConfig(
        inputs=(),
        output=str(output),
        staging=str(tmp_path / "staging"),
        tokenizer=tiny_tokenizer,
        salt=SaltSource("env", "KVTRACE_SALT"),
        dead_letter=str(tmp_path / "stream-rejected"),
        block_size=4,
    )
    config = StreamingConfig(job, "pubsub:projects/p/subscriptions/s", MINUTE, 5_000, 3_600_000)
    arrived = int(time.time()) + 120
    stream = (
        TestStream()
        .add_elements([json.dumps(r).encode() for r in first + [reset]])
        .advance_watermark_to(arrived)
        .add_elements([json.dumps(after).encode()])
        .advance_watermark_to_infinity()
    )
    with beam.Pipeline(
        runner=BundleBasedDirectRunner(), options=PipelineOptions(["--streaming"])
    ) as pipeline:
        build(pipeline | stream, config)
    letters = [
        json.loads(line)["error"]
        for p in sorted((tmp_path / "stream-rejected").rglob("rejected-*.jsonl"))
        for line in p.read_text().splitlines()
    ]
    streamed = sum(len(p.read_text().splitlines()) for p in output.rglob("trace-*.jsonl"))

    batch_input = write_jsonl(tmp_path / "batch.jsonl", first + [reset, after])
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
    batch_rows = sum(
        len(p.read_text().splitlines()) for p in (tmp_path / "batch").glob("trace-*.jsonl")
    )
    assert batch_rows == 4
    assert (streamed, sorted(letters)) == (4, ["implausible_timestamp"]), (
        f"stream exported {streamed} rows, letters {letters}: the reset's time closed window 0"
    )


@pytest.mark.beam  # the stream runs on Beam in this process
def test_a_streams_windows_do_not_split_a_timestamp_granule(tiny_tokenizer, tmp_path, monkeypatch):
    """Promise: the stream's windows concatenated are the batch job's bytes for the same
    records; with --timestamp-granularity-ms the rows of one published time come out in the
    published order (time, then input_length, output_length: ids/row_order.py), never in their
    finer raw order. Windows are cut at zero + k W on raw times (by_window) but granules are
    rounded half up ([k g - g/2, k g + g/2)), so a granule straddles each window's end: a long
    request 300 ms before the window's end and a short one 200 ms after it both publish at
    60 000, yet the stream writes the long one first (in window 0) and numbers its blocks first;
    the batch job writes the short one first. The raw order inside the granule is published."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
    from apache_beam.testing.test_stream import TestStream

    from helpers import write_jsonl
    from kvtrace.cli import main
    from kvtrace.pipelines.anonymize_config import AnonymizeConfig
    from kvtrace.pipelines.anonymize_streaming import StreamingConfig, build
    from kvtrace.transforms.encode.salt import SaltSource
    from kvtrace.transforms.write.coarsen import Coarsening

    monkeypatch.setenv("KVTRACE_SALT", SALT)
    zero = 1_767_225_600_000
    records = [
        _stream_chat(zero, 0),
        _stream_chat(zero + MINUTE - 300, 3),
        _stream_chat(zero + MINUTE + 200, 1),
        _stream_chat(zero + 3 * MINUTE, 2),
    ]
    output = tmp_path / "stream"
    output.mkdir()
    (tmp_path / "staging").mkdir()
    job = AnonymizeConfig(
        inputs=(),
        output=str(output),
        staging=str(tmp_path / "staging"),
        tokenizer=tiny_tokenizer,
        salt=SaltSource("env", "KVTRACE_SALT"),
        dead_letter=str(tmp_path / "stream-rejected"),
        block_size=4,
        coarsening=Coarsening(1000, 1),
    )
    config = StreamingConfig(job, "pubsub:projects/p/subscriptions/s", MINUTE, 0, 10_000)
    stream = (
        TestStream()
        .add_elements([json.dumps(r).encode() for r in records])
        .advance_watermark_to_infinity()
    )
    with beam.Pipeline(
        runner=BundleBasedDirectRunner(), options=PipelineOptions(["--streaming"])
    ) as pipeline:
        build(pipeline | stream, config)
    streamed = [
        line
        for window in sorted(p for p in output.iterdir() if p.is_dir())
        for path in sorted(window.glob("trace-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
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
                "--timestamp-granularity-ms",
                "1000",
            ]
        )
        == 0
    )
    batch = [
        line
        for path in sorted((tmp_path / "batch").glob("trace-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert [json.loads(line)["timestamp"] for line in batch] == [0, 60_000, 60_000, 180_000]
    assert streamed == batch


@pytest.mark.beam  # the stream runs on Beam
def test_a_clock_reset_arriving_alone_is_a_dead_letter_not_a_window(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: a clock reset is a dead letter, in a stream as in batch (keep_plausible_windows:
    'a stray clock's lone window is dead letters'). It is judged only against the windows
    waiting with it: one that arrives while no other window waits (the earlier ones published)
    is the bulk of its own judgement, and is published as a window a year ahead. The stream's
    clock is then a year ahead: every later real request is late, never exported. The batch job
    dead-letters the reset and exports the rest."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
    from apache_beam.testing.test_stream import TestStream

    from helpers import write_jsonl
    from kvtrace.cli import main
    from kvtrace.pipelines.anonymize_config import AnonymizeConfig
    from kvtrace.pipelines.anonymize_streaming import StreamingConfig, build
    from kvtrace.transforms.encode.salt import SaltSource

    monkeypatch.setenv("KVTRACE_SALT", SALT)
    zero = 1_767_225_600_000
    first = [_stream_chat(zero + 10_000 * i, i) for i in range(3)]
    reset = _stream_chat(zero + 365 * DAY_MS, 3)
    then = [_stream_chat(zero + 2 * MINUTE + 10_000 * i, 4 + i) for i in range(3)]
    output = tmp_path / "stream"
    output.mkdir()
    (tmp_path / "staging").mkdir()
    job = AnonymizeConfig(
        inputs=(),
        output=str(output),
        staging=str(tmp_path / "staging"),
        tokenizer=tiny_tokenizer,
        salt=SaltSource("env", "KVTRACE_SALT"),
        dead_letter=str(tmp_path / "stream-rejected"),
        block_size=4,
    )
    config = StreamingConfig(job, "pubsub:projects/p/subscriptions/s", MINUTE, 0, 10_000)
    now = int(time.time())
    stream = (
        TestStream()
        .add_elements([json.dumps(r).encode() for r in first])
        .advance_watermark_to(now + 1_000)  # idle: window 0 published
        .add_elements([json.dumps(reset).encode()])
        .advance_watermark_to(now + 2_000)  # idle: the reset's window is due
        .add_elements([json.dumps(r).encode() for r in then])
        .advance_watermark_to_infinity()
    )
    with beam.Pipeline(
        runner=BundleBasedDirectRunner(), options=PipelineOptions(["--streaming"])
    ) as pipeline:
        build(pipeline | stream, config)
    streamed = [
        json.loads(line)["timestamp"]
        for window in sorted(p for p in output.iterdir() if p.is_dir())
        for path in sorted(window.glob("trace-*.jsonl"))
        for line in path.read_text().splitlines()
    ]

    batch_input = write_jsonl(tmp_path / "batch.jsonl", first + [reset] + then)
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
    batch = [
        json.loads(line)["timestamp"]
        for path in sorted((tmp_path / "batch").glob("trace-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert batch == [0, 10_000, 20_000, 120_000, 130_000, 140_000]
    assert streamed == batch, f"stream published times {streamed}"


@pytest.mark.beam  # the stream runs on Beam in this process
def test_letters_after_the_last_window_are_not_lost_when_the_stream_ends(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: every record is exported or dead-lettered, the counts add up (cumulative.json:
    rows + rejected = records read). Letters that come after the last window was published (a
    late request, a line that is not JSON) wait for the LETTERS timer, a REAL_TIME one 10 s
    out; the stream ending (watermark to infinity: a backfill's end, a drain) fires the
    event-time timers only, so they are never published nor counted: 5 records in, 3 rows and
    0 letters out."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
    from apache_beam.testing.test_stream import TestStream

    from kvtrace.pipelines.anonymize_config import AnonymizeConfig
    from kvtrace.pipelines.anonymize_streaming import StreamingConfig, build
    from kvtrace.transforms.encode.salt import SaltSource

    monkeypatch.setenv("KVTRACE_SALT", SALT)
    zero = 1_767_225_600_000
    output = tmp_path / "stream"
    output.mkdir()
    (tmp_path / "staging").mkdir()
    job = AnonymizeConfig(
        inputs=(),
        output=str(output),
        staging=str(tmp_path / "staging"),
        tokenizer=tiny_tokenizer,
        salt=SaltSource("env", "KVTRACE_SALT"),
        dead_letter=str(tmp_path / "stream-rejected"),
        block_size=4,
    )
    config = StreamingConfig(job, "pubsub:projects/p/subscriptions/s", MINUTE, 0, 10_000)
    now = int(time.time())
    stream = (
        TestStream()
        .add_elements([json.dumps(_stream_chat(zero + 10_000 * i, i)).encode() for i in range(3)])
        # Past window 0's deadline, in order: window 0 published (round 24: idle time alone
        # never fixes a stream's zero).
        .add_elements([json.dumps(_stream_chat(zero + 70_000, 3)).encode()])
        .advance_watermark_to(now + 1_000)
        .add_elements([json.dumps(_stream_chat(zero + 5_000, 9)).encode(), b"not json"])
        .advance_watermark_to_infinity()
    )
    with beam.Pipeline(
        runner=BundleBasedDirectRunner(), options=PipelineOptions(["--streaming"])
    ) as pipeline:
        build(pipeline | stream, config)
    cumulative = json.loads((output / "cumulative.json").read_text())
    letters = [
        line
        for p in (tmp_path / "stream-rejected").rglob("rejected-*.jsonl")
        for line in p.read_text().splitlines()
    ]
    from helpers import stream_counts

    counts = stream_counts(tmp_path / "stream-rejected")  # the operator's, not published
    assert (cumulative["rows"], counts["rejected"], len(letters)) == (4, 2, 2), (cumulative, counts)
