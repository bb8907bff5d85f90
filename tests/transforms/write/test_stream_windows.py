"""The stream's windows and clock (transforms/write/stream_windows.py), pure: what anchors the
stream, what fixes its zero, when a window is due, which timers a message sets."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.encode.hashed_batch import HashedBatch, HashedRequest
from kvtrace.transforms.encode.timestamp_kinds import keep_arriving, keep_plausible_windows
from kvtrace.transforms.read.timestamps import DAY_MS, MAX_GAP_DAYS
from kvtrace.transforms.write.coarsen import Coarsening
from kvtrace.transforms.write.stream_windows import Progress, by_window

MINUTE = 60_000
DAY = DAY_MS
RESET = 365 * DAY  # a clock gone a year ahead
NOW = 1_800_000_000_000  # the source's clock: long after the requests' own times


@dataclasses.dataclass(frozen=True)
class Windows:
    """A stream's windowing as its config gives it (stream_windows.Windowing)."""

    window_ms: int = MINUTE
    allowed_lateness_ms: int = 0
    idle_ms: int = 10_000
    coarsening: Coarsening = Coarsening()

    def deadline_ms(self, window_start_ms: int) -> int:
        return window_start_ms + self.window_ms + self.allowed_lateness_ms


def requests_at(*timestamps: int) -> HashedBatch:
    return HashedBatch.pack(
        [HashedRequest(ts, i, 1, 1, b"", None) for i, ts in enumerate(timestamps)]
    )


def test_a_clock_reset_never_moves_the_streams_clock():
    """Before the zero each run of days waits on its own clock, its latest request: a reset
    passes no deadline of the real requests' run, and is never passed by theirs; the run of
    the window due fixes the zero, and the reset is a letter then (first_anchor)."""
    config = Windows()
    progress = Progress()
    progress.saw(config, 0, [10_000], NOW)
    progress.saw(config, RESET, [RESET + 1], NOW + 1)
    progress.saw(config, 0, [20_000], NOW + 2)
    assert progress.passed_ms == {0: None, RESET: None}
    assert progress.clocks(config) == {0: (20_000, NOW + 2), RESET: (RESET + 1, NOW + 1)}
    progress.saw(config, MINUTE, [70_000], NOW + 3)  # a real request passes window 0's deadline
    assert progress.passed_ms[0] == NOW + 3 and progress.due(config, NOW + 3) == [0]
    # The run due anchors the zero: the reset's day is none of its.
    assert progress.first_anchor(config, NOW + 3) == {0: 3}


def test_requests_beyond_a_gap_wait_for_the_streams_clock():
    """Once the zero is fixed, requests more than a window and the allowed lateness ahead of
    the stream's clock (a producer logging local time, within the published rows' days) pass
    no deadline until windows fill the gap, and are due only once the stream's clock, run on at
    the source's pace, passes their deadline: idle time never publishes them early, so the
    in-order requests after them are never late."""
    config = Windows()
    ahead = 3 * MINUTE
    progress = Progress()
    progress.saw(config, 0, [10_000, 20_000], NOW)
    progress.publish(0)
    progress.saw(config, ahead, [ahead + 1, ahead + 2], NOW + 1)
    progress.saw(config, ahead + MINUTE, [ahead + MINUTE + 1], NOW + 2)  # its own run moves on
    assert progress.passed_ms == {ahead: None, ahead + MINUTE: None}
    # The stream's clock (20 s, in at NOW) reaches the window's deadline 220 s later.
    assert progress.timers(config) == {ahead: NOW + (ahead + MINUTE - 20_000) + config.idle_ms}
    progress.saw(config, MINUTE, [70_000], NOW + 3)  # the gap narrows: 110 s still
    assert progress.passed_ms[ahead] is None
    progress.saw(config, 2 * MINUTE, [130_000], NOW + 4)  # filled: the clock runs through
    assert progress.passed_ms == {
        MINUTE: NOW + 4,
        ahead: NOW + 4,
        2 * MINUTE: NOW + 4,
        ahead + MINUTE: None,
    }
    assert progress.due(config, NOW + 4) == [MINUTE, 2 * MINUTE, ahead]


