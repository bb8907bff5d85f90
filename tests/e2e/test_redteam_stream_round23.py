"""Red team round 23, the streaming pipeline: reproducers of holes in its promises (the zero's
epoch never published and a stray clock's request never the zero; requests produced in order
never late; a window published once its deadline passes; a published window never replaced),
run on Beam's DirectRunner with a TestStream (its source's clock: the watermark), through the
CLI, or on the stream's clock itself (Progress)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from helpers import STREAM_START_MS, stream_counts

HOUR = 3_600_000
DAY = 24 * HOUR
RESET_MS = 946_684_800_000  # 2000-01-01T00:00:00Z: where a reset clock starts
SALT = "a-streaming-test-salt-0123456789abcdef"

pytestmark = pytest.mark.slow


def published_times(output: Path) -> list[int]:
    """Every published row's timestamp (ms from the trace's zero), across the stream's windows."""
    return sorted(
        json.loads(line)["timestamp"]
        for path in output.glob("window-*/trace-*.jsonl")
        for line in path.read_text().splitlines()
    )


@pytest.mark.beam
def test_a_reset_clocks_request_first_in_a_quiet_stream_never_becomes_the_zero(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: the zero's epoch is never published, and a stray clock's request is a dead
    letter, never the zero (docs/STREAMING.md, Windows from the zero; the batch job's rule,
    read/timestamps.plausible_days: a timestamp more than 7 days from the bulk is no request of
    the input). The first window is judged only against what came before it: one request from
    a reset clock (2000-01-01T00:00:00Z) first, then a quiet window plus the idle time, and it is
    the bulk, the first window, the zero. The real requests that follow are the bulk from then on
    (so plausible) and are published from that zero: each row's timestamp is its epoch time
    minus 2000-01-01 exactly, every later request's wall-clock time published, and `kvtrace
    audit` passes the folder (checked by hand: "stream verdict: publishable"). The batch job
    of the same records letters the reset and counts from the first real request."""
    from apache_beam.testing.test_stream import TestStream

    from helpers import message, run_stream, stream_chat, streaming_config

    monkeypatch.setenv("KVTRACE_SALT", SALT)
    reset = stream_chat(RESET_MS, 0)
    real = [stream_chat(STREAM_START_MS + 1000 * i, 1 + i) for i in range(5)]
    config = streaming_config(tmp_path, tiny_tokenizer)
    quiet = int(time.time()) + 300  # the source's clock (s): a window and its idle time later
    stream = (
        TestStream()
        .add_elements([message(reset)])
        .advance_watermark_to(quiet)
        .add_elements([message(r) for r in real])
        .advance_watermark_to_infinity()
    )
    run_stream(config, stream)
    times = published_times(Path(config.job.output))
    # As the batch job publishes them: no row a clock gap (over 7 days) from the one before it.
    assert max(b - a for a, b in zip(times, times[1:])) <= 7 * DAY, times


@pytest.mark.beam
def test_one_relative_time_first_in_a_quiet_stream_does_not_letter_every_request_after_it(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: every request exported or a dead letter for what is wrong with it, as the
    batch job judges it. Same cause as above, the other kind of time: one message with
    "timestamp": 0 (a client's default, a relative time) first, then a quiet window, fixes the
    stream's kind of time as relative (docs/STREAMING.md: "from then on a request of the other
    kind ... is a dead letter, timestamp_kind_mismatch"): every real request the stream reads
    afterwards, forever, is a letter, and nothing more is published. The batch job of the same
    records exports the 5 real requests and letters the one."""
    from apache_beam.testing.test_stream import TestStream

    from helpers import message, run_stream, stream_chat, streaming_config

    monkeypatch.setenv("KVTRACE_SALT", SALT)
    stray = stream_chat(0, 0)
    real = [stream_chat(STREAM_START_MS + 1000 * i, 1 + i) for i in range(5)]
    config = streaming_config(tmp_path, tiny_tokenizer)
    quiet = int(time.time()) + 300
    stream = (
        TestStream()
        .add_elements([message(stray)])
        .advance_watermark_to(quiet)
        .add_elements([message(r) for r in real])
        .advance_watermark_to_infinity()
    )
    run_stream(config, stream)
    assert stream_counts(tmp_path / "stream-rejected")["exported"] >= 5


@pytest.mark.beam
def test_two_requests_hours_ahead_do_not_make_the_streams_next_requests_late(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: requests produced in order are never late (docs/STREAMING.md, Event time).
    Round 22's fix (Progress.latest_ms) holds the clock for one request more than a window
    ahead, alone in its window, until a second witness: a producer logging in local time (9
    hours ahead) writes more than one line, and its second line is that witness. Its two
    requests move the stream's clock 9 hours on, window 0 closes as soon as the watermark
    passes, and a request of window 0 produced a moment later is a `late` letter. The batch
    job exports all 6 requests."""
    from apache_beam.testing.test_stream import TestStream

    from helpers import message, run_stream, stream_chat, streaming_config

    monkeypatch.setenv("KVTRACE_SALT", SALT)
    first = [stream_chat(STREAM_START_MS + 10_000 * i, i) for i in range(3)]
    ahead = [stream_chat(STREAM_START_MS + 9 * HOUR + 1000 * i, 3 + i) for i in range(2)]
    after = stream_chat(STREAM_START_MS + 30_000, 5)  # window 0, produced after `ahead`
    config = streaming_config(tmp_path, tiny_tokenizer, lateness_ms=5_000, idle_ms=HOUR)
    arrived = int(time.time()) + 120  # the source's clock: past every arrival so far
    stream = (
        TestStream()
        .add_elements([message(r) for r in first + ahead])
        .advance_watermark_to(arrived)
        .add_elements([message(after)])
        .advance_watermark_to_infinity()
    )
    run_stream(config, stream)
    assert stream_counts(tmp_path / "stream-rejected") == {"read": 6, "exported": 6, "rejected": 0}


@pytest.mark.beam
def test_a_batch_night_never_replaces_a_streams_published_window(
    tiny_tokenizer, tmp_path, monkeypatch, capsys
):
    """Promise: nothing lost (a window published stays as published: a published record is
    never silently replaced), and nothing is written inside a command's output folder
    (publish._check_not_in_an_output: a night inside a night's output is refused). A stream's
    folder carries no manifest and no output mark (anonymize_streaming.make_stream_folder), so
    it is no command's output to the plan: a batch night given --output STREAM/window-000001 (a
    re-run of an hour, a typo) finds an earlier kvtrace output there and replaces it whole,
    saying it succeeded, while the stream holds only its own folder's lock. The stream's
    published records of that window are gone (their messages acked long ago; its run counts
    still say exported), its ids now another run's; the folder is left NOT publishable (the
    audit flags it), and a window the night adds ahead of the stream is one the stream
    replaces or is refused by next."""
    from apache_beam.testing.test_stream import TestStream

    from helpers import message, run_stream, stream_chat, streaming_config, write_jsonl
    from kvtrace.cli import main

    monkeypatch.setenv("KVTRACE_SALT", SALT)
    config = streaming_config(tmp_path, tiny_tokenizer)
    records = [stream_chat(STREAM_START_MS + 20_000 * i, i) for i in range(6)]  # two minutes
    run_stream(
        config,
        TestStream().add_elements([message(r) for r in records]).advance_watermark_to_infinity(),
    )
    window = Path(config.job.output) / "window-000001"
    before = (window / "manifest.json").read_bytes()
    night = tmp_path / "night.jsonl"
    write_jsonl(night, [stream_chat(STREAM_START_MS + i, 10 + i) for i in range(3)])
    code = main(
        [
            "anonymize",
            "--input",
            str(night),
            "--output",
            str(window),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
        ]
    )
    assert (window / "manifest.json").read_bytes() == before
    assert code == 2 and "lies inside" in capsys.readouterr().err


@pytest.mark.beam
def test_a_stream_quiet_for_over_a_week_publishes_its_next_windows_at_their_deadlines(tmp_path):
    """Promise: once the watermark passes a window's end plus the allowed lateness (or the idle
    rule's time after it) the window is published whole (docs/STREAMING.md, first paragraph),
    its requests published or dead letters, never held on. The stream's clock is its latest
    request within the bulk of its input (Progress.latest_ms, plausible_days over everything
    published): after a quiet spell of more than MAX_GAP_DAYS (a service down over a holiday),
    the requests that follow are outside the bulk until they outnumber every request the stream
    ever published, so they never move the clock, and the idle rule counts from the bulk's
    latest request, 8 days back: no window after the gap is due, whatever the watermark. A
    stream that ran a month holds a month of new requests in its state (a runner's memory,
    lost to a hard kill, as BOUNDS says of open windows) before it publishes again. Here 6
    requests were published, 4 came 8 days later, one of them past their window's deadline,
    and an hour of the source's clock later their window is still not due."""
    from helpers import MINUTE, streaming_config
    from kvtrace.pipelines.anonymize_streaming import Progress
    from kvtrace.transforms.encode.hashed_batch import HashedBatch, HashedRequest
    from kvtrace.transforms.encode.timestamp_kinds import keep_arriving, sum_kind_counts

    config = streaming_config(tmp_path, "x")
    now = 1_800_000_000_000  # the source's clock
    progress = Progress()

    def held(window: int, times: list[int], arrived: int) -> None:
        """As the controller holds requests once anchored: judged first (PublishWindows._wait)."""
        batch = HashedBatch.pack(
            [HashedRequest(t, i, 1, 1, b"", None) for i, t in enumerate(times)]
        )
        anchor = sum_kind_counts([progress.published_days, progress.waiting])
        kept, _ = keep_arriving(batch, anchor)
        if kept is not None:
            progress.saw(config, window, kept.requests["timestamp_ms"], arrived)

    progress.saw(config, 0, [10_000 + i for i in range(6)], now)
    progress.publish(0)
    after = 8 * DAY  # the window after the quiet spell
    held(after, [after + 1, after + 2, after + 3], now + 1)
    held(after + 2 * MINUTE, [after + 2 * MINUTE], now + 2)  # past its deadline
    # Decided by then: due (published, or its requests letters as the batch job's rule has
    # them while they are fewer), or no longer held.
    assert after in progress.due(config, now + HOUR) or after not in progress.passed_ms
