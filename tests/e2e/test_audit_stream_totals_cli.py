"""A stream's cumulative.json, declared in trace_format.py and audited with the stream's folder:
only the figures the windows' rows prove, in the bytes the streaming driver writes; anything
else flagged, in one line, and the stream refused."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import anonymize, chat, write_jsonl
from kvtrace.cli import main
from kvtrace.pipelines.anonymize_config import AnonymizeConfig
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.stats import audit as gate
from kvtrace.transforms.trace_format import (
    MANIFEST,
    STREAM_TOTALS,
    STREAM_TOTALS_SCHEMA,
    canonical_json,
    window_name,
)
from kvtrace.transforms.write.manifest import set_content_times

pytestmark = pytest.mark.beam  # imports Beam: its tests share one worker

MINUTE = 60_000
ROWS, SESSIONS = 6, 2


@pytest.fixture(scope="module")
def night(tiny_tokenizer, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stream-totals")
    rows = [chat(i, 1000 * i, session=f"user-{i % SESSIONS}") for i in range(ROWS)]
    assert (
        anonymize(
            tiny_tokenizer, [write_jsonl(tmp / "in.jsonl", rows)], tmp / "out", "--block-size", "4"
        )
        == 0
    )
    return tmp / "out"


def stream_of(night: Path, tmp_path: Path, window_ms: int = MINUTE) -> Path:
    """The night as a stream's one window (its id_map {0, 0, 0}, as the stream numbers a first
    window), with the cumulative.json the driver writes for it."""
    from kvtrace.pipelines.anonymize_streaming import Progress, StreamingConfig, write_cumulative

    job = AnonymizeConfig(
        inputs=(),
        output=str(tmp_path / "stream"),
        staging=str(tmp_path / "staging"),
        tokenizer="x",
        salt=SaltSource("env", "KVTRACE_SALT"),
        dead_letter=str(tmp_path / "stream-rejected"),
        block_size=4,
    )
    window = shutil.copytree(night, tmp_path / "stream" / window_name(0))
    manifest = json.loads((window / MANIFEST).read_text())
    manifest["id_map"] = {"block_ids_from": 0, "sessions_from": 0, "time_from_ms": 0}
    (window / MANIFEST).write_bytes(canonical_json(manifest))
    set_content_times(str(window))
    blocks = json.loads((night / "stats.json").read_text())["unique_blocks"]
    write_cumulative(
        StreamingConfig(job, "pubsub:projects/p/subscriptions/s", window_ms),
        Progress(
            next_id={"blocks": blocks, "sessions": SESSIONS},
            origin_ms=0,
            published_ms=0,
            windows=1,
            rows=ROWS,
            rejected=3,
        ),
    )
    return tmp_path / "stream"


def totals_flags(stream: Path, tokenizer: str) -> list[str]:
    report = gate.audit(str(stream), tokenizer)
    assert report["publishable"] == (not report["flags"])
    return [flag for flag in report["flags"] if STREAM_TOTALS in flag]


def test_the_cumulative_json_the_stream_writes_passes(night, tiny_tokenizer, tmp_path):
    stream = stream_of(night, tmp_path)
    report = gate.audit(str(stream), tiny_tokenizer)
    assert report["publishable"], report["flags"]
    assert "rejected" not in json.loads((stream / STREAM_TOTALS).read_text())


def edited(stream: Path, change) -> None:
    totals = json.loads((stream / STREAM_TOTALS).read_text())
    change(totals)
    (stream / STREAM_TOTALS).write_bytes(canonical_json(totals))


@pytest.mark.parametrize(
    "change, flagged",
    [
        (lambda t: t.update(rejected=3), "Additional properties are not allowed ('rejected'"),
        (lambda t: t.update(notes="collected from alice's laptop"), "('notes' was unexpected)"),
        (lambda t: t.update(rows="six"), "rows: 'six' is not of type 'integer'"),
        (lambda t: t.update(rows=ROWS + 1), f"rows is {ROWS + 1}, the windows' rows give {ROWS}"),
        (lambda t: t.update(windows=2), "windows is 2, the windows' rows give 1"),
        (lambda t: t.update(sessions=SESSIONS + 40), "sessions is 42, the windows' rows give 2"),
        (lambda t: t.update(unique_blocks=t["unique_blocks"] - 1), "unique_blocks is"),
        (lambda t: t.update(rows=float(ROWS)), "rows: not printable ASCII, or a fraction"),
        (lambda t: t.pop("published_until_ms"), "'published_until_ms' is a required property"),
        (lambda t: t.update(published_until_ms=None), "published_until_ms is None, the end of"),
        (lambda t: t.update(published_until_ms=ROWS * 1000 - 1001), "published_until_ms is 4999"),
        (lambda t: t.update(published_until_ms=2 * MINUTE), "the end of the last window is 60000"),
        (lambda t: t.pop("window_ms"), "'window_ms' is a required property"),
        (lambda t: t.update(window_ms=MINUTE + 1), "window_ms 60001 is none of the round values"),
    ],
    ids=[
        "rejected",
        "free-key",
        "free-text",
        "rows",
        "windows",
        "sessions",
        "blocks",
        "fraction",
        "no-time",
        "null-time",
        "before-last-row",
        "a-window-on",
        "no-window",
        "odd-window",
    ],
)
def test_a_value_or_key_that_is_not_kvtraces_is_flagged(
    night, tiny_tokenizer, tmp_path, change, flagged
):
    stream = stream_of(night, tmp_path)
    edited(stream, change)
    flags = totals_flags(stream, tiny_tokenizer)
    assert any(flagged in flag for flag in flags), flags
    assert all("\n" not in flag for flag in flags)


def test_a_window_length_other_than_a_round_one_passes_only_as_the_run_was_given(
    night, tiny_tokenizer, tmp_path
):
    """Windows are cut at whole window lengths from the zero; a length the gate takes on trust
    would be a free choice of cuts, so only a round one passes unless the operator confirms it
    (audit --window-ms)."""
    stream = stream_of(night, tmp_path, window_ms=90_000)
    assert totals_flags(stream, tiny_tokenizer) == [
        f"{STREAM_TOTALS}: window_ms 90000 is none of the round values the gate passes "
        "unconfirmed: pass --window-ms as the run was given --window"
    ]
    assert gate.audit(str(stream), tiny_tokenizer, settings={"window_ms": 90_000})["publishable"]
    assert main(["audit", str(stream), "--tokenizer", tiny_tokenizer, "--window-ms", "90000"]) == 0
    assert main(["audit", str(stream), "--tokenizer", tiny_tokenizer, "--window-ms", "60000"]) == 1


def test_the_streams_folder_carries_only_the_times_and_modes_kvtrace_sets(
    night, tiny_tokenizer, tmp_path
):
    """The stream's own folder and cumulative.json get a night folder's checks: times derived
    from their content (the driver sets them after each window), kvtrace's modes."""
    stream = stream_of(night, tmp_path)
    os.utime(stream, ns=(stream.stat().st_atime_ns, stream.stat().st_mtime_ns + 1))
    assert any(f.startswith("file times") for f in gate.audit(str(stream), tiny_tokenizer)["flags"])
    stream = stream_of(night, tmp_path / "again")
    os.chmod(stream / STREAM_TOTALS, 0o604)
    assert any(
        f.startswith("permission bits") for f in gate.audit(str(stream), tiny_tokenizer)["flags"]
    )


