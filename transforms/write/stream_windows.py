"""A stream's windows and its clock, pure (the streaming controller, pipelines/
anonymize_streaming.PublishWindows, keeps a Progress in its keyed state and asks it which
windows are due and which timers to set). docs/STREAMING.md states the rule; in short:

- Anchor. Once a window is published, its rows anchor the stream: a waiting request is
  published only within the run of days (read/timestamps.anchored_days, the batch rule's
  MAX_GAP_DAYS) that holds the published rows, never outvoted by what waits; the rest are
  dead letters (the controller judges each request as it comes, and what waits again at each
  publication).
- Zero. Before it, every run of days (no gap over MAX_GAP_DAYS) waits on its own clocks, one
  per contiguous segment of the run, each moved in order from the segment's first window as
  below: a window is due once a request of its segment passes its deadline (with it every
  older window), or once a request of the next segment of its run (past every deadline of
  the segment before: segments lie a window and the allowed lateness apart) came in strictly
  after the segment's latest request (the source's clock orders what one instant does not),
  never by idle time alone; the run of the first window due (the bulk of the
  runs holding a window whose own timer is due then) fixes the zero, and the other runs are
  letters. The stream's end judges what waits by the batch rule (plausible_days);
  MAX_GAP_DAYS of the source's clock past the idle rule's time bounds the wait.
- Clock. Once anchored, the stream's clock is its latest published request, moved on through
  the open windows contiguous with it (no gap over a window and the allowed lateness): a window
  it passes is due when every record produced before the passing request has come in; a window
  ahead waits for that clock, run on at the source's pace (its deadline minus the clock, after
  the clock's request came in, and the idle time), or for the stream's end.

The controller's work per message is bounded: the timers wanted are the windows passed (each
due once, at a fixed time) and the oldest window still waiting on the clock (the clock's due
times grow with the window: due() publishes every older window with a due one); only timers
whose time changed are set again (Progress.armed); a message moves only its own run's clock
(Progress.saw; before the zero its segment's, joining the segments it reaches, and judges the
segment before it), over the open windows kept sorted (Progress.order)."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from kvtrace.transforms.encode.hashed_batch import HashedBatch
from kvtrace.transforms.read.timestamps import (
    DAY_MS,
    MAX_GAP_DAYS,
    anchored_days,
    day_runs,
    plausible_days,
)
from kvtrace.transforms.trace_format import window_name
from kvtrace.transforms.write.coarsen import Coarsening, published_requests

KINDS = ("blocks", "sessions")


class Windowing(Protocol):
    """What the windows and the clock are cut by (the stream's config)."""

    window_ms: int
    allowed_lateness_ms: int
    idle_ms: int

    @property
    def coarsening(self) -> Coarsening: ...

    def deadline_ms(self, window_start_ms: int) -> int: ...


def by_window(
    batch: HashedBatch, origin_ms: int, window_ms: int, coarsening: Coarsening = Coarsening()
) -> Iterator[tuple[int, HashedBatch]]:
    """(window start in ms, the batch's requests in that window) for each window present, oldest
    first. Windows are cut from the trace's zero (origin_ms): window k holds the requests
    published (coarsened from the zero) in [origin + k W, origin + (k + 1) W), so every time the
    stream publishes is whole windows from the zero, and a window holds whole granules: cut on
    raw times, one published time would be split across two windows and written in its raw
    order. Windows on epoch multiples of W would publish the zero's own epoch modulo W (the
    first request's minute, second and millisecond within the hour, with hour windows)."""
    published = published_requests(batch, origin_ms, coarsening).requests["timestamp_ms"]
    starts = origin_ms + (published - origin_ms) // window_ms * window_ms
    for start in np.unique(starts).tolist():
        yield start, batch.select(starts == start)


@dataclasses.dataclass
class Progress:
    """What the stream has published so far (keyed state). The controller keeps its windows,
    zero and clock; the writer keeps a copy whose counts (next ids, rows, rejected) it alone
    moves, the rest copied from each plan's Published."""

    next_id: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    # The trace's zero, which windows are cut from: the earliest request so far until a window
    # is published, then the earliest of the first published window's run, fixed.
    origin_ms: int | None = None
    published_ms: int | None = None  # start of the last published window
    # The published rows (requests per day): the anchor. Their latest request and when (the
    # source's clock) it came in: where the stream's clock starts from.
    published_days: dict[int, int] = dataclasses.field(default_factory=dict)
    published_latest_ms: int | None = None
    published_arrived_ms: int = 0
    # Each open window's requests per day (requests, latest ms) and when (source's clock) its
    # latest batch came in. Event time is the requests' own; the source's clock (when records
    # were produced, the watermark's) only says when everything before an instant has come in.
    open_days: dict[int, dict[int, tuple[int, int]]] = dataclasses.field(default_factory=dict)
    window_arrived: dict[int, int] = dataclasses.field(default_factory=dict)
    waiting: dict[int, int] = dataclasses.field(default_factory=dict)  # open_days summed per day
    order: list[int] = dataclasses.field(default_factory=list)  # the open windows, sorted
    arrived_ms: int = 0  # when (source's clock) the last batch came in
    # Open windows -> when (source's clock) a request past their deadline came in, None before.
    passed_ms: dict[int, int | None] = dataclasses.field(default_factory=dict)
    armed: dict[int, int] = dataclasses.field(default_factory=dict)  # timers set: window -> due
    # Before the zero: each contiguous segment of a run (its first window) -> its clock and
    # when that request came in; the firsts sorted, and those of segments with a passed window.
    segments: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
    firsts: list[int] = dataclasses.field(default_factory=list)
    passing: set[int] = dataclasses.field(default_factory=set)
    letters_due: float | None = None  # when pending dead letters go out on their own (s)
    letter_batches: int = 0
    handed: int = 0  # plans handed to the writer (WriteWindows), which keeps the counts below
    windows: int = 0
    rows: int = 0
    rejected: int = 0  # the operator's count (RUN_COUNTS), never published
    # The writer's: why a window could not be published; every later one is letters then.
    failed: str | None = None
    # The writer's: requests read that no write could publish nor letter (a full disk twice).
    unwritten: int = 0
    far: int = 0  # requests off the anchor lettered since the last warning (the controller's)

    def hold(self, window: int, timestamps: np.ndarray) -> None:
        """Requests (their times) waiting in an open window."""
        days = self.open_days.setdefault(window, {})
        for day in np.unique(timestamps // DAY_MS).tolist():
            on_day = timestamps[timestamps // DAY_MS == day]
            held, latest = days.get(day, (0, int(on_day.max())))
            days[day] = (held + len(on_day), max(latest, int(on_day.max())))
            self.waiting[day] = self.waiting.get(day, 0) + len(on_day)

    def runs(self) -> list[list[int]]:
        """The open windows with a clock, by run, oldest first: before the zero, each run of
        days (no gap over MAX_GAP_DAYS) on its own; after it, the run of the published rows."""
        if self.published_ms is not None:
            days = [anchored_days(self.published_days, self.waiting)]
        else:
            days = [(first, last) for _, first, last in day_runs(self.waiting)]
        if len(days) == 1 and days[0][0] <= min(self.waiting, default=0):
            if max(self.waiting, default=0) <= days[0][1]:  # one run: no walk over the windows
                return [self.order] if self.order else []
        runs: list[list[int]] = [[] for _ in days]
        for window in self.order:
            day = min(self.open_days[window])
            for place, (first, last) in enumerate(days):
                if first <= day <= last:
                    runs[place].append(window)
        return [run for run in runs if run]

    def _chain(self, config: Windowing, run: list[int]) -> tuple[int, int, int]:
        """Once anchored: the stream's clock, when its request came in, and how many of the
        run's windows it reaches."""
        gap = config.window_ms + config.allowed_lateness_ms
        clock, arrived = self.published_latest_ms or 0, self.published_arrived_ms
        for reach, window in enumerate(run):
            if window - clock > gap:
                return clock, arrived, reach
            clock = max(clock, self._latest(window))
            arrived = max(arrived, self.window_arrived[window])
        return clock, arrived, len(run)

    def _split(self, config: Windowing, run: list[int]) -> list[tuple[list[int], int, int]]:
        """Before the zero: a run's contiguous segments (no gap over a window and the allowed
        lateness between a window and the latest request before it), each (its windows, its
        clock, when that request came in). Each has its own clock from its own first window,
        so in-order requests after a quiet spell pass their windows."""
        gap = config.window_ms + config.allowed_lateness_ms
        segments: list[tuple[list[int], int, int]] = []
        for window in run:
            latest, arrived = self._latest(window), self.window_arrived[window]
            if segments and window - segments[-1][1] <= gap:
                windows, clock, came = segments[-1]
                segments[-1] = ([*windows, window], max(clock, latest), max(came, arrived))
            else:
                segments.append(([window], latest, arrived))
        return segments

    def _clocked(self, config: Windowing) -> list[tuple[list[int], int, int]]:
        """The open windows with a clock, grouped by the clock they share: before the zero,
        each segment of each run; after it, the run of the published rows."""
        if self.published_ms is None:
            return [segment for run in self.runs() for segment in self._split(config, run)]
        return [(run, *self._chain(config, run)[:2]) for run in self.runs()]

    def clocks(self, config: Windowing) -> dict[int, tuple[int, int]]:
        """Each open window with a clock -> (its clock, when its request came in: source's
        clock). The clock moves from the latest published request (before the zero: from the
        first window of the window's segment of its run; the zero is its run's, never
        another's) through the open windows of its run contiguous with it, no gap over a window
        and the allowed lateness (which requests produced in order leave none of)."""
        clocks: dict[int, tuple[int, int]] = {}
        for windows, clock, arrived in self._clocked(config):
            clocks.update(dict.fromkeys(windows, (clock, arrived)))
        return clocks

    def _latest(self, window: int) -> int:
        return max(ms for _, ms in self.open_days[window].values())

    def saw(
        self, config: Windowing, window: int, timestamps: np.ndarray | int, now_ms: int
    ) -> None:
        """Requests of window (their times) came in at now_ms (source's clock): the windows
        whose deadline their clock passes are due once everything before now_ms has come in."""
        runs = len(day_runs(self.waiting))
        if window not in self.open_days:
            bisect.insort(self.order, window)
        self.passed_ms.setdefault(window, None)
        self.hold(window, np.atleast_1d(np.asarray(timestamps, np.int64)))
        self.window_arrived[window] = now_ms
        self.arrived_ms = max(self.arrived_ms, now_ms)
        run = next((run for run in self.runs() if _holds(run, window)), [])
        if len(day_runs(self.waiting)) != runs:  # runs joined, or a new one: all judged again
            self.clock_moved(config, now_ms)
            return
        if self.published_ms is None:
            self._join(config, window, run, now_ms)
            return
        # Its run's clock only moved on: its windows newly passed, the newest first, down to
        # the first passed before (the passed are the run's first windows): no walk over all.
        if run:
            clock, _, reach = self._chain(config, run)
            passed = bisect.bisect_right(run, clock - config.deadline_ms(0), 0, reach)
            for earlier in reversed(run[:passed]):
                if self.passed_ms[earlier] is not None:
                    break
                self.passed_ms[earlier] = now_ms

    def _join(self, config: Windowing, window: int, run: list[int], now_ms: int) -> None:
        """Before the zero: window's segment of its run (the one before it, reached, or a new
        one) moved on to window's requests, joining the segments after it its clock now
        reaches; its windows newly passed, the newest first, down to the first passed before
        (a segment's passed are its first windows: those before a passed one go out with it),
        and the segment before it judged again (_pass_on)."""
        gap = config.window_ms + config.allowed_lateness_ms
        place = bisect.bisect_right(self.firsts, window) - 1
        first = self.firsts[place] if place >= 0 else None
        if first is not None and _holds(run, first) and window - self.segments[first][0] <= gap:
            clock, arrived = self.segments[first]
        else:
            first, clock, arrived, place = window, self._latest(window), now_ms, place + 1
            self.firsts.insert(place, window)
        clock, arrived = max(clock, self._latest(window)), max(arrived, now_ms)
        joined = False
        while place + 1 < len(self.firsts) and _holds(run, self.firsts[place + 1]):
            if self.firsts[place + 1] - clock > gap:
                break
            after = self.firsts.pop(place + 1)
            self.passing.discard(after)
            if self.passed_ms[after] is not None:
                self._pass(run, first, after, now_ms)
            later, came = self.segments.pop(after)
            clock, arrived, joined = max(clock, later), max(arrived, came), True
        self.segments[first] = (clock, arrived)
        start = bisect.bisect_left(run, first)
        passed = bisect.bisect_right(run, clock - config.deadline_ms(0), start)
        for earlier in reversed(run[start:passed]):
            if self.passed_ms[earlier] is not None and not joined:
                break
            self.passed_ms[earlier] = self.passed_ms[earlier] or now_ms
        if self.passed_ms[first] is not None:
            self.passing.add(first)
        # Its segment came in last (the source's clock moves on): the one before it alone can
        # be newly passed by the next segment (older ones were judged when theirs came in).
        if place > 0 and _holds(run, self.firsts[place - 1]):
            self._pass_on(run, place - 1, now_ms)

    def _pass_on(self, run: list[int], place: int, now_ms: int) -> None:
        """Before the zero: the segment at place (in firsts) passed by the next of its run if
        that one's latest request came in strictly after its own (source's clock): every
        request of the next lies past its windows' deadlines (segments are a window and the
        allowed lateness apart), and only an arrival strictly later says it was produced after
        them, in order (one instant orders nothing: a clock hours ahead arriving with the
        stream never passes it)."""
        earlier, later = self.firsts[place], self.firsts[place + 1]
        if self.segments[later][1] > self.segments[earlier][1]:
            self._pass(run, earlier, later, now_ms)
            self.passing.add(earlier)

    def _pass(self, run: list[int], first: int, end: int, now_ms: int) -> None:
        """The run's windows from first up to end passed at now_ms, the newest first, down to
        the first passed before (those before are: a segment's passed are its first)."""
        start, place = bisect.bisect_left(run, first), bisect.bisect_left(run, end)
        while place > start and self.passed_ms[run[place - 1]] is None:
            place -= 1
            self.passed_ms[run[place]] = now_ms

    def clock_moved(self, config: Windowing, now_ms: int) -> None:
        """The open windows' deadlines against their clocks: passed from now_ms on, or no
        longer passed when the clock went back (a run lost its latest request to the anchor).
        Before the zero, also those the next segment of their run passed (_pass_on) and those
        before a passed one in their segment; what passed stays passed (the clocks of what
        waits never go back before the zero: letters are whole runs, a recut judges anew)."""
        self.segments, self.passing, passed = {}, set(), set()
        if self.published_ms is None:
            for run in self.runs():
                split = self._split(config, run)
                for place, (windows, clock, came) in enumerate(split):
                    self.segments[windows[0]] = (clock, came)
                    reach = bisect.bisect_right(windows, clock - config.deadline_ms(0))
                    if place + 1 < len(split) and split[place + 1][2] > came:
                        reach = len(windows)
                    before = [i + 1 for i, w in enumerate(windows) if self.passed_ms[w] is not None]
                    reach = max(reach, *before, 0)
                    passed.update(windows[:reach])
                    if reach:
                        self.passing.add(windows[0])
        else:
            for windows, clock, _ in self._clocked(config):
                passed.update(w for w in windows if config.deadline_ms(w) <= clock)
        self.firsts = sorted(self.segments)
        for window, at in self.passed_ms.items():
            if window not in passed:
                self.passed_ms[window] = None
            elif at is None:
                self.passed_ms[window] = now_ms

    def due_ms(self, config: Windowing, window: int, clock_ms: int, arrived_ms: int) -> int:
        """When (source's watermark) a window its clock has not passed is published: once the
        source has been idle for config.idle_ms past the time the clock (clock_ms, its request
        in at arrived_ms), run on at the source's pace, would pass the deadline (a live
        stream's last window closes at its deadline, a backfill's a moment after its last
        request: neither by the wall clock). Before the zero, MAX_GAP_DAYS of the source's
        clock later: idle time alone never fixes the zero (the stream's end does, by the batch
        rule)."""
        due = arrived_ms + max(config.deadline_ms(window) - clock_ms, 0) + config.idle_ms
        return due if self.published_ms is not None else due + MAX_GAP_DAYS * DAY_MS

    def timers(self, config: Windowing) -> dict[int, int]:
        """The timer each open window needs (source's watermark): a passed window at the
        arrival that passed it; the oldest window waiting on the stream's clock (before the
        zero: of the bulk's run, on its segment's clock) at its due_ms. Every other waits for
        these (a passed window of a later segment takes the earlier segments of its run with
        it), for the next publication (which judges it) or for the stream's end."""
        runs = self.runs()
        if self.published_ms is None:  # the passed: each segment's first windows
            firsts = sorted(self.passing)
        else:
            firsts = [run[0] for run in runs]
        wanted: dict[int, int] = {}
        for first in firsts:
            for place in range(bisect.bisect_left(self.order, first), len(self.order)):
                passed = self.passed_ms[self.order[place]]
                if passed is None:
                    break
                wanted[self.order[place]] = passed
        # Once anchored every open window lies in the anchor's run: the controller holds only
        # requests judged against it (keep_arriving), and the days it letters or publishes
        # never split the run (tests: test_an_anchored_stream_holds_no_window_off_its_run).
        if self.published_ms is not None:
            clocked = runs[0] if runs else []
        else:
            first, last = plausible_days(self.waiting)
            clocked = next((r for r in runs if first <= min(self.open_days[r[0]]) <= last), [])
        waiting = next((w for w in clocked if self.passed_ms[w] is None), None)
        if waiting is not None:
            if self.published_ms is None:
                segment = self.firsts[bisect.bisect_right(self.firsts, waiting) - 1]
                clock, arrived = self.segments[segment]
            else:
                clock, arrived, _ = self._chain(config, clocked)
            wanted[waiting] = self.due_ms(config, waiting, clock, arrived)
        return wanted

    def due(self, config: Windowing, watermark_ms: int, everything: bool = False) -> list[int]:
        """The open windows due at watermark_ms (everything: the stream's end), oldest first,
        with every older open window: windows go out in time order, so once one is published
        an older one's requests are late (and said so), never a window of their own after it."""
        if everything:
            return list(self.order)
        due = self._timed_out(config, watermark_ms)
        return self.order[: bisect.bisect_right(self.order, max(due))] if due else []

    def _timed_out(self, config: Windowing, watermark_ms: int) -> list[int]:
        """The open windows whose own timer is due at watermark_ms (not those due() sweeps
        along with them)."""
        return [w for w, due_ms in self.timers(config).items() if due_ms <= watermark_ms]

    def first_anchor(
        self, config: Windowing, watermark_ms: int, everything: bool = False
    ) -> dict[int, int]:
        """Before the zero: the requests per day of the run whose window is due now (the bulk,
        by the batch rule, of the runs holding a window whose own timer is due: at the stream's
        end, of everything waiting), which fixes the zero; empty when none is due. The older
        windows due() sweeps along never vote: an older run of a reset clock, due only beside
        them, would outvote the run that is due."""
        counts = self.waiting
        if everything:
            first, last = plausible_days(counts)
        else:
            due = {min(self.open_days[w]) for w in self._timed_out(config, watermark_ms)}
            runs = [run for run in day_runs(counts) if any(run[1] <= d <= run[2] for d in due)]
            if not runs:
                return {}
            _, first, last = max(runs)
        return {day: held for day, held in counts.items() if first <= day <= last}

    def recut(
        self, config: Windowing, origin_ms: int, waiting: list[tuple[int, HashedBatch]]
    ) -> list[tuple[int, HashedBatch]]:
        """Before any window is published, the zero moved to origin_ms (an earlier request came
        in, or the earliest was a stray clock's): the waiting requests cut again from it. When a
        request past a new window's deadline came in is known no closer than the latest
        arrival: the window waits for everything produced before that. A new window came in
        when the latest of the old windows its requests were cut from did (an old window's
        requests lie within a window of each other, in one segment or two adjacent ones): a
        segment's latest arrival is kept, so the next still passes it (_pass_on) after a stray
        zero is lettered, never sooner than its own requests say."""
        self.origin_ms = origin_ms
        cut, arrived = [], {}
        for old, batch in waiting:
            for window, part in by_window(batch, origin_ms, config.window_ms, config.coarsening):
                cut.append((window, part))
                came = self.window_arrived.get(old, self.arrived_ms)
                arrived[window] = max(arrived.get(window, came), came)
        self.passed_ms, self.window_arrived = {}, arrived
        self.rehold(config, cut)
        return cut

    def rehold(self, config: Windowing, waiting: list[tuple[int, HashedBatch]]) -> None:
        """The open windows are those waiting (cut again, or judged: the letters' days no
        longer count); their deadlines judged again, as passed at the latest arrival when
        passed."""
        self.open_days, self.waiting = {}, {}
        for window, batch in waiting:
            self.passed_ms.setdefault(window, None)
            self.window_arrived.setdefault(window, self.arrived_ms)
            self.hold(window, batch.requests["timestamp_ms"])
        for window in [w for w in self.passed_ms if w not in self.open_days]:
            del self.passed_ms[window]
            self.window_arrived.pop(window, None)
        self.order = sorted(self.open_days)
        self.clock_moved(config, self.arrived_ms)

    def publish(self, window: int) -> str:
        """The folder of an open window published now: named by the windows published before
        it, so a restart restoring this state names it again the same."""
        del self.passed_ms[window]
        if _holds(self.order, window):
            del self.order[bisect.bisect_left(self.order, window)]
        self.published_arrived_ms = max(
            self.published_arrived_ms, self.window_arrived.pop(window, 0)
        )
        for day, (held, latest) in self.open_days.pop(window, {}).items():
            self.waiting[day] -= held
            if not self.waiting[day]:
                del self.waiting[day]
            self.published_days[day] = self.published_days.get(day, 0) + held
            self.published_latest_ms = max(latest, self.published_latest_ms or latest)
        self.published_ms, self.windows = window, self.windows + 1
        self.segments, self.firsts, self.passing = {}, [], set()  # anchored: one clock now
        return window_name(self.windows - 1)

    def last_published(self) -> str:
        return window_name(self.windows - 1)


def _holds(run: list[int], window: int) -> bool:
    """Whether a run (sorted windows) holds window."""
    place = bisect.bisect_left(run, window)
    return place < len(run) and run[place] == window
