"""Red team round 12, the gate (nothing private published): reproducers of what a capture run
(`anonymize --capture`) or the gate lets through, each asserting the promised behaviour: an
engine's raw block hashes reach no file the run leaves (docs/CAPTURES.md "Never published, never
written"), its dead letters included; each request's measured cached tokens stay private
(docs/PRIVACY.md), only their aggregate published."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import SALT, anonymize, chat, dynamo_request_end, write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.slow
START_MS = 1_700_000_000_000


def _requests() -> tuple[list[dict], list[int]]:
    """Four Dynamo request_end records of 40 tokens at block size 4, and their raw hashes."""
    records = [
        dynamo_request_end(START_MS + 1_000 * i, list(range(100 + i, 140 + i)), 4, 3)
        for i in range(4)
    ]
    return records, [h for r in records for h in r["request"]["replay"]["input_sequence_hashes"]]


def _leaked(tmp_path: Path, lines: list[str], raw: list[int]) -> list[int]:
    """Run the capture night over lines; the raw hashes found in any file it left."""
    source = tmp_path / "in" / "request_trace.jsonl"
    source.parent.mkdir()
    source.write_text("".join(line + "\n" for line in lines))
    args = ["anonymize", "--capture", "dynamo-request-trace", "--block-size", "4"]
    code = main([*args, "--input", str(source), "--output", str(tmp_path / "out"), "--quiet",
                 "--max-rejected-fraction", "1"])  # fmt: skip
    assert code == 0 and (tmp_path / "out-rejected").is_dir()
    written = b"".join(
        p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file() and p != source
    )
    assert all(str(h).encode() in source.read_bytes() for h in raw)  # the check can fail
    return [h for h in raw if str(h).encode() in written]


def test_a_capture_letter_whose_field_name_is_escaped_holds_no_engine_hash(tmp_path):
    """A letter's line is withheld when its BYTES hold `sequence_hashes`/`chunk_hashes`, but
    JSON reads `input_sequence_hashe\\u0073` as the same field: a capture record so spelled
    and rejected (here: no request_received_ms) is written to the dead letters whole, its
    engine hashes with it."""
    records, raw = _requests()
    del records[1]["request"]["request_received_ms"]
    escaped = [
        json.dumps(r).replace("input_sequence_hashes", "input_sequence_hashe\\u0073")
        for r in records
    ]
    assert _leaked(tmp_path, escaped, raw) == []


def test_a_pretty_printed_capture_record_leaves_no_engine_hash_in_the_letters(tmp_path):
    """One request_end pretty-printed among compact ones (`jq .` without -c): each of its lines
    is an invalid_json letter, and the lines holding only hashes (`  1234...,`) carry no field
    name, so they are written whole; the night still publishes the other records."""
    records, raw = _requests()
    lines = [json.dumps(r) for r in records[:3]] + json.dumps(records[3], indent=2).splitlines()
    last = set(records[3]["request"]["replay"]["input_sequence_hashes"])
    assert [h for h in _leaked(tmp_path, lines, raw) if h in last] == []


def test_a_measured_aggregate_of_one_request_is_not_published(tiny_tokenizer, tmp_path):
    """PRIVACY.md keeps each request's measured cached tokens private and publishes only their
    aggregate; when one record of the night carries the engine's count, stats.json's `measured`
    is that request's count, its input tokens the length that finds its row, and the gate
    passes it."""
    records = [chat(i, 1_000 * i) for i in range(6)]
    records[4]["num_cached_tokens"] = 7
    (tmp_path / "in").mkdir()
    source = write_jsonl(tmp_path / "in" / "logs.jsonl", records)
    (tmp_path / "salt").write_text(SALT)
    out = tmp_path / "out"
    flags = ("--block-size", "4", "--salt-file", str(tmp_path / "salt"), "--quiet")
    assert anonymize(tiny_tokenizer, [source], out, *flags) == 0
    measured = json.loads((out / "stats.json").read_text()).get("measured")
    assert measured is None or measured["requests"] == 1  # the check can fail: its one request
    if measured is not None:  # written: then the gate refuses to publish it
        assert main(["audit", str(out), "--tokenizer", tiny_tokenizer]) != 0
