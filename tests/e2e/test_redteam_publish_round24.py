"""Red team round 24, the gate's publishing side: reproducers of holes in its promises (nothing
private published: the audit passes only bytes kvtrace would write, and fails closed; what
kvtrace writes, its own audit passes), on streams written by the real streaming pipeline (Beam's
DirectRunner with a TestStream) and audited by `kvtrace audit`'s own function."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from helpers import STREAM_SALT, STREAM_START_MS

DAY = 86_400_000
RESET_MS = 946_684_800_000  # 2000-01-01T00:00:00Z: where a reset clock starts

pytestmark = pytest.mark.slow


def stream_of(tmp_path: Path, tokenizer: str, *bursts: list[int]) -> Path:
    """A stream's output folder as anonymize --streaming writes it: each burst's requests (epoch
    ms), the source's clock moved past a window and its idle time between bursts."""
    from apache_beam.testing.test_stream import TestStream

    from helpers import message, run_stream, stream_chat, streaming_config

    config = streaming_config(tmp_path, tokenizer)
    stream, clock, i = TestStream(), int(time.time()), 0
    for burst in bursts:
        stream = stream.add_elements(
            [message(stream_chat(ms, i + k)) for k, ms in enumerate(burst)]
        )
        i, clock = i + len(burst), clock + 300
        stream = stream.advance_watermark_to(clock)
    run_stream(config, stream.advance_watermark_to_infinity())
    return Path(config.job.output)


@pytest.mark.beam
def test_a_streams_mark_claiming_a_window_it_never_wrote_carries_no_free_bytes(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: the gate passes no bytes kvtrace would not write, in a kept attribute as in a
    file (docs/AUDIT.md: every extended attribute refused but the SELinux label; a copy with
    `cp -a`, `rsync -X` or `tar --xattrs` publishes them). Round 23 let a stream's folder keep
    its output mark (`user.kvtrace.output`, claim_window), and the audit passes the mark when its
    bytes are exactly a stream's mark naming ANY window (audit._audit_stream: window_index(
    claimed_by(...)) is not None), not the window the stream last claimed. Past a million
    windows window_name writes a "~" per extra digit, so `claimed` may be a number of ~2,000
    digits (the mark's 4 KiB): ~6,600 bits of chosen bytes, here a card number and a
    diagnosis, in a folder the audit calls publishable. The stream itself claims only its next
    window (the last it published, or one more while that one is being published)."""
    from kvtrace.transforms.stats import audit as gate
    from kvtrace.transforms.trace_format import window_name
    from kvtrace.transforms.write.publish import OUTPUT_MARK, STREAM_WRITER

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    stream = stream_of(tmp_path, tiny_tokenizer, [STREAM_START_MS + 1000 * i for i in range(4)])
    assert gate.audit(str(stream), tiny_tokenizer)["publishable"]  # as the stream left it
    secret = b"Jane Doe, HIV positive, card 4111 1111 1111 1111. " * 8
    mark = {"claimed": window_name(int.from_bytes(secret, "big")), "files": []}
    os.setxattr(
        stream, OUTPUT_MARK, json.dumps({**mark, "writer": STREAM_WRITER}, sort_keys=True).encode()
    )
    report = gate.audit(str(stream), tiny_tokenizer)
    assert not report["publishable"], "a mark holding 400 chosen bytes passed"


@pytest.mark.beam
def test_a_stream_resumed_after_a_quiet_week_is_passed_by_its_own_audit(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: what anonymize writes, `kvtrace audit` passes (a false refusal of kvtrace's own
    output leaves a provider no way to publish the stream). A stream that published a trickle
    (2 requests), went quiet 9 days (a holiday) and resumed with more requests than it had
    published publishes them (docs/STREAMING.md, Clock resets: a window off the clock is
    published once its requests are no longer fewer than the bulk), 9 days after its first
    window's rows; round 23's audit (now _Rows._check_gaps) refuses every stream whose rows lie 8
    days or more apart, so this stream, and every window it adds, is never publishable. Fixed
    when the stream and its gate agree: it publishes no row its gate refuses (letters them, or
    ends the stream), or the gate passes what it publishes."""
    from kvtrace.transforms.stats import audit as gate

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    trickle = [STREAM_START_MS, STREAM_START_MS + 1000]
    resumed = [STREAM_START_MS + 9 * DAY + 1000 * i for i in range(5)]
    stream = stream_of(tmp_path, tiny_tokenizer, trickle, resumed)
    times = sorted(
        json.loads(line)["timestamp"]
        for path in stream.glob("window-*/trace-*.jsonl")
        for line in path.read_text().splitlines()
    )
    # Decided (docs/STREAMING.md, Windows from the zero): no row is published a gap over
    # MAX_GAP_DAYS from the others. The trickle, passed by no request of its run, fixed no zero;
    # the stream's end judged both bursts by the batch rule: the resumed five published, the
    # trickle two letters (as the batch job of the same records has them).
    assert len(times) == 5
    report = gate.audit(str(stream), tiny_tokenizer)
    assert report["publishable"], report["flags"]


@pytest.mark.beam
def test_two_requests_of_a_reset_clock_first_in_a_stream_are_not_its_zero(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: a stray clock's request is never the stream's zero, and the stream writes only
    what its gate passes (docs/STREAMING.md, Windows from the zero). Round 23 fixed the zero only
    once a second request stands in the bulk beside the first (Progress.witnessed): two requests
    of one reset clock (a device restarted at 2000-01-01, sending two requests) witness each
    other, become the first window and the zero, and the real requests that follow outnumber
    them and are published from it, each row's timestamp its wall-clock time minus 2000-01-01
    to the millisecond, into the stream's output folder. Only the gate's gap rule stops it:
    the stream is never publishable again. The batch job of the same records letters the two
    and counts from the first real request (read/timestamps.plausible_days)."""
    from kvtrace.transforms.stats import audit as gate

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    reset = [RESET_MS, RESET_MS + 1000]
    real = [STREAM_START_MS + 1000 * i for i in range(5)]
    stream = stream_of(tmp_path, tiny_tokenizer, reset, real)
    report = gate.audit(str(stream), tiny_tokenizer)
    assert report["publishable"], report["flags"]