def test_requests_ahead_never_outvote_the_published_rows():
    """Once windows are published, their rows anchor the stream: requests more than MAX_GAP_DAYS
    from them, however many (a reset, a clock years ahead), are judged with the published rows'
    days (letters), never the bulk of a judgement of their own; a request within MAX_GAP_DAYS
    of what waits beside the rows is kept."""
    progress = Progress()
    progress.saw(Windows(), 0, [0, 10_000, 20_000], NOW)
    progress.publish(0)
    ahead = [(RESET + n * MINUTE, requests_at(RESET + n * MINUTE + 1)) for n in range(7)]
    near = [(6 * DAY, requests_at(6 * DAY)), (13 * DAY, requests_at(13 * DAY))]
    kept, strays = keep_plausible_windows(ahead + near, progress.published_days)
    assert [window for window, _ in kept] == [6 * DAY, 13 * DAY]
    assert [letter.reason for letter in strays] == ["implausible_timestamp"] * 7


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0, 3, 6, 8, 13, 16, 30, 365]), st.booleans()),
        min_size=1,
        max_size=25,
    )
)
def test_an_anchored_stream_holds_no_window_off_its_run(arrivals):
    """As the controller holds requests once anchored (each judged on arrival against the
    published rows and what waits, keep_arriving) and publishes the oldest open window: every
    open window lies in the anchor's run (runs() covers them all), so Progress.timers needs no
    rule for a window off it."""
    config = Windows()
    progress = Progress()
    progress.saw(config, 0, [1_000], NOW)
    progress.publish(0)
    for n, (day, publish) in enumerate(arrivals):
        event_ms = day * DAY + MINUTE + n
        anchor = {**progress.published_days}
        for held_day, held in progress.waiting.items():
            anchor[held_day] = anchor.get(held_day, 0) + held
        kept, _ = keep_arriving(requests_at(event_ms), anchor)
        if kept is not None:
            progress.saw(config, event_ms // MINUTE * MINUTE, [event_ms], NOW + n)
        if publish and progress.order:
            progress.publish(progress.order[0])
        assert sum(map(len, progress.runs())) == len(progress.order)


def test_idle_time_alone_never_fixes_the_zero():
    """Before the zero, a window its run's clock has not passed (two requests of one still
    clock, a reset's two) is due only MAX_GAP_DAYS of the source's clock later than the idle
    rule would have it; once a window is published the idle rule applies."""
    config = Windows()
    first = Progress()
    first.saw(config, 0, [1_000, 2_000], NOW)
    idle = NOW + (MINUTE - 2_000) + config.idle_ms
    assert first.timers(config) == {0: idle + MAX_GAP_DAYS * DAY_MS}
    anchored = Progress()
    anchored.saw(config, 0, [1_000], NOW)
    anchored.publish(0)
    anchored.saw(config, MINUTE, [MINUTE + 1_000, MINUTE + 2_000], NOW)
    assert anchored.timers(config) == {MINUTE: idle}


def test_a_message_sets_only_the_timers_whose_time_changed():
    """Windows opened and none closed (each its own window, a gap from the last): the timers
    wanted are the oldest waiting window's, one due time a message, whatever is open."""
    config = Windows()
    progress, calls = Progress(), []
    due_ms = progress.due_ms
    progress.due_ms = lambda *args: calls.append(args) or due_ms(*args)  # type: ignore[method-assign]
    for i in range(50):
        progress.saw(config, i * 2 * MINUTE, [i * 2 * MINUTE], NOW)
        assert list(progress.timers(config)) == [0]
    assert len(calls) == 50


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0, 1, 2, 5, 9, 30]), st.integers(0, 10 * MINUTE), st.booleans()),
        min_size=1,
        max_size=30,
    ),
    st.booleans(),
)
def test_a_message_moves_the_clocks_as_judging_everything_again_does(requests, anchored):
    """saw() updates only the run the request joins (its newly passed windows), or everything
    when runs join or a new one starts: the windows passed are those a whole recomputation
    (clock_moved over every open window) finds, whatever the order requests come in
    and whichever came in at one instant."""
    config = Windows()
    progress = Progress()
    if anchored:
        progress.saw(config, 0, [1_000], NOW)
        progress.publish(0)
    arrived = NOW
    for day, offset, later in requests:
        arrived += later  # else in the instant of the one before (one batch)
        event_ms = day * DAY + MINUTE + offset
        window = event_ms // MINUTE * MINUTE
        if anchored and window <= 0:
            continue
        progress.saw(config, window, [event_ms], arrived)
        whole = dataclasses.replace(progress, passed_ms=dict(progress.passed_ms))
        whole.clock_moved(config, arrived)
        passed = {w for w, at in progress.passed_ms.items() if at is not None}
        assert passed == {w for w, at in whole.passed_ms.items() if at is not None}


