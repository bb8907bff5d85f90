"""The streaming driver under exact watermark control (TestStream): windows publish once a request
past their end plus the allowed lateness came in and the source's watermark passed its arrival,
late requests are dead letters, and the windows concatenated are the batch job's output of the
same records. The timing rules and what cumulative.json says are pure, tested without Beam."""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import (
    MINUTE,
    STREAM_SALT,
    agent_log,
    check_letters_published_by_the_protocol,
    letters,
    message,
    run_stream,
    stream_chat,
    stream_counts,
    streaming_config,
)
from kvtrace.pipelines.anonymize_config import AnonymizeConfig
from kvtrace.transforms.dead_letters import DeadLetter
from kvtrace.transforms.encode.hashed_batch import HashedBatch, HashedRequest
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.timestamp_kinds import (
    TIMESTAMP_KIND_MISMATCH,
    keep_input_kind,
    keep_plausible_windows,
    kind_counts,
)
from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.read.timestamps import MAX_GAP_DAYS, day_runs
from kvtrace.transforms.trace_format import window_name
from kvtrace.transforms.write.coarsen import Coarsening, round_to

if TYPE_CHECKING:  # Beam is loaded by the tests that run it, not by collecting them
    from kvtrace.pipelines.anonymize_streaming import StreamingConfig


def requests_at(*timestamps: int) -> HashedBatch:
    return HashedBatch.pack(
        [HashedRequest(ts, i, 1, 1, b"", None) for i, ts in enumerate(timestamps)]
    )


@pytest.mark.beam
def test_the_zero_moves_only_until_a_window_is_published_and_restores_with_the_state(tmp_path):
    """Before the first window an earlier request moves the zero: the waiting requests are cut
    again from it, and a new window whose deadline a request already passed waits for
    everything produced before the latest arrival. Once a window is published the zero is
    fixed, in the state a restored runner goes on from: its windows are cut as before."""
    from kvtrace.pipelines.anonymize_streaming import Progress, by_window

    config = streaming_config(tmp_path, "x")
    progress = Progress()
    waiting = progress.recut(config, 90_000, [(0, requests_at(90_000, 130_000))])
    progress.saw(config, 90_000, 130_000, NOW)
    waiting = progress.recut(config, 50_000, waiting)  # a request at 50 s came in
    assert [(start, part.requests["timestamp_ms"].tolist()) for start, part in waiting] == [
        (50_000, [90_000]),
        (110_000, [130_000]),
    ]
    assert progress.passed_ms == {50_000: NOW, 110_000: None}  # 130 s passed 50 s's deadline
    assert progress.publish(50_000) == "window-000000"
    restored = pickle.loads(pickle.dumps(progress))  # as the runner's state coder keeps it
    later = requests_at(20_000, 160_000, 175_000)
    assert (
        [start for start, _ in by_window(later, restored.origin_ms, MINUTE)]
        == [start for start, _ in by_window(later, progress.origin_ms, MINUTE)]
        == [-10_000, 110_000, 170_000]
    )  # the first one before the zero: late


@pytest.mark.beam
@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(0, 10**7), min_size=1, max_size=30),
    st.integers(1, 10**6),
    st.integers(0, 2 * 10**7),
)
def test_every_request_lands_in_the_one_window_holding_its_timestamp(
    timestamps, window_ms, origin_ms
):
    """Windows are cut from the trace's zero, before it too (a request earlier than the zero is
    late, in a window of its own)."""
    from kvtrace.pipelines.anonymize_streaming import by_window

    batch = HashedBatch.pack(
        [HashedRequest(ts, i, 1, 1, b"", None) for i, ts in enumerate(timestamps)]
    )
    parts = list(by_window(batch, origin_ms, window_ms))
    assert sum(len(part) for _, part in parts) == len(timestamps)
    assert [start for start, _ in parts] == sorted({start for start, _ in parts})
    for start, part in parts:
        assert (start - origin_ms) % window_ms == 0
        assert (
            (start <= part.requests["timestamp_ms"])
            & (part.requests["timestamp_ms"] < start + window_ms)
        ).all()


