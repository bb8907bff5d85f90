"""A run's progress for the person watching it, on stderr: a tqdm bar on a terminal, a plain
line every LINE_INTERVAL_S otherwise (through the kvtrace logger, as a log file holds the other
lines), from the moment the work starts. Totals are in the input's own units: bytes as stored
(compressed bytes of a compressed file, so the share reaches 100%), records read, tokens.
Nothing here touches stdout or what a run writes; --quiet (kvtrace's INFO off) shows nothing.

Why tqdm: it is already installed with transformers, formats rates, sizes and ETAs, and draws
one line in place; rich would add a heavier import for a single bar.

Local worker processes count what they read into one small array shared with this process
(RangeCounts, a locked add at most every FLUSH_INTERVAL_S), which a thread here shows (shown).
A range counts as its whole stored size once read, whatever its reader told on the way, so
the bar ends at the input's total exactly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

_LOG = logging.getLogger("kvtrace")
COUNTED = ("stored_bytes", "records", "tokens")  # the shared array's slots, in this order
FLUSH_INTERVAL_S = 0.2  # a worker adds its counts to the shared ones at most this often
BAR_INTERVAL_S = 0.5  # a terminal's bar is redrawn this often
# A terminal that tells no size (a pseudo-terminal nobody sized: `script`, `docker exec -t`,
# CI) is taken to be this big: tqdm would draw nothing in it.
UNSIZED_TERMINAL = {"ncols": 80, "nrows": 24}
LINE_INTERVAL_S = 10.0  # without a terminal, a line this often (and one at the start and end)
# tqdm's formats, with the unit beside each amount (12.3MB of 62.8MB), ETA after elapsed time.
AMOUNTS = "{n_fmt}{unit} of {total_fmt}{unit} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
BAR_FORMAT = "{l_bar}{bar}| " + AMOUNTS
PLAIN_FORMAT = "{desc}: {percentage:3.0f}% " + AMOUNTS


class _Bar(tqdm):
    """tqdm without its monitor thread: this module's thread draws the bar, on a schedule."""

    monitor_interval = 0


def shared_counts(context: Any) -> Any:
    """The run's counts (COUNTED), in shared memory of the multiprocessing context its workers
    start in (a lock made for one start method does not open in another)."""
    return context.Array("q", len(COUNTED))


class RangeCounts:
    """One worker process's counts, added to the run's shared ones (shared_counts): stored bytes
    of the range being read as its reader tells them (ReadProgress.reached, within the range's
    size, never backwards), records, tokens."""

    def __init__(self, shared: Any):
        self._shared = shared
        self._pending = [0] * len(COUNTED)
        self._range_bytes = self._range_told = 0
        self._flushed_at = time.monotonic()

    def start_range(self, stored_bytes: int) -> None:
        self._range_bytes, self._range_told = stored_bytes, 0

    def reached(self, stored_offset: int) -> None:
        told = min(max(stored_offset, self._range_told), self._range_bytes)
        self._pending[0] += told - self._range_told
        self._range_told = told
        self._flush_when_due()

    def end_range(self) -> None:
        """The range read: all of its stored bytes count, told or not."""
        self.reached(self._range_bytes)
        self.flush()

    def records(self, count: int = 1) -> None:
        self._pending[1] += count
        self._flush_when_due()

    def tokens(self, count: int) -> None:
        self._pending[2] += count
        self._flush_when_due()

    def flush(self) -> None:
        with self._shared.get_lock():
            for slot, count in enumerate(self._pending):
                self._shared[slot] += count
        self._pending = [0] * len(COUNTED)
        self._flushed_at = time.monotonic()

    def due(self) -> bool:
        """Whether the counts are to be added to the shared ones now (a reader asks before it
        finds out how far it has read)."""
        return time.monotonic() - self._flushed_at >= FLUSH_INTERVAL_S

    def _flush_when_due(self) -> None:
        if self.due():
            self.flush()


def read_meter(shared: Any) -> Callable[[], tuple[int, str]]:
    """What shown displays of a run's shared counts: stored bytes, then records and tokens."""

    def current() -> tuple[int, str]:
        with shared.get_lock():
            stored, records, tokens = shared[:]
        return stored, f"{records:,} records, {count_text(tokens)} tokens"

    return current


def count_text(count: int) -> str:
    """A count for people: as it is below 1000, else in SI prefixes (4.50M)."""
    return str(count) if count < 1000 else tqdm.format_sizeof(count)


def _width(stream: TextIO) -> dict[str, Any]:
    """The bar's width: the terminal's as it changes, or UNSIZED_TERMINAL's where it tells none."""
    try:
        sized = os.get_terminal_size(stream.fileno()).columns > 0
    except (OSError, ValueError):  # no descriptor (a stream in memory), or not a terminal
        sized = False
    return {"dynamic_ncols": True} if sized else UNSIZED_TERMINAL


@contextlib.contextmanager
def shown(
    total: int,
    current: Callable[[], tuple[int, str]],
    what: str = "read",
    unit: str = "B",
    stream: TextIO | None = None,
    interval_s: float | None = None,
) -> Iterator[None]:
    """The work inside, shown as it goes: current() says how much is done (of total, in unit)
    and what else to say. A bar on a terminal, else a line at the start, every interval_s and
    at the end; nothing when kvtrace's INFO lines are off (--quiet)."""
    if not _LOG.isEnabledFor(logging.INFO):
        yield
        return
    stream = stream or sys.stderr
    terminal = stream.isatty()
    interval = interval_s or (BAR_INTERVAL_S if terminal else LINE_INTERVAL_S)
    started = time.monotonic()
    bar = (
        _Bar(
            total=total,
            desc=what,
            unit=unit,
            unit_scale=True,
            unit_divisor=1000,
            file=stream,
            mininterval=interval,
            **_width(stream),
            bar_format=BAR_FORMAT,
        )
        if terminal
        else None
    )

    def show() -> None:
        done, said = current()
        if bar is not None:
            bar.update(done - bar.n)
            bar.set_postfix_str(said)
            return
        _LOG.info(
            "%s",
            tqdm.format_meter(
                done,
                total,
                time.monotonic() - started,
                prefix=what,
                unit=unit,
                unit_scale=True,
                unit_divisor=1000,
                postfix=said,
                bar_format=PLAIN_FORMAT,
            ),
        )

    stop = threading.Event()

    def keep_showing() -> None:
        while not stop.wait(interval):
            show()

    show()
    thread = threading.Thread(target=keep_showing, name="progress", daemon=True)
    # A bar's own log lines go above it (this process's; a worker's may cross it).
    redirected = logging_redirect_tqdm([_LOG], tqdm_class=_Bar) if bar else contextlib.nullcontext()
    with redirected:
        thread.start()
        try:
            yield
            stop.set()
            thread.join()
            show()  # the end, as the work left it: all of it, once every range is read
        finally:
            stop.set()
            thread.join()
            if bar is not None:
                bar.close()  # on a stop or failure too: its line ends before the error's