def test_an_older_run_swept_along_never_outvotes_the_run_that_is_due():
    """due() sweeps every older open window along with one due, but only the runs holding a
    window whose own timer is due decide the zero: five requests of a reset clock (relative
    times, one window, its deadline passed by nothing) never outvote the two real ones whose
    window is due."""
    config = Windows()
    progress = Progress()
    real = 1000 * DAY
    progress.saw(config, 0, [1, 2, 3, 4, 5], NOW)
    progress.saw(config, real, [real + 1], NOW + 1)
    progress.saw(config, real + MINUTE, [real + MINUTE + 1], NOW + 2)  # passes window real's
    assert progress.due(config, NOW + 2) == [0, real]
    assert progress.first_anchor(config, NOW + 2) == {1000: 2}


def test_a_quiet_spell_after_the_first_window_never_holds_a_live_stream_back():
    """Before the zero each contiguous segment of a run has its own clock from its own first
    window: one request, three quiet minutes, then a request every 20 s for an hour, in order,
    passes the later windows as they come (not only the first window's MAX_GAP_DAYS bound);
    the first segment is passed by the next, which came in after it (the zero is still the
    earliest)."""
    config = Windows()
    progress = Progress()
    progress.saw(config, 0, [10_000], NOW)
    arrived = NOW
    for minute in range(3, 60):
        for second in (0, 20_000, 40_000):
            arrived += 20_000
            progress.saw(config, minute * MINUTE, [minute * MINUTE + second], arrived)
    assert progress.passed_ms[3 * MINUTE] == NOW + 4 * 20_000  # passed by the 4th minute's
    assert progress.passed_ms[0] == NOW + 20_000  # the third minute's came in after it
    assert progress.due(config, arrived) == [m * MINUTE for m in (0, *range(3, 59))]
    assert progress.first_anchor(config, arrived) == {0: 1 + 57 * 3}


