"""The progress a run shows (pipelines/progress.py): counts that only go forward and end at the
input's stored total, plain lines without a terminal, nothing with --quiet."""

from __future__ import annotations

import io
import logging
import multiprocessing
import re
import threading

from hypothesis import given
from hypothesis import strategies as st

from kvtrace.pipelines.progress import (
    COUNTED,
    RangeCounts,
    count_text,
    read_meter,
    shared_counts,
    shown,
)

# read:  42% 12.3MB of 62.8MB [00:05<00:07, 2.37MB/s, 1,234 records, 4.50M tokens]
PLAIN_LINE = re.compile(
    r"read: +(?P<percent>\d+)% (?P<done>[\d.]+[kMG]?)B of (?P<total>[\d.]+[kMG]?)B "
    r"\[\d\d:\d\d<(\d\d:\d\d|\?), [\d.?]+[kMG]?B/s, (?P<records>[\d,]+) records, "
    r"(?P<tokens>[\d.]+[kMG]?) tokens\]"
)


def _counts() -> tuple[object, RangeCounts]:
    shared = shared_counts(multiprocessing.get_context("fork"))
    return shared, RangeCounts(shared)


@given(
    st.lists(
        st.tuples(st.integers(0, 10_000), st.lists(st.integers(-50, 20_000), max_size=20)),
        max_size=8,
    )
)
def test_ranges_count_forward_within_their_size_and_end_at_the_stored_total(ranges):
    """Whatever a reader tells (behind, past the range's end, read ahead), the stored bytes
    counted never go back, never pass what is read, and end at the ranges' total."""
    shared, counts = _counts()
    done = 0
    for size, offsets in ranges:
        counts.start_range(size)
        for offset in offsets:
            counts.reached(offset)
            counts.flush()
            assert done <= shared[0] <= done + size
        counts.end_range()
        done += size
        assert shared[0] == done


def test_records_and_tokens_reach_the_shared_counts_once_flushed():
    shared, counts = _counts()
    counts.records(3)
    counts.tokens(1234)
    counts.flush()
    assert dict(zip(COUNTED, shared[:])) == {"stored_bytes": 0, "records": 3, "tokens": 1234}
    assert read_meter(shared)() == (0, "3 records, 1.23k tokens")


def test_counts_are_shown_for_people():
    assert [count_text(n) for n in (0, 999, 1000, 4_500_000)] == ["0", "999", "1.00k", "4.50M"]


class Steps:
    """A run's counts as a display reads them: a step further at each read, to the total."""

    def __init__(self, total: int, step: int):
        self.total, self.step, self.done = total, step, 0
        self.finished = threading.Event()

    def __call__(self) -> tuple[int, str]:
        self.done = min(self.done + self.step, self.total)
        if self.done == self.total:
            self.finished.set()
        return self.done, f"{self.done // 100:,} records, {self.done} tokens"


def test_without_a_terminal_lines_come_from_the_start_forward_to_the_total(caplog):
    caplog.set_level(logging.INFO, logger="kvtrace")
    steps = Steps(total=62_800_000, step=1_000_000)
    with shown(steps.total, steps, stream=io.StringIO(), interval_s=0.001):
        assert steps.finished.wait(30)  # each line takes a step
    lines = [r.getMessage() for r in caplog.records if r.name == "kvtrace"]
    parsed = [PLAIN_LINE.fullmatch(line) for line in lines]
    assert len(lines) >= 3 and all(parsed), lines
    percents = [int(m["percent"]) for m in parsed]
    records = [int(m["records"].replace(",", "")) for m in parsed]
    assert percents == sorted(percents) and records == sorted(records)
    assert percents[0] < 5 and percents[-1] == 100
    assert {m["total"] for m in parsed} == {"62.8M"} and parsed[-1]["done"] == "62.8M"


def test_quiet_shows_nothing(caplog):
    caplog.set_level(logging.WARNING, logger="kvtrace")
    stream = io.StringIO()
    with shown(10, lambda: (10, ""), stream=stream, interval_s=0.001):
        pass
    assert not [r for r in caplog.records if r.name == "kvtrace"] and stream.getvalue() == ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_one_bar_redrawn_in_place(caplog):
    caplog.set_level(logging.INFO, logger="kvtrace")
    terminal = Terminal()
    steps = Steps(total=5_000, step=1_000)
    with shown(steps.total, steps, stream=terminal, interval_s=0.001):
        assert steps.finished.wait(30)
    drawn = terminal.getvalue()
    assert "\r" in drawn and drawn.endswith("\n")  # redrawn in place, left whole at the end
    assert "100%|" in drawn and "5.00kB of 5.00kB" in drawn
    assert not [r for r in caplog.records if r.name == "kvtrace"]  # no plain lines beside it