@pytest.mark.beam
@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 10**7), min_size=1, max_size=30),
    st.integers(1, 10**6),
    st.integers(1, 10**5),
    st.integers(0, 2 * 10**7),
)
def test_a_window_holds_whole_granules(timestamps, window_ms, granularity_ms, origin_ms):
    """With --timestamp-granularity-ms, windows are cut on the published time: every request of
    one published time is in one window, the window holding that time, so the rows of a granule
    come out in the one published order (ids/row_order.py), never split at a window's end."""
    from kvtrace.pipelines.anonymize_streaming import by_window

    batch = requests_at(*timestamps)
    coarsening = Coarsening(timestamp_ms=granularity_ms)
    windows_of: dict[int, set[int]] = {}
    for start, part in by_window(batch, origin_ms, window_ms, coarsening):
        published = origin_ms + round_to(part.requests["timestamp_ms"] - origin_ms, granularity_ms)
        assert ((start <= published) & (published < start + window_ms)).all()
        for time_ms in published.tolist():
            windows_of.setdefault(time_ms, set()).add(start)
    assert all(len(starts) == 1 for starts in windows_of.values())


DAY = 86_400_000
RESET = 365 * DAY  # a clock gone a year ahead


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from([0, DAY, 2 * DAY, 9 * DAY, 17 * DAY, RESET]), min_size=1, max_size=20),
    st.integers(0, 20),
)
def test_a_stream_publishes_no_gap_its_audit_refuses(days, split):
    """However the stream's input splits between what it published (a run of days, as the rule
    lets out) and what waits: with nothing published a waiting request is kept exactly when the
    batch job, judging the whole input, keeps it; after, the published rows and the kept lie in
    one run, no gap over MAX_GAP_DAYS (the audit's gap rule, _Rows._check_gaps), and a request
    in that run is never a letter."""
    timestamps = [day + n for n, day in enumerate(days)]
    published, waiting = timestamps[:split], timestamps[split:]
    if published:  # as the stream publishes them: one run of days
        _, first, last = day_runs(kind_counts(requests_at(*published)))[0]
        published = [t for t in published if first <= t // DAY <= last]
    stream_kept, strays = keep_plausible_windows(
        [(0, requests_at(*waiting))] if waiting else [],
        kind_counts(requests_at(*published)) if published else {},
    )
    kept_times = [t for _, part in stream_kept for t in part.requests["timestamp_ms"].tolist()]
    assert len(kept_times) + len(strays) == len(waiting)
    if not published:
        whole = requests_at(*timestamps)
        batch_kept, _ = keep_input_kind(whole, kind_counts(whole))
        batch_times = [] if batch_kept is None else batch_kept.requests["timestamp_ms"].tolist()
        assert kept_times == [t for t in waiting if t in batch_times]
        return
    rows = sorted(published + kept_times)
    assert all(b // DAY - a // DAY <= MAX_GAP_DAYS for a, b in zip(rows, rows[1:]))
    runs = day_runs(kind_counts(requests_at(*(published + waiting))))
    (_, first, last) = next(r for r in runs if r[1] <= published[0] // DAY <= r[2])
    assert kept_times == [t for t in waiting if first <= t // DAY <= last]


HOSTILE = [
    b"",
    b"\x00\xff\xfe garbage",
    b"[1, 2, 3]",
    b"null",
    b'{"timestamp": -5}',
    b'{"messages": [{"role": "user", "content": "no timestamp"}]}',
    b"[" * 100_000,
    b'{"timestamp": 1e999, "prompt": "x"}',
    b'{"timestamp": 1000, "prompt": "\xed\xa0\x80 lone surrogate bytes"}',
    b'{"timestamp": 2000, "prompt": {"not": "text"}}',
]


@pytest.mark.beam
@pytest.mark.slow  # a streaming pipeline: ~5 s
def test_hostile_messages_are_dead_letters_and_the_counts_add_up(
    tiny_tokenizer, tmp_path, monkeypatch
):
    from apache_beam.testing.test_stream import TestStream

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    config = streaming_config(tmp_path, tiny_tokenizer)
    good = [message(stream_chat(5_000, 1)), message(stream_chat(6_000, 2))]
    run_stream(config, TestStream().add_elements(HOSTILE + good).advance_watermark_to_infinity())
    cumulative = json.loads((Path(config.job.output) / "cumulative.json").read_text())
    counts = stream_counts(config.job.dead_letter)
    rejected = letters(Path(config.job.dead_letter))
    assert counts["read"] == counts["exported"] + counts["rejected"] == len(HOSTILE) + len(good)
    assert len(rejected) == counts["rejected"] and all(r["error"] for r in rejected)
    assert (cumulative["rows"], cumulative["windows"]) == (counts["exported"], 1) == (len(good), 1)
    assert check_letters_published_by_the_protocol(config) <= {"window-000000", "letters-000001"}


def windows_published(
    config: StreamingConfig, arrivals: list[tuple[int, int]], watermark_ms: int
) -> list[int]:
    """Windows due once the source's watermark is at watermark_ms, after requests (event time,
    arrival by the source's clock) came in in that order."""
    from kvtrace.pipelines.anonymize_streaming import Progress

    progress, published = Progress(), []
    for event_ms, arrival_ms in arrivals:
        progress.saw(config, event_ms // config.window_ms * config.window_ms, event_ms, arrival_ms)
    # As the timers fire: what a published window anchors may be due at the same watermark.
    while due := progress.due(config, watermark_ms):
        published += [progress.publish(window) and window for window in due]
    return published


NOW = 1_800_000_000_000  # the source's clock: long after the requests' own times


@pytest.mark.beam
def test_a_backfill_is_timed_by_its_requests_not_by_when_it_was_produced(tmp_path):
    config = streaming_config(tmp_path, "x", lateness_ms=5_000)
    # Old requests produced now: the source's clock is far past every deadline.
    arrivals = [(0, NOW), (59_000, NOW + 1), (64_000, NOW + 2)]
    assert windows_published(config, arrivals, NOW + 5) == []  # window 0 open: 64 s < 65 s
    arrivals.append((66_000, NOW + 3))  # past window 0's deadline
    assert windows_published(config, arrivals, NOW + 2) == []  # not all before it came in yet
    assert windows_published(config, arrivals, NOW + 3) == [0]
    # The source idle: the last window closes once the requests' clock, run on at the source's
    # pace from 66 s, would be past its deadline (125 s), and idle_ms more.
    idle_due = NOW + 3 + (125_000 - 66_000) + config.idle_ms
    assert windows_published(config, arrivals, idle_due - 1) == [0]
    assert windows_published(config, arrivals, idle_due) == [0, MINUTE]


@pytest.mark.beam
@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 10 * MINUTE), min_size=1, max_size=40),
    st.integers(0, 10**6),
    st.integers(0, 2 * MINUTE),
)
def test_in_order_requests_are_never_late(tmp_path_factory, times, produced_ms, lateness_ms):
    """However far the source's clock is from the requests' (a backfill, a live stream), a window
    in-order requests still belong to is never due: nothing in order becomes late."""
    from kvtrace.pipelines.anonymize_streaming import Progress, StreamingConfig

    config = StreamingConfig(None, "pubsub:projects/p/subscriptions/s", MINUTE, lateness_ms)
    times = sorted(times)
    progress = Progress()
    for n, event_ms in enumerate(times):
        window = event_ms // MINUTE * MINUTE
        progress.saw(config, window, event_ms, produced_ms + n)
        for due in progress.due(config, produced_ms + n):  # all before this one came in
            assert due < window  # every later request (in order) is in this window or after
            progress.publish(due)


@pytest.mark.beam
@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10 * MINUTE), st.integers(0, 100)), min_size=1, max_size=30),
    st.integers(0, 200),
)
def test_no_window_is_due_before_an_older_open_one(arrivals, watermark):
    """Whatever order requests come in (each window due on its own clock), the windows due are
    every open window up to the newest due one: an older window is never left open behind a
    newer published one, to be published after it."""
    from kvtrace.pipelines.anonymize_streaming import Progress, StreamingConfig

    config = StreamingConfig(None, "pubsub:projects/p/subscriptions/s", MINUTE)
    progress = Progress()
    for event_ms, arrival_ms in arrivals:
        progress.saw(config, event_ms // MINUTE * MINUTE, event_ms, NOW + arrival_ms)
    due = progress.due(config, NOW + watermark)
    assert due == sorted(w for w in progress.passed_ms if due and w <= due[-1])


def test_once_the_zero_is_fixed_a_request_of_another_kind_is_a_dead_letter():
    """The stream's zero fixes its kind of time: counted from it, another kind's time would be
    published as a wall-clock date (or a negative one); judged against the published rows
    (the anchor) it lies years from them, and the batch job's letter says why."""
    relative, epoch = 1_000, 1_767_225_600_000
    anchor = kind_counts(requests_at(relative))
    kept, letters = keep_plausible_windows(
        [(0, requests_at(relative, epoch, relative + 5))], anchor
    )
    assert kept[0][1].requests["timestamp_ms"].tolist() == [relative, relative + 5]
    assert [letter.reason for letter in letters] == [TIMESTAMP_KIND_MISMATCH]
    kept, letters = keep_plausible_windows(
        [(0, requests_at(relative))], kind_counts(requests_at(epoch))
    )
    assert kept == [] and len(letters) == 1


@pytest.mark.beam
def test_cumulative_publishes_only_coarsened_times_from_the_traces_zero(tmp_path):
    from kvtrace.pipelines.anonymize_streaming import Progress, cumulative_summary

    config = streaming_config(tmp_path, "x")
    config = dataclasses.replace(
        config, job=dataclasses.replace(config.job, coarsening=Coarsening(timestamp_ms=10_000))
    )
    start = 1_767_225_600_000  # 2026-01-01
    origin = start + 1_234
    progress = Progress(origin_ms=origin, published_ms=origin + MINUTE, windows=2, rows=9)
    summary = cumulative_summary(config, progress)
    assert summary["published_until_ms"] == 2 * MINUTE  # the second window's end from the zero
    assert all(value is None or value < start for value in summary.values())
    assert cumulative_summary(config, Progress())["published_until_ms"] is None


@pytest.mark.beam
@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**41),
    st.integers(-(10**9), 10**9),
    st.integers(1, 10**8),
    st.integers(1, 10**5),
    st.integers(0, 2**41),
)
def test_cumulative_json_is_the_same_whatever_the_zeros_epoch(
    origin_ms, offset_ms, window_ms, granularity_ms, shift_ms
):
    """The summary depends on the published window's place from the zero only: the same stream
    at any other epoch publishes the same figures, a whole number of windows (rounded as rows
    are) even from a window start off the zero's grid."""
    from kvtrace.pipelines.anonymize_streaming import Progress, StreamingConfig, cumulative_summary

    config = StreamingConfig(
        AnonymizeConfig(
            inputs=(),
            output="o",
            staging="s",
            tokenizer="x",
            salt=SaltSource("env", "K"),
            dead_letter="d",
            coarsening=Coarsening(timestamp_ms=granularity_ms),
        ),
        "pubsub:projects/p/subscriptions/s",
        window_ms,
    )

    def summary(origin: int) -> dict:
        return cumulative_summary(
            config, Progress(origin_ms=origin, published_ms=origin + offset_ms)
        )

    assert summary(origin_ms) == summary(origin_ms + shift_ms)
    windows = offset_ms // window_ms + 1
    assert summary(origin_ms + 10**12)["published_until_ms"] == round_to(
        np.int64(windows * window_ms), granularity_ms
    )


