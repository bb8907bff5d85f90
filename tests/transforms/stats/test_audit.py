"""kvtrace audit: a real output folder is publishable; doctored ones are flagged; the
granularity options coarsen what is published.

The unit tests; the whole CLI runs are in tests/e2e/test_audit_cli.py."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.trace_format import TraceColumns

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


ROW = st.fixed_dictionaries(
    {},
    optional={
        "timestamp": JSON,
        "input_length": JSON,
        "output_length": JSON,
        "hash_ids": JSON,
        "session": JSON,
        "extra": JSON,
    },
)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(ROW, JSON), max_size=8))
def test_hostile_rows_get_a_report_never_an_exception(rows):
    import tempfile
    from pathlib import Path

    from kvtrace.transforms.stats.audit import audit as measure

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace-00000-of-00001.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        report = measure(str(path))
    assert report["rows"] <= len(rows)
    assert report["publishable"] == (not report["flags"])
    assert report["publishable"] <= (report["rows"] == len(rows) > 0)


def test_largest_integers_name_only_fields_some_row_holds():
    """An absent session or response time is -1 in the columns: never a field's largest value
    (the report said "response_ms 1" of a trace with no response time)."""
    import numpy as np

    from kvtrace.transforms.stats.audit import _Rows
    from kvtrace.transforms.trace_format import NO_RESPONSE_MS, NO_SESSION, TraceColumns

    def rows(response_ms: list[int]) -> TraceColumns:
        n = len(response_ms)
        return TraceColumns(
            np.arange(n),
            np.full(n, 4),
            np.full(n, 2),
            np.full(n, 1),
            np.arange(n),
            np.full(n, NO_SESSION),
            np.array(response_ms),
        )

    seen = _Rows()
    seen.add(rows([NO_RESPONSE_MS] * 3), None)
    assert seen.largest == {"timestamp": 2, "input_length": 4, "output_length": 2, "hash_ids": 2}
    seen.add(rows([NO_RESPONSE_MS, 7]), None)
    assert seen.largest["response_ms"] == 7 and "session" not in seen.largest


def _parented(
    parents: list[int], start: int = 0, sessions: list[int] | None = None
) -> TraceColumns:
    """Rows from time `start` on, with these parents and sessions (all session 0 unless given)."""
    from kvtrace.transforms.trace_format import NO_RESPONSE_MS

    n = len(parents)
    return TraceColumns(
        start + np.arange(n),
        np.full(n, 4),
        np.full(n, 2),
        np.full(n, 1),
        np.arange(n),
        np.zeros(n, np.int64) if sessions is None else np.array(sessions),
        np.full(n, NO_RESPONSE_MS),
        parent=np.array(parents),
    )


def test_a_parent_row_must_precede_its_own_across_shards():
    """write/parents.py writes only earlier rows' numbers, counted across the shards in order:
    a parent_row naming its own row, a later one, or one past the earlier shards is flagged."""
    from kvtrace.transforms.stats.audit import _Rows
    from kvtrace.transforms.trace_format import NO_PARENT

    rows = _parented
    seen = _Rows()
    seen.add(rows([NO_PARENT, 0, 0]), None)
    seen.add(rows([2, 1, 3], 3), None)  # rows 3, 4, 5: each names an earlier one
    assert not seen.problems and seen.largest["parent_row"] == 3
    for wrong in ([3, 1], [NO_PARENT, 4], [5, NO_PARENT]):  # itself; itself; a later row
        seen = _Rows()
        seen.add(rows([NO_PARENT, 0, 0]), None)
        seen.add(rows(wrong, 3), None)
        assert seen.problems == ["parent_row rows that do not precede their own"], wrong


def test_a_parent_row_names_an_earlier_row_of_its_own_session_across_shards():
    """A parent lies in its row's session (trace_format.PARENT_SCOPE: the writer keys the link
    a request continues within its session): a parent of a sessionless row, or one naming a
    row of another session, an earlier shard's or this one's, is flagged."""
    from kvtrace.transforms.stats.audit import _Rows
    from kvtrace.transforms.trace_format import NO_PARENT, NO_SESSION

    rows = _parented
    first = rows([NO_PARENT, 0, NO_PARENT], sessions=[0, 0, 1])
    seen = _Rows()
    seen.add(first, None)
    seen.add(rows([2, 1, NO_PARENT], 3, [1, 0, NO_SESSION]), None)
    assert not seen.problems
    for parents, sessions in (
        ([1, NO_PARENT, NO_PARENT], [1, 0, 0]),  # row 1 is session 0's
        ([NO_PARENT, 3, NO_PARENT], [1, 0, 0]),  # this shard's row 3 is session 1's
        ([NO_PARENT, NO_PARENT, 0], [1, 0, NO_SESSION]),  # a sessionless row has none
    ):
        seen = _Rows()
        seen.add(first, None)
        seen.add(rows(parents, 3, sessions), None)
        assert len(seen.problems) == 1 and "outside their row's session" in seen.problems[0]


def test_foreign_owners_are_one_line_for_the_folder(tmp_path):
    """A copy that kept another user's owners names them once, not once per entry: a folder of
    many files cannot crowd the gate's other flags out of MAX_FLAGS."""
    from kvtrace.transforms.stats.audit import MAX_FLAGS, _entries, _Gate

    if os.geteuid() != 0:
        pytest.skip("only root gives files another user's owner here")
    for i in range(MAX_FLAGS + 5):
        (tmp_path / f"stray-{i}").write_bytes(b"1")
        os.chown(tmp_path / f"stray-{i}", 65534, -1)
    gate = _Gate()
    _entries(str(tmp_path), gate)
    owners = [flag for flag in gate.flags if "owners kvtrace does not set" in flag]
    assert len(owners) == 1
    assert len(gate.flags) == MAX_FLAGS  # the rest are the strays' own lines