def test_the_streams_folder_carries_only_the_streams_own_output_mark(
    night, tiny_tokenizer, tmp_path
):
    """The mark the stream keeps its folder by (claim_window: a window it claimed) passes;
    other bytes under the mark's name are an attribute kvtrace does not set."""
    from kvtrace.transforms.write.publish import OUTPUT_MARK, STREAM_WRITER, mark_output

    stream = stream_of(night, tmp_path)
    assert mark_output(str(stream), STREAM_WRITER, claimed=window_name(0))
    report = gate.audit(str(stream), tiny_tokenizer)
    assert report["publishable"], report["flags"]
    mark = os.getxattr(stream, OUTPUT_MARK)
    os.setxattr(stream, OUTPUT_MARK, mark.replace(b"}", b', "note": "x"}'))
    flags = gate.audit(str(stream), tiny_tokenizer)["flags"]
    assert any("extended attributes kvtrace does not set" in f for f in flags), flags


def test_a_time_finer_than_the_rows_granularity_is_flagged(tiny_tokenizer, tmp_path):
    rows = [chat(i, 10_000 * i) for i in range(3)]
    assert (
        anonymize(
            tiny_tokenizer,
            [write_jsonl(tmp_path / "in.jsonl", rows)],
            tmp_path / "out",
            "--block-size",
            "4",
            "--timestamp-granularity-ms",
            "10000",
        )
        == 0
    )
    stream = stream_of(tmp_path / "out", tmp_path)
    edited(stream, lambda t: t.update(rows=3, sessions=0))
    assert not totals_flags(stream, tiny_tokenizer)
    edited(stream, lambda t: t.update(published_until_ms=MINUTE + 1))
    assert totals_flags(stream, tiny_tokenizer) == [
        f"{STREAM_TOTALS}: published_until_ms is 60001, the end of the last window is 60000 ms "
        "(60000 ms windows from the zero, rounded to 10000 ms)"
    ]


