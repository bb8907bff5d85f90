"""Red team round 25, the streaming pipeline: reproducers of holes in its promises (a window
published once a request of its run passed its deadline, whatever windows between them stayed
empty; nothing read lost when the writer fails after a window's publish), run on Beam's DirectRunner with a TestStream (its source's clock: the watermark)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from helpers import MINUTE, STREAM_SALT, STREAM_START_MS, letters, stream_counts

pytestmark = pytest.mark.slow


def sparse_then_one_back(tokenizer: str, tmp_path: Path, gap_ms: int) -> Path:
    """Four requests of 2026 produced in order gap_ms apart, each arriving 20 s of the source's
    clock after the one before (the watermark past its arrival), then one request of the first
    minute arriving last; the dead-letter folder."""
    from apache_beam.testing.test_stream import TestStream

    from helpers import message, run_stream, stream_chat, streaming_config

    config = streaming_config(tmp_path, tokenizer)  # one-minute windows, no lateness
    now = int(time.time())  # the source's clock (s)
    stream = TestStream()
    for i in range(4):
        stream = stream.add_elements([message(stream_chat(STREAM_START_MS + gap_ms * i, i))])
        stream = stream.advance_watermark_to(now + 20 * i + 1)
    stream = stream.add_elements([message(stream_chat(STREAM_START_MS + 30_000, 9))])
    run_stream(config, stream.advance_watermark_to_infinity())
    return Path(config.job.dead_letter)


@pytest.mark.beam
def test_a_sparse_streams_first_window_is_published_once_a_later_request_passed_it(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: before the zero, "a window is due once a request of its run, in order, passes
    its deadline" and the watermark passed that request's arrival (docs/STREAMING.md, Windows
    from the zero; tests/e2e/test_streaming_cli.py). With requests a minute and 5 s apart that
    holds: window-000000 goes out when the second request came in, and a request of its minute
    arriving after three more is `late`. Five minutes apart (a quiet stream: every request in a
    window of its own, the windows between them empty) each request is a contiguous segment of
    its own (stream_windows.Progress.saw moves only the segment's clock), so no request ever
    passes another segment's window: nothing is published, however many requests of the same
    run come in order past the deadlines, until the stream ends or MAX_GAP_DAYS (7 days) of the
    source's clock pass (the hold's bound). A live stream quieter than one request per window
    (hour windows by default: a night's trickle) holds every request for a week, in state a
    SIGKILL loses (docs/STREAMING.md, Bound: the DirectRunner acknowledges on pull); here the
    first minute's request arriving last joins window-000000 as if it had never closed."""
    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    rejected = sparse_then_one_back(tiny_tokenizer, tmp_path, 5 * MINUTE)
    assert [letter["error"] for letter in letters(rejected)] == ["late"]
    assert stream_counts(rejected) == {"read": 5, "exported": 4, "rejected": 1}


@pytest.mark.beam
def test_a_writer_failing_after_a_windows_publish_loses_none_of_what_the_stream_read(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: every message exported once or dead-lettered with a reason; a writer that
    cannot write drains the stream and stops it in one line, or counts in that line what was
    neither published nor lettered (docs/STREAMING.md: "A window the writer cannot publish ...
    is never lost"). Round 24's fix (WriteWindows._write) catches a failure only inside
    _publish_window: one right after it, in write_cumulative (cumulative.json or the run
    counts: the disk filled by the window's own files, the dead-letter folder's disk full or
    its permission changed), escapes the DoFn, Beam retries the bundle 4 times (publishing
    window-000000 again each time) and the job dies undrained: the requests of the windows
    still open were read (acknowledged on pull on the DirectRunner) and are published nowhere,
    lettered nowhere, counted nowhere, and no line says so. Here a directory stands where
    cumulative.json is written first (its .tmp): window-000000's four requests and the poison
    message's letter are published, the two requests of window 2 are gone."""
    from apache_beam.testing.test_stream import TestStream

    from helpers import message, run_stream, stream_chat, streaming_config
    from kvtrace.pipelines import stream_drain

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    monkeypatch.setattr(stream_drain, "_FAILURES", [])
    config = streaming_config(tmp_path, tiny_tokenizer)
    output = Path(config.job.output)
    (output / ".cumulative.json.tmp").mkdir()  # cumulative.json cannot be written
    now = int(time.time())  # the source's clock (s)
    first = [message(stream_chat(STREAM_START_MS + 1000 * i, i)) for i in range(4)]
    stream = (
        TestStream()
        .add_elements([*first, b"not json"])
        .advance_watermark_to(now + 1)
        .add_elements([message(stream_chat(STREAM_START_MS + 150_000, 7))])  # passes window 0
        .advance_watermark_to(now + 2)  # window 0 published, then its totals fail
        .add_elements([message(stream_chat(STREAM_START_MS + 160_000, 8))])
        .advance_watermark_to_infinity()
    )
    # The stop: one line, whatever it says. Handed to stream_drain, which the CLI's
    # run_streaming raises once drained; the test runner (run_stream) only runs the pipeline.
    run_stream(config, stream)
    (line,) = [str(failure) for failure in stream_drain._FAILURES]
    assert "\n" not in line
    rows = sum(len(path.read_text().splitlines()) for path in output.glob("window-*/trace-*.jsonl"))
    assert rows + len(letters(Path(config.job.dead_letter))) == 7