@pytest.mark.beam
def test_kafka_offsets_are_committed_only_with_a_checkpoint():
    from kvtrace.pipelines.anonymize_streaming import kafka_read

    read = kafka_read("kafka://127.0.0.1:9092/requests")
    assert read.commit_offset_in_finalize is True
    assert read.consumer_config["enable.auto.commit"] == "false"
    assert (read.topics, read.consumer_config["bootstrap.servers"]) == (
        ["requests"],
        "127.0.0.1:9092",
    )


@pytest.mark.beam
def test_a_second_stream_into_a_streams_folder_is_refused(tmp_path):
    from kvtrace.pipelines.anonymize_streaming import check_new_stream

    output, dead = tmp_path / "stream", tmp_path / "stream-rejected"
    check_new_stream(str(output), str(dead))  # new folders: fine
    dead.mkdir()
    (dead / "rejected-0123456789ab.jsonl").write_text("")  # a batch run's letters: no clash
    output.mkdir()
    check_new_stream(str(output), str(dead))  # an empty folder: fine
    (output / "cumulative.json").write_text("{}")
    with pytest.raises(ConfigError, match="holds a stream already"):
        check_new_stream(str(output), str(dead))


@pytest.mark.beam
def test_a_stream_into_a_folder_holding_anything_is_refused(tmp_path):
    """A night's folder, say: the stream's windows beside it would read as one trace."""
    from kvtrace.pipelines.anonymize_streaming import check_new_stream

    (tmp_path / "night" / "trace").mkdir(parents=True)
    with pytest.raises(ConfigError, match="is not empty"):
        check_new_stream(str(tmp_path / "night"), str(tmp_path / "night-rejected"))