@pytest.mark.parametrize(
    "content, flagged",
    [
        (lambda good: good.replace(b"  ", b" "), "not the bytes kvtrace writes"),
        (lambda good: good[:-1], "not the bytes kvtrace writes"),
        (lambda good: good.replace(b'"rows"', b'"rows": 1, "rows"', 1), "repeats a key"),
        (lambda good: b"[" * 100 + b"]" * 100, "nested deeper"),
        (lambda good: b"\xff\xfe", "not JSON"),
        (lambda good: b" " * 5000, "more than kvtrace writes"),
    ],
    ids=["indent", "no-newline", "repeated-key", "deep", "bytes", "oversize"],
)
def test_bytes_kvtrace_would_not_write_are_flagged(
    night, tiny_tokenizer, tmp_path, content, flagged
):
    stream = stream_of(night, tmp_path)
    path = stream / STREAM_TOTALS
    path.write_bytes(content(path.read_bytes()))
    flags = totals_flags(stream, tiny_tokenizer)
    assert any(flagged in flag for flag in flags), flags


def test_a_stream_without_its_totals_or_with_a_link_for_them_is_refused(
    night, tiny_tokenizer, tmp_path
):
    stream = stream_of(night, tmp_path)
    good = stream / STREAM_TOTALS
    moved = good.rename(tmp_path / "elsewhere.json")
    assert totals_flags(stream, tiny_tokenizer) == [
        f"no {STREAM_TOTALS}: the stream writes one after every window"
    ]
    os.symlink(moved, good)
    assert totals_flags(stream, tiny_tokenizer) == [
        f"{STREAM_TOTALS}: not a regular file (a link, FIFO or device)"
    ]


@pytest.fixture(scope="module")
def one_window_stream(night, tmp_path_factory) -> Path:
    return stream_of(night, tmp_path_factory.mktemp("fuzzed"))


_SCALAR = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False)
)
_JSON = st.recursive(
    _SCALAR,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=12,
)
_TOTALS_LIKE = st.fixed_dictionaries(
    {key: st.integers(-1, 100) | st.none() for key in STREAM_TOTALS_SCHEMA["properties"]},
    optional={"rejected": st.integers(0, 5), "note": st.text(max_size=8)},
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300) | _JSON.map(canonical_json) | _TOTALS_LIKE.map(canonical_json))
def test_any_other_cumulative_json_is_flagged_never_raised(one_window_stream, tiny_tokenizer, data):
    """Whatever bytes stand in the file: one-line flags, and the stream refused unless they are
    the very bytes the driver wrote."""
    path = one_window_stream / STREAM_TOTALS
    good = path.read_bytes()
    path.write_bytes(data)
    try:
        report = gate.audit(str(one_window_stream), tiny_tokenizer)
    finally:
        path.write_bytes(good)
    assert report["publishable"] == (data == good), report["flags"]
    assert all("\n" not in flag for flag in report["flags"])
