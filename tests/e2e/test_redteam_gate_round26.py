"""Red team round 26, the gate (nothing private published): reproducers of what `kvtrace audit`
still passes on a folder holding rows kvtrace never writes, each asserting the promised
behaviour (refused, exit 1, in one line), so each fails until it is fixed."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import chat, kvtrace_child, write_jsonl
from kvtrace.transforms.stats.audit import _Rows
from kvtrace.transforms.trace_format import (
    MANIFEST,
    STATS,
    TraceColumns,
    canonical_json,
    columns_of_jsonl,
    jsonl_bytes,
    parquet_bytes,
)
from kvtrace.transforms.write.manifest import set_content_times
from kvtrace.transforms.write.publish import sha256_of

pytestmark = pytest.mark.slow
SHARD = "trace-00000-of-00001"
DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def night(tiny_tokenizer, tmp_path_factory) -> Path:
    """A publishable night at block size 4: six rows 1 s apart, two sessions."""
    tmp = tmp_path_factory.mktemp("redgate26")
    log = write_jsonl(tmp / "night.jsonl", [chat(i, 1000 * i, f"s{i % 2}") for i in range(6)])
    made = kvtrace_child(
        "anonymize", "--input", str(log), "--output", str(tmp / "out"),
        "--tokenizer", tiny_tokenizer, "--block-size", "4", "--quiet",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    audited = kvtrace_child("audit", str(tmp / "out"))
    assert audited.returncode == 0, audited.stdout
    return tmp / "out"


def _republished(night: Path, folder: Path, columns: TraceColumns) -> Path:
    """A copy of the night holding these rows, rewritten as anyone can with kvtrace's own
    serializers: both twins, stats.json from the rows, the manifest's digests, content times."""
    shutil.copytree(night, folder)
    (folder / f"{SHARD}.jsonl").write_bytes(jsonl_bytes(columns))
    (folder / f"{SHARD}.parquet").write_bytes(parquet_bytes(columns))
    manifest = json.loads((folder / MANIFEST).read_text())
    rows = _Rows()
    rows.block_size = manifest["block_size"]
    rows.add(columns, None)
    (folder / STATS).write_bytes(canonical_json(rows.stats()))
    manifest["sha256"] = {
        name: sha256_of((folder / name).read_bytes()) for name in manifest["files"]
    }
    (folder / MANIFEST).write_bytes(canonical_json(manifest))
    set_content_times(str(folder))
    return folder


def test_a_nights_rows_further_apart_than_the_batch_rule_keeps_are_refused(night, tmp_path):
    """kvtrace publishes no night with two rows further apart than the batch rule keeps (days
    over MAX_GAP_DAYS, 7, apart: read/timestamps.widest_kept_gap_ms, 8 days less 1 ms): the
    reader letters such a request `implausible_timestamp` (a clock reset, another clock), and
    the stream's audit refuses a stream of such rows (_check_stream_gap: "a clock gone wrong
    was published"). The night's audit holds only the first row to 0 (round 1), never the gaps:
    the same six rows with the first at 0 and the other five at the log's wall clock (epoch
    seconds, 1.76e9, read as ms: 20 days on) pass as publishable, and so does a last row at
    the 40-bit integer that spells "alice" (13 years on). Promised: refused, as the stream's
    audit refuses it (read/timestamps.widest_kept_gap_ms at the night's granule)."""
    columns = columns_of_jsonl((night / f"{SHARD}.jsonl").read_bytes())
    wall_clock = columns.timestamp.copy()
    wall_clock[1:] += 1_764_300_000  # the log's epoch seconds, after a first row at 0
    spelled = columns.timestamp.copy()
    spelled[-1] = int.from_bytes(b"alice", "big")
    for name, times in (("wall-clock", wall_clock), ("spelled", spelled)):
        assert int(np.diff(times).max()) > 8 * DAY_MS  # rows kvtrace never writes
        folder = _republished(night, tmp_path / name, dataclasses.replace(columns, timestamp=times))
        audited = kvtrace_child("audit", str(folder))
        assert audited.returncode == 1, (name, audited.stdout[-400:])
        assert "NOT publishable" in audited.stdout, name