@pytest.mark.beam
@pytest.mark.parametrize("run", ["window-000000", "letters-000001"])
def test_streams_of_other_outputs_share_a_dead_letter_folder_the_same_outputs_do_not(tmp_path, run):
    """Letters are named by their stream's output: another output's never clash; an earlier
    stream's of this same output (its folder emptied since) would be replaced."""
    from kvtrace.pipelines.anonymize_streaming import check_new_stream

    dead = tmp_path / "rejected"
    dead.mkdir()
    earlier = streaming_config(tmp_path, "x")
    (dead / f"rejected-{earlier.run_name(run)}.jsonl").write_text("")
    check_new_stream(str(tmp_path / "other-stream"), str(dead))
    with pytest.raises(ConfigError, match="letters of an earlier stream"):
        check_new_stream(earlier.job.output, str(dead))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**15), st.integers(0, 10**15))
def test_window_names_sort_as_the_windows_do(first, second):
    """Past a million windows too: a listing of the folders is the windows in order."""
    assert (window_name(first) < window_name(second)) == (first < second)
    assert window_name(first).startswith("window-")


def published_names(window_starts: list[int]) -> list[str]:
    """The folders of windows published in that order, named as PublishWindows names them."""
    from kvtrace.pipelines.anonymize_streaming import Progress

    progress = Progress()
    names = []
    for start in window_starts:
        progress.passed_ms[start] = None
        names.append(progress.publish(start))
    return names