def _gap_flags(shards: list[list[int]], granule_ms: int, last_ms: int = -1) -> list[str]:
    """The gap rule's flags on rows shard after shard (_Rows._check_gaps, as add calls it)."""
    from kvtrace.transforms.stats.audit import _Rows

    rows = _Rows(last_timestamp=last_ms)
    for times in shards:
        rows._check_gaps(np.array(times, np.int64), granule_ms)
        rows.last_timestamp = int(times[-1])
    return rows.problems


def test_an_entry_is_published_only_as_a_regular_file_of_one_name(tmp_path):
    """The gate's entry check, the one a Beam night's launcher holds its staging folder to: a
    hard-linked file (a write to its other name changes the published bytes in place), a link,
    a FIFO and a subfolder are each flagged by name; a file of its own passes."""
    from kvtrace.transforms.stats.audit import _entries, _Gate

    (tmp_path / "stats.json").write_bytes(b"{}")
    (tmp_path / "manifest.json").write_bytes(b"{}")
    os.link(tmp_path / "manifest.json", tmp_path.parent / f"{tmp_path.name}-outside")
    (tmp_path / "trace-00000-of-00001.jsonl").symlink_to(tmp_path / "stats.json")
    os.mkfifo(tmp_path / "trace-00000-of-00001.parquet")
    (tmp_path / "more").mkdir()
    gate = _Gate()
    assert _entries(str(tmp_path), gate) == ["stats.json"]
    assert gate.flags == [
        "manifest.json: a file of 2 names (a hard link), not one of its own",
        "a subfolder: more",
        "not a regular file (a link, FIFO or device): trace-00000-of-00001.jsonl",
        "not a regular file (a link, FIFO or device): trace-00000-of-00001.parquet",
    ]


def test_rows_over_the_batch_rules_gap_apart_are_flagged():
    """Rows whose zero (or one row) came from a clock gone wrong lie years apart: the gate
    refuses what the batch job would have lettered, in every folder (a night's, a map night's,
    a capture night's, a stream's window), across shards and windows as within one."""
    from kvtrace.transforms.read.timestamps import DAY_MS, MAX_GAP_DAYS

    near = (MAX_GAP_DAYS + 1) * DAY_MS - 1  # may lie within the rule's days: passes
    assert _gap_flags([[0], [near, near + 5]], 1) == []
    far = near + 5 + (MAX_GAP_DAYS + 1) * DAY_MS
    assert len(_gap_flags([[0], [near, near + 5], [far]], 1)) == 1  # across shards
    assert len(_gap_flags([[far]], 1, last_ms=near + 5)) == 1  # across windows
    assert len(_gap_flags([[far, far + 30 * DAY_MS]], 1)) == 1  # within one
    assert _gap_flags([[far]], 1) == []  # a first row: where it lies is checked elsewhere


def test_a_kept_pair_rounded_to_the_granule_is_never_flagged():
    """Two rows the rule keeps lie at most (MAX_GAP_DAYS + 1) days - 1 ms apart; rounded half
    up to a granule they may lie a whole granule multiple apart, 8 days exactly: passed with
    the folder's granule, flagged one granule wider (read/timestamps.widest_kept_gap_ms)."""
    from kvtrace.transforms.read.timestamps import DAY_MS, MAX_GAP_DAYS
    from kvtrace.transforms.write.coarsen import round_to

    kept = np.array([1, (MAX_GAP_DAYS + 1) * DAY_MS - 1])  # days d and d + 7, from a zero at 1
    published = round_to(kept - 1, 1000)
    assert int(np.diff(published)[0]) == (MAX_GAP_DAYS + 1) * DAY_MS
    assert _gap_flags([list(published)], 1000) == []
    assert len(_gap_flags([list(published + [0, 1000])], 1000)) == 1
    assert len(_gap_flags([list(published)], 1)) == 1
    assert _gap_flags([[0], [8 * DAY_MS]], DAY_MS) == []  # a day's granule: 8 days are kept
    assert len(_gap_flags([[0], [9 * DAY_MS]], DAY_MS)) == 1


def test_a_capture_nights_rows_hold_only_the_fields_its_format_gives():
    """A capture night's rows are held to trace_format.CAPTURE_ROW_FIELDS: LMCache's log gives
    no output length, session, response time or parent; Dynamo's gives all but a parent."""
    from kvtrace.transforms.stats.audit import _Rows
    from kvtrace.transforms.trace_format import NO_PARENT, NO_RESPONSE_MS, NO_SESSION

    bare = replace(
        _parented([NO_PARENT] * 3, sessions=[NO_SESSION] * 3), output_length=np.zeros(3, np.int64)
    )
    chosen = {
        "output_length": {"output_length": np.array([0, 7, 0])},
        "session": {"session": np.array([NO_SESSION, 0, NO_SESSION])},
        "response_ms": {"response_ms": np.array([NO_RESPONSE_MS, 5, NO_RESPONSE_MS])},
        "parent_row": {
            "parent": np.array([NO_PARENT, NO_PARENT, 0]),
            "session": np.zeros(3, np.int64),
        },
    }
    for capture, gives in (
        ("lmcache-lookup-hashes", ()),
        ("dynamo-request-trace", ("output_length", "session", "response_ms")),
    ):
        rows = _Rows()
        rows._check_captured(bare, capture)
        assert rows.problems == [], capture
        for name, change in chosen.items():
            rows = _Rows()
            rows._check_captured(replace(bare, **change), capture)
            assert bool(rows.problems) == (name not in gives), (capture, name)
            assert all(name in problem for problem in rows.problems)
