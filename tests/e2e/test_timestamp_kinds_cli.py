"""Plausible timestamps only: a relative time among epoch dates (or the reverse) and a clock reset
to a plausible date are dead letters of their own and never move the origin; the same in both
engines, as a transform and across a stream's windows.

The whole CLI runs; the unit tests are in tests/transforms/encode/test_timestamp_kinds.py."""

from __future__ import annotations

import json

import pytest

from helpers import anonymize, assert_same_output, chat, read_jsonl, trace, write_jsonl
from kvtrace.transforms.encode.timestamp_kinds import IMPLAUSIBLE_TIMESTAMP, TIMESTAMP_KIND_MISMATCH

EPOCH_MS = 1_700_000_000_000


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_a_clock_reset_or_a_relative_time_in_a_night_never_moves_the_origin(
    tiny_tokenizer, tmp_path
):
    night = [chat(i, EPOCH_MS + 1000 * i) for i in range(6)]
    strays = [chat(9, 946_684_800_000), chat(8, 5)]  # 2000-01-01, a relative time
    alone = write_jsonl(tmp_path / "night.jsonl", night)
    assert anonymize(tiny_tokenizer, [alone], tmp_path / "alone") == 0
    src = write_jsonl(tmp_path / "in.jsonl", night[:3] + strays + night[3:])
    for engine in ("local", "beam"):
        assert anonymize(tiny_tokenizer, [src], tmp_path / engine, "--engine", engine) == 0
        assert trace(tmp_path / engine) == trace(tmp_path / "alone")
        letters = read_jsonl(next((tmp_path / f"{engine}-rejected").glob("*.jsonl")))
        assert sorted(
            (letter["error"], json.loads(letter["line"])["timestamp_ms"]) for letter in letters
        ) == [(IMPLAUSIBLE_TIMESTAMP, 946_684_800_000), (TIMESTAMP_KIND_MISMATCH, 5)]
        records = json.loads((tmp_path / engine / "manifest.json").read_text())["records"]
        assert records["exported"] == 6  # and 2 letters, above: all 8 read
    assert_same_output(tmp_path / "local", tmp_path / "beam")