@pytest.mark.beam
@settings(max_examples=100, deadline=None)
@given(
    st.sets(st.integers(0, 10**6), min_size=1, max_size=30),
    st.integers(1, 10**7),
    st.integers(0, 2**42),
)
def test_window_names_hold_no_time_only_their_order(indices, window_ms, epoch_ms):
    """The same windows at any other time, of any other length, get the same names: nothing
    absolute (nor the window's length) can be read from a name without the trace's origin."""
    starts = [index * window_ms for index in sorted(indices)]
    names = published_names(starts)
    assert names == sorted(names) == [window_name(n) for n in range(len(starts))]
    moved = [epoch_ms // window_ms * window_ms + start for start in starts]
    assert published_names(moved) == names


@pytest.mark.beam
def test_a_restored_stream_names_its_next_window_as_before(tmp_path):
    """The name comes from the state a runner checkpoints: a restart that publishes a window
    again names it as the first attempt did."""
    from kvtrace.pipelines.anonymize_streaming import Progress

    progress = Progress(passed_ms={0: None, MINUTE: None})
    progress.publish(0)
    restored = pickle.loads(pickle.dumps(progress))  # as the runner's state coder keeps it
    assert restored.publish(MINUTE) == progress.publish(MINUTE) == "window-000001"
    assert restored.last_published() == "window-000001"


@pytest.mark.beam
def test_lone_letters_are_published_with_the_cumulative_json_and_counted_privately(tmp_path):
    from kvtrace.pipelines.anonymize_streaming import Progress, write_cumulative

    config = streaming_config(tmp_path, "x")
    letter = DeadLetter("pubsub:projects/p/subscriptions/s", b"not json", "invalid_json", "")
    progress = Progress(letter_batches=1, rejected=1)
    write_cumulative(config, progress, ("letters-000001", [letter]))
    dead = Path(config.job.dead_letter)
    counts = Path(config.run_counts())
    assert sorted(p.name for p in dead.iterdir()) == sorted(
        [f"rejected-{config.stream_key()}-letters-000001.jsonl", counts.name]
    )
    assert letters(dead) == [json.loads(letter.to_json())]
    assert stream_counts(dead)["rejected"] == len(letters(dead)) == 1
    assert counts.stat().st_mode & 0o077 == 0  # the operator's, as a batch run's
    cumulative = json.loads((Path(config.job.output) / "cumulative.json").read_text())
    assert "rejected" not in cumulative
    assert sorted(p.name for p in Path(config.job.output).iterdir()) == ["cumulative.json"]


@pytest.mark.beam
def test_a_new_stream_of_an_output_is_refused_its_earlier_streams_run_counts(tmp_path):
    """It would replace them."""
    from kvtrace.pipelines.anonymize_streaming import check_new_stream

    earlier = streaming_config(tmp_path, "x")
    Path(earlier.job.dead_letter).mkdir()
    Path(earlier.run_counts()).write_text("{}")
    with pytest.raises(ConfigError, match="letters of an earlier stream"):
        check_new_stream(earlier.job.output, earlier.job.dead_letter)


@pytest.mark.beam
@pytest.mark.slow  # a streaming pipeline: ~5 s
def test_a_window_that_fails_to_publish_is_letters_nothing_staged_left(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Letters stand only for a published window: a folder the window may not replace (a file
    kvtrace did not write) stops it, nothing of it staged left and the folder untouched; its
    records are letters of their own run (`unpublished_window` for its requests, the cause
    said), counted, and the stream is told to stop with the writer's error."""
    from apache_beam.testing.test_stream import TestStream

    from kvtrace.pipelines import anonymize_streaming, stream_drain

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    monkeypatch.setattr(stream_drain, "_FAILURES", [])
    # The letter waits for its window, however slow the machine: it never goes out alone here.
    monkeypatch.setattr(anonymize_streaming, "LETTER_DELAY_S", 3600)
    config = streaming_config(tmp_path, tiny_tokenizer)
    # The stream's own window (claimed by an attempt killed after its claim), a file added since.
    anonymize_streaming.claim_window(config.job.output, "window-000000")
    blocked = Path(config.job.output) / "window-000000"
    blocked.mkdir()
    (blocked / "notes.txt").write_text("not kvtrace's")
    stream = TestStream().add_elements([b"not json", message(stream_chat(5_000, 1))])
    run_stream(config, stream.advance_watermark_to_infinity())
    assert "kvtrace did not write" in str(stream_drain._FAILURES[0])
    assert sorted(p.name for p in blocked.iterdir()) == ["notes.txt"]
    rejected = Path(config.job.dead_letter)
    assert sorted(p.name for p in rejected.iterdir() if not p.name.startswith("run-counts")) == [
        f"rejected-{config.stream_key()}-unpublished-window-000000.jsonl"
    ]
    assert sorted(letter["error"] for letter in letters(rejected)) == [
        "invalid_json",
        anonymize_streaming.UNPUBLISHED_WINDOW,
    ]


@pytest.mark.beam
@pytest.mark.slow  # a streaming pipeline: ~5 s
def test_letters_that_cannot_be_written_either_stop_the_stream_in_one_line_counting_them(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """A window the writer cannot publish, then its letters not written either (a full disk):
    no traceback escapes the pipeline, and the stream's stop line counts the records neither
    published nor lettered, with both causes."""
    from apache_beam.testing.test_stream import TestStream

    from kvtrace.pipelines import anonymize_streaming, stream_drain

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    monkeypatch.setattr(stream_drain, "_FAILURES", [])
    monkeypatch.setattr(anonymize_streaming, "LETTER_DELAY_S", 3600)

    def full_disk(config, progress, letters):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(anonymize_streaming, "write_letters", full_disk)
    config = streaming_config(tmp_path, tiny_tokenizer)
    anonymize_streaming.claim_window(config.job.output, "window-000000")
    blocked = Path(config.job.output) / "window-000000"
    blocked.mkdir()
    (blocked / "notes.txt").write_text("not kvtrace's")
    stream = TestStream().add_elements([b"not json", message(stream_chat(5_000, 1))])
    run_stream(config, stream.advance_watermark_to_infinity())
    (line,) = [str(failure) for failure in stream_drain._FAILURES]
    assert "2 records read were neither published nor lettered" in line, line
    assert "kvtrace did not write" in line and "No space left on device" in line
    assert "\n" not in line


class FakeBag:
    """A runner's bag state, as PublishWindows reads it."""

    def __init__(self) -> None:
        self.items: list = []

    def add(self, item) -> None:
        self.items.append(item)

    def read(self):
        return list(self.items)

    def clear(self) -> None:
        self.items = []


class FakeValue:
    """A runner's read-modify-write state: None until written, as Beam's."""

    def __init__(self) -> None:
        self.value = None

    def read(self):
        return self.value

    def write(self, value) -> None:
        self.value = value


class FakeTimers:
    """A timer family's timers by tag, in microseconds."""

    def __init__(self) -> None:
        self.set_at: dict[str, int] = {}

    def set(self, timestamp, dynamic_timer_tag: str = "") -> None:
        self.set_at[dynamic_timer_tag] = timestamp.micros

    def clear(self, dynamic_timer_tag: str = "") -> None:
        self.set_at.pop(dynamic_timer_tag, None)


@pytest.mark.beam
def test_one_watermark_advance_publishes_every_due_window(tmp_path, monkeypatch):
    """As a portable runner fires timers: every timer at or below the new watermark fires in one
    advance, and a timer set while they fire waits for the next advance (it reaches the runner
    only with the bundle's end). Requests past three windows' deadlines, then the watermark past
    all three arrivals: the three windows go out in that one advance, oldest first, none waiting
    for a firing to re-arm a timer (1.5 s apart on Flink)."""
    from apache_beam.utils.timestamp import Timestamp

    from kvtrace.pipelines import anonymize_streaming
    from kvtrace.pipelines.anonymize_streaming import PublishWindows

    published: list[str] = []
    monkeypatch.setattr(
        PublishWindows, "_publish", lambda self, name, *_: published.append(name) or {}
    )
    config = streaming_config(tmp_path, "x")
    publisher = PublishWindows(config)
    pending, progress, letters_due, end = FakeBag(), FakeValue(), FakeTimers(), FakeTimers()
    deadline = FakeTimers()
    state = {"pending": pending, "progress_state": progress, "deadline": deadline}
    # The last two: a request more than a window ahead of the rest, alone, moves no clock.
    for n, times in enumerate([[0], [MINUTE + 1], [2 * MINUTE + 2], [3 * MINUTE + 3] * 2]):
        monkeypatch.setattr(anonymize_streaming, "source_now_ms", lambda n=n: NOW + n)
        publisher.process((0, requests_at(*times)), letters_due=letters_due, end=end, **state)
    watermark_us = (NOW + 10) * 1000
    firing = sorted((at, tag) for tag, at in deadline.set_at.items() if at <= watermark_us)
    for at, _ in firing:  # the timers set when the advance began, none set while they fire
        list(publisher.publish(fired=Timestamp(micros=at), letters_due=letters_due, **state))
    assert published == ["window-000000", "window-000001", "window-000002"]
    # The open window keeps its timer; the published ones' are gone.
    assert list(deadline.set_at) == [str(3 * MINUTE)]


@pytest.mark.beam
@pytest.mark.slow  # a streaming pipeline: ~5 s
def test_a_window_numbers_its_rows_parents_as_a_night_does(tiny_tokenizer, tmp_path, monkeypatch):
    """--emit-parents on a stream: each window is a night, its parent_row numbers its own rows
    (finish_night) as a night of the same requests does (tests/e2e/test_parent_rows.py)."""
    from apache_beam.testing.test_stream import TestStream

    from kvtrace.transforms.read.records import ParseOptions

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    config = streaming_config(tmp_path, tiny_tokenizer)
    config = dataclasses.replace(
        config, job=dataclasses.replace(config.job, parse=ParseOptions(links=True))
    )
    logged = agent_log()
    stream = TestStream().add_elements([message(record) for record, _ in logged])
    run_stream(config, stream.advance_watermark_to_infinity())
    (window,) = [p for p in Path(config.job.output).iterdir() if p.is_dir()]
    rows = [json.loads(line) for line in (window / "trace-00000-of-00001.jsonl").open()]
    assert [row.get("parent_row") for row in rows] == [parent for _, parent in logged]


@pytest.mark.beam
def test_the_writer_writes_plans_in_order_each_window_once_its_ids_are_back():
    """Plans as handed: window 0, letters, window 1. Letters wait for the window handed before
    them; a window waits for every answer (each shard's store and the numbering step, of each
    kind); a plan handed later but come in first waits its turn."""
    from kvtrace.pipelines.anonymize_streaming import Book, writable

    book = Book(0, {2: 1}, {1: 2})  # window 1's plan (seq 2) and all its answers came first
    ready, book = writable(book, 2)
    assert ready == [] and book == Book(0, {2: 1}, {1: 2})
    book = book._replace(plans={**book.plans, 0: 0, 1: None}, answers={**book.answers, 0: 1})
    ready, book = writable(book, 2)
    assert ready == [] and book.next_seq == 0  # window 0 lacks an answer: nothing overtakes it
    ready, book = writable(book._replace(answers={**book.answers, 0: 2}), 2)
    assert ready == [0, 1, 2] and book == Book(3, {}, {})


@pytest.mark.beam
@pytest.mark.slow  # a streaming pipeline: ~5 s
def test_a_window_the_writer_cannot_publish_is_letters_and_so_is_every_later_one(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """A folder at the stream's next window's name: that window and every later one (a window
    may not follow a missing one) are counted letters with the cause, none published, the
    counts adding up; the stream is told to drain and stop with the writer's error."""
    from apache_beam.testing.test_stream import TestStream

    from kvtrace.pipelines import stream_drain
    from kvtrace.pipelines.anonymize_streaming import UNPUBLISHED_WINDOW

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    monkeypatch.setattr(stream_drain, "_FAILURES", [])
    monkeypatch.setattr(stream_drain, "DRAINING", stream_drain.threading.Event())
    config = streaming_config(tmp_path, tiny_tokenizer)
    (Path(config.job.output) / "window-000000").mkdir()
    records = [stream_chat(1_000 + 70_000 * i, i) for i in range(3)]
    stream = TestStream().add_elements([message(r) for r in records] + [b"not json"])
    run_stream(config, stream.advance_watermark_to_infinity())
    rejected = letters(Path(config.job.dead_letter))
    reasons = sorted(letter["error"] for letter in rejected)
    assert reasons.count(UNPUBLISHED_WINDOW) == 3 and len(reasons) == 4
    assert stream_counts(config.job.dead_letter) == {"read": 4, "exported": 0, "rejected": 4}
    assert [p.name for p in Path(config.job.output).iterdir() if p.is_dir()] == ["window-000000"]
    (failure,) = stream_drain._FAILURES
    assert "stands at the stream's next window's name" in str(failure)
    assert stream_drain.DRAINING.is_set()


@pytest.mark.beam
@pytest.mark.slow  # a streaming pipeline: ~5 s
def test_a_stream_resumed_past_the_rules_gap_letters_what_its_audit_would_refuse(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Published rows anchor the stream: requests 9 days after them (a holiday over the batch
    rule's gap), however many, are `implausible_timestamp` letters, said once with the remedy,
    and the stream's folder stays publishable (the audit's gap rule, _Rows._check_gaps)."""
    from apache_beam.testing.test_stream import TestStream

    from kvtrace.transforms.stats import audit as gate

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    warned: list[str] = []  # said whatever logging another test set up
    monkeypatch.setattr(
        logging, "warning", lambda text, *args, **_: warned.append(str(text) % args)
    )
    config = streaming_config(tmp_path, tiny_tokenizer)
    start = 1_767_225_600_000
    first = [stream_chat(start + 10_000 * i, i) for i in range(3)]
    first.append(stream_chat(start + 70_000, 3))  # in order, past window 0's deadline
    resumed = [stream_chat(start + 9 * DAY + 1_000 * i, 4 + i) for i in range(6)]
    stream = (
        TestStream()
        .add_elements([message(r) for r in first])
        .advance_watermark_to(int(time.time()) + 60)  # window 0 published
        .add_elements([message(r) for r in resumed])
        .advance_watermark_to_infinity()
    )
    run_stream(config, stream)
    assert stream_counts(config.job.dead_letter) == {"read": 10, "exported": 4, "rejected": 6}
    reasons = [letter["error"] for letter in letters(Path(config.job.dead_letter))]
    assert reasons == ["implausible_timestamp"] * 6
    assert [text for text in warned if "lie more than 7 days" in text] == [
        "6 requests lie more than 7 days from the run of days the stream publishes (or are of "
        "the other kind of time): dead letters (implausible_timestamp); a producer whose clock "
        "moved for good needs a stream of its own (a new --output)"
    ]
    assert gate.audit(config.job.output, tiny_tokenizer)["publishable"]


@pytest.mark.beam
@pytest.mark.slow  # a streaming pipeline
def test_an_older_run_of_relative_times_never_becomes_the_zero_of_the_run_due(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Five requests of a reset clock (relative ms, one window) before four real ones, the
    real run's first window due: the real run fixes the zero, so no real request is a letter
    (the older run, swept along with the window due, is)."""
    from apache_beam.testing.test_stream import TestStream

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    config = streaming_config(tmp_path, tiny_tokenizer)
    start = 1_767_225_600_000  # a day's first ms
    strays = [stream_chat(1000 + i, 10 + i) for i in range(5)]
    real = [stream_chat(start + 10_000 * i, i) for i in range(3)] + [stream_chat(start + 70_000, 3)]
    stream = (
        TestStream()
        .add_elements([message(r) for r in strays])
        .add_elements([message(r) for r in real])
        .advance_watermark_to(int(time.time()) + 60)  # the source's clock (s): window 0 due
        .add_elements([message(stream_chat(start + 71_000, 20))])
    )
    run_stream(config, stream)
    lettered = letters(Path(config.job.dead_letter))
    assert len(lettered) == 5
    assert all("an epoch date" not in letter["message"] for letter in lettered)


@pytest.mark.beam
@pytest.mark.slow  # a streaming pipeline
@pytest.mark.parametrize("granule", [1, 1000])
def test_a_kept_pair_a_day_short_of_the_gap_is_publishable_once_coarsened(
    tiny_tokenizer, tmp_path, monkeypatch, granule
):
    """Rows on days d and d + 7, (MAX_GAP_DAYS + 1) days - 2 ms apart, are kept together, and
    rounded to the granule lie 8 days apart: the audit's bound is the keeper's, rounded alike
    (read/timestamps.widest_kept_gap_ms), so the stream stays publishable."""
    from apache_beam.testing.test_stream import TestStream

    from kvtrace.transforms.read.timestamps import DAY_MS
    from kvtrace.transforms.stats import audit as gate

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    config = streaming_config(tmp_path, tiny_tokenizer)
    job = dataclasses.replace(config.job, coarsening=Coarsening(granule, 1, 4))
    config = dataclasses.replace(config, job=job)
    start = 1_767_225_600_000  # a day's first ms
    records = [stream_chat(start + 1, 0), stream_chat(start + 8 * DAY_MS - 1, 1)]
    stream = TestStream().add_elements([message(r) for r in records])
    run_stream(config, stream.advance_watermark_to_infinity())
    assert stream_counts(config.job.dead_letter)["rejected"] == 0
    report = gate.audit(config.job.output, tiny_tokenizer)
    assert report["publishable"], report["flags"]