def test_a_later_segment_passes_an_earlier_one_only_when_it_came_in_after_it():
    """Before the zero the next segment of a run (a quiet spell between) passes the windows of
    the one before once a request of it came in strictly after that one's latest (source's
    clock), due at that arrival; requests of one instant give no order, and another run's
    requests never pass a window, however much later they came in."""
    config = Windows()
    progress = Progress()
    progress.saw(config, 0, [10_000], NOW)
    progress.saw(config, 5 * MINUTE, [5 * MINUTE], NOW)  # one instant: no order
    assert progress.passed_ms == {0: None, 5 * MINUTE: None}
    progress.saw(config, 5 * MINUTE, [5 * MINUTE + 1_000], NOW + 1)
    assert progress.passed_ms == {0: NOW + 1, 5 * MINUTE: None}
    assert progress.due(config, NOW) == [] and progress.due(config, NOW + 1) == [0]
    far = Progress()
    far.saw(config, 0, [10_000], NOW)
    far.saw(config, 5 * MINUTE, [5 * MINUTE], NOW)
    far.saw(config, RESET, [RESET + 1], NOW + 1)  # another run: a year ahead
    far.saw(config, RESET + 5 * MINUTE, [RESET + 5 * MINUTE], NOW + 2)
    assert far.passed_ms == {0: None, 5 * MINUTE: None, RESET: NOW + 2, RESET + 5 * MINUTE: None}
    assert far.first_anchor(config, NOW + 2) == {RESET // DAY: 2}


def test_a_stray_zero_lettered_leaves_a_passed_segment_passed():
    """A stray clock's request first (the zero) then a sparse stream: the second real request,
    in after the first, passes the first's window; when the first publication letters the
    stray and cuts what waits again from the real zero (recut), each new window keeps when its
    requests came in, so that window is still passed, due as before."""
    config = Windows()
    progress = Progress()
    stray, first, second = 1_000, 1000 * DAY + 10_000, 1000 * DAY + 5 * MINUTE
    waiting = []
    for at, ms in enumerate([stray, first, second]):
        if progress.origin_ms is None:
            progress.recut(config, ms, [])
        ((window, batch),) = by_window(requests_at(ms), progress.origin_ms, MINUTE)
        waiting.append((window, batch))
        progress.saw(config, window, [ms], NOW + at)
    assert progress.passed_ms[waiting[1][0]] == NOW + 2
    cut = progress.recut(config, first, waiting[1:])  # the stray lettered
    assert [window for window, _ in cut] == [first, first + 4 * MINUTE]
    assert progress.passed_ms == {first: NOW + 2, first + 4 * MINUTE: None}
    assert progress.due(config, NOW + 2) == [first]


def test_a_stream_keeps_requests_by_their_arrival_order_never_by_their_batching():
    """Once anchored, requests are judged in arrival order against the anchor's run as it
    stands, each one kept extending it: a request on day d + 4, then one on d + 8, are kept
    whether one bundle batches them or two; the d + 8 one first is a letter (arrival order
    alone decides, as it must in a stream: what is kept is published before what follows)."""
    day = 20_000
    anchor = {day: 10}
    between, ahead = (day + 4) * DAY, (day + 8) * DAY + 5
    kept, letters = keep_arriving(requests_at(between, ahead), anchor)
    assert kept is not None and len(kept) == 2 and letters == []
    first, first_letters = keep_arriving(requests_at(between), anchor)
    then, then_letters = keep_arriving(requests_at(ahead), {**anchor, day + 4: 1})
    assert first is not None and then is not None and first_letters + then_letters == []
    alone, alone_letters = keep_arriving(requests_at(ahead, between), anchor)
    assert alone is not None and alone.requests["timestamp_ms"].tolist() == [between]
    assert [letter.reason for letter in alone_letters] == ["implausible_timestamp"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-20, 20), min_size=1, max_size=12), st.sets(st.integers(1, 11)))
def test_however_bundles_batch_the_requests_the_same_are_kept(offsets, cuts):
    """keep_arriving over one batch keeps what it keeps over the same requests cut into
    batches, each judged against the anchor and the requests kept before it."""
    anchor = {20_000: 3}
    times = [(20_000 + offset) * DAY + n for n, offset in enumerate(offsets)]
    whole, _ = keep_arriving(requests_at(*times), anchor)
    kept_whole = [] if whole is None else whole.requests["timestamp_ms"].tolist()
    kept_cut, standing = [], dict(anchor)
    bounds = [0, *sorted(c for c in cuts if c < len(times)), len(times)]
    for start, end in zip(bounds, bounds[1:]):
        part, _ = keep_arriving(requests_at(*times[start:end]), standing)
        for ts in [] if part is None else part.requests["timestamp_ms"].tolist():
            kept_cut.append(ts)
            standing[ts // DAY] = standing.get(ts // DAY, 0) + 1
    assert kept_cut == kept_whole