def test_a_parent_row_outside_its_rows_session_is_refused(tiny_tokenizer, tmp_path):
    """kvtrace links a row to a parent only within its session: the one link a row continues is
    a tool call's, keyed within the request's conversation, and a request of no session
    continues none (encode/hashed_batch.link_key; read/links.py). So a night it writes with
    --emit-parents never holds a parent_row on a row without a session, nor one naming a row
    of another session. The gate holds a parent only to precede its row (_Rows._check_parents):
    the agent night (helpers.agent_log) with its sessionless last row pointed at row 5 and row
    6 (session 1) at row 2 (session 0) passes as publishable, so every row's parent is a free
    choice among the rows before it (log2(i) bits a row, a link between two users' conversations
    no log made). Promised: refused, each parent a row of the row's own session."""
    from helpers import agent_log

    log = write_jsonl(tmp_path / "agent.jsonl", [record for record, _ in agent_log()])
    night = tmp_path / "night"
    made = kvtrace_child(
        "anonymize", "--input", str(log), "--output", str(night), "--tokenizer", tiny_tokenizer,
        "--block-size", "4", "--emit-parents", "--quiet",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert kvtrace_child("audit", str(night)).returncode == 0
    columns = columns_of_jsonl((night / f"{SHARD}.jsonl").read_bytes())
    assert list(columns.session[5:]) == [1, 1, -1] and list(columns.parent[5:]) == [-1, 5, -1]
    parents = columns.parent.copy()
    parents[6], parents[7] = 2, 5  # session 1's row to session 0's; the sessionless row to one
    folder = _republished(night, tmp_path / "out", dataclasses.replace(columns, parent=parents))
    audited = kvtrace_child("audit", str(folder))
    assert audited.returncode == 1, audited.stdout[-400:]


def test_a_capture_nights_rows_hold_only_the_fields_its_format_gives(tiny_tokenizer, tmp_path):
    """A night of engine captures publishes what its capture format logs (docs/CAPTURES.md):
    LMCache's lookup hash log gives no output length (0, counted as defaulted), no session, no
    response time, and captures give no links (no parent_row). The gate holds a capture night's
    manifest to its format (`engine_capture`, confirmed by --capture) but its rows only to what
    any night's rows may hold: six LMCache rows given sessions, response times and output
    lengths (each up to 2^31 - 1), all rewritten with kvtrace's serializers, pass `audit
    --capture lmcache-lookup-hashes` as publishable: ~60 chosen bits a row where the format
    has none (a parent_row on each passes too). Promised: refused, a capture night's rows
    holding only the fields its format gives."""
    from helpers import kvtrace_token_ids, lmcache_lookup

    records = [chat(i, 1_700_000_000_000 + 1_000 * i, f"s{i % 2}", i % 3) for i in range(6)]
    token_ids = kvtrace_token_ids(tiny_tokenizer, records)
    lookups = [
        lmcache_lookup(r["timestamp"] / 1000, f"req-{i}", ids, 4)
        for i, (r, ids) in enumerate(zip(records, token_ids))
    ]
    capture = write_jsonl(tmp_path / "lookup_hashes_20260401_000000_000000.jsonl", lookups)
    night, lmcache = tmp_path / "night", ("--capture", "lmcache-lookup-hashes")
    made = kvtrace_child(
        "anonymize", "--input", str(capture), "--output", str(night), *lmcache,
        "--block-size", "4", "--quiet",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert kvtrace_child("audit", str(night), *lmcache).returncode == 0
    columns = columns_of_jsonl((night / f"{SHARD}.jsonl").read_bytes())
    assert not columns.output_length.any() and (columns.session == -1).all()
    chosen = dataclasses.replace(
        columns,
        session=np.array([0, 1, 0, 1, 0, 1]),
        response_ms=np.array([418_430, 1, 2, 3, 4, 5]),
        output_length=np.arange(7, 13),
    )
    folder = _republished(night, tmp_path / "out", chosen)
    audited = kvtrace_child("audit", str(folder), *lmcache)
    assert audited.returncode == 1, audited.stdout[-400:]


@pytest.mark.parametrize("granule", [1, 1000, 3_600_000, DAY_MS])
def test_a_night_of_the_widest_gap_the_batch_rule_keeps_stays_publishable(
    tiny_tokenizer, tmp_path, granule
):
    """The gate's gap rule is the reader's (read/timestamps.widest_kept_gap_ms at the manifest's
    granule): requests on days 7 apart, the first at its day's start and the next at its day's
    end (8 days less 1 ms), published at any granularity from 1 ms to a day, pass; one a
    further 8 days on is the reader's dead letter, never a published row."""
    base = 1_764_288_000_000  # a UTC midnight
    times = [base, base, base + 8 * DAY_MS - 1, base + 8 * DAY_MS - 1, base + 16 * DAY_MS]
    log = write_jsonl(tmp_path / "night.jsonl", [chat(i, t, "s") for i, t in enumerate(times)])
    made = kvtrace_child(
        "anonymize", "--input", str(log), "--output", str(tmp_path / "out"),
        "--tokenizer", tiny_tokenizer, "--block-size", "4", "--quiet",
        "--timestamp-granularity-ms", str(granule), "--max-rejected-fraction", "0.5",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    published = columns_of_jsonl((tmp_path / "out" / f"{SHARD}.jsonl").read_bytes()).timestamp
    assert len(published) == 4 and int(np.diff(published).max()) >= 8 * DAY_MS - granule
    audited = kvtrace_child(
        "audit", str(tmp_path / "out"), "--timestamp-granularity-ms", str(granule)
    )
    assert audited.returncode == 0, audited.stdout[-400:]


def test_a_windows_rows_continue_the_window_before_it(night, tiny_tokenizer):
    """The gap rule and time order hold across a stream's windows: _audit's rows start from
    the window before's last row (last_ms), not afresh (a merge once dropped it: each window
    was judged alone, and two windows 30 days apart passed)."""
    from kvtrace.transforms.stats.audit import Given, _audit

    given = Given(tokenizer=tiny_tokenizer)
    assert _audit(str(night), given, None, -1)[0]["publishable"]
    report, rows, _, _ = _audit(str(night), given, None, 40 * DAY_MS)
    assert not report["publishable"]
    assert rows.last_timestamp == 5000  # the folder's rows were added after last_ms
