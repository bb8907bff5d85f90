"""Red team round 12, hostile input: reproducers of the holes found past the round-1..11 fixes
(test_redteam_input*.py). Each asserts the promised behaviour (docs/CAPTURES.md: an engine's
hashes reach nothing kvtrace writes or says, a dead letter included) and fails today
(2026-11-27)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import anonymize, lmcache_lookup, read_jsonl, write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.slow

# Four lookups of 9 tokens at chunk size 4: two hashed chunks each.
LOOKUPS = [lmcache_lookup(1_700_000_000.0 + i, f"r{i}", list(range(i, i + 9)), 4) for i in range(4)]


def _capture_run(inputs: list[Path], out: Path) -> int:
    args = ["anonymize", "--capture", "lmcache-lookup-hashes", "--block-size", "4"]
    for path in inputs:
        args += ["--input", str(path)]
    return main([*args, "--output", str(out), "--max-rejected-fraction", "1", "--quiet"])


def _letter_lines(out: Path) -> str:
    """Every letter's `line`, NULs dropped (a UTF-16 line's characters, read as bytes)."""
    letters = sorted(out.parent.glob(f"{out.name}-rejected/rejected-*.jsonl"))
    return "".join(r["line"] for p in letters for r in read_jsonl(p)).replace("\0", "")


def _hashes(lookups: list[dict]) -> list[str]:
    return [h for lookup in lookups for h in lookup["chunk_hashes"]]


def test_a_capture_written_as_utf16_leaves_no_hash_in_its_letters(tmp_path):
    """A capture saved as UTF-16 (a Windows shell's redirection does so) beside a good one:
    its lines are dead letters (invalid_json, invalid_utf8), and their `line` holds the
    engine's hashes, NULs between the characters, since no byte run spells `chunk_hashes`
    (dead_letters.ENGINE_HASH_FIELDS is matched in the raw bytes). Every record of a capture
    run is a capture's: its letter must hold none of them."""
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in LOOKUPS[:2]))
    utf16 = tmp_path / "lookup_hashes_utf16.jsonl"
    utf16.write_bytes("".join(json.dumps(r) + "\n" for r in LOOKUPS[2:]).encode("utf-16"))
    assert _capture_run([good, utf16], tmp_path / "out") == 0
    lines = _letter_lines(tmp_path / "out")
    assert "withheld" in lines  # the UTF-16 lines are letters, each line withheld by the run
    assert [h for h in _hashes(LOOKUPS[2:]) if h in lines] == []


def test_a_capture_record_naming_its_hashes_with_an_escape_leaves_no_hash_in_its_letter(tmp_path):
    """JSON lets a key be spelled with escapes: `"chunk\\u005fhashes"` reads as chunk_hashes,
    so the record is read as a capture (read/captures.py tells one by its decoded fields) and
    rejected for its timestamp, but its letter keeps the line: the withholding looks for the
    name in the raw bytes. The letter must hold none of the record's hashes."""
    late = json.dumps(dict(LOOKUPS[0], timestamp="late"))
    escaped = late.replace('"chunk_hashes"', '"chunk\\u005fhashes"')
    source = tmp_path / "lookup_hashes.jsonl"
    source.write_text(escaped + "\n" + json.dumps(LOOKUPS[1]) + "\n")
    assert _capture_run([source], tmp_path / "out") == 0
    lines = _letter_lines(tmp_path / "out")
    assert "withheld" in lines  # the rejected record is a letter, its line withheld
    assert [h for h in _hashes(LOOKUPS[:1]) if h in lines] == []


def test_a_trace_spanning_more_seconds_than_oracle_general_holds_is_refused(tmp_path, capsys):
    """`export --to libcachesim` writes each block's second from the trace's first in
    oracleGeneral's uint32 field (replay/agentic.oracle_general). The trace reader takes
    times in +-2^42 ms, a span of ~8.8e9 s, past 2^32: the later request's second wraps
    silently (8e9 s is written as 3705032704). Such a trace must be a one-line error, never a
    file of wrong times."""
    from kvtrace.transforms.replay.agentic import ORACLE_GENERAL

    rows = [{"timestamp": t, "input_length": 8, "hash_ids": [1, 2]} for t in (-4e12, 4e12)]
    source = tmp_path / "wide.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "wide.bin"
    code = main(["export", str(source), "--to", "libcachesim", "-o", str(out), "--block-size", "4"])
    if code == 0:  # written: every second as the trace says
        times = np.frombuffer(out.read_bytes(), dtype=ORACLE_GENERAL)["time"].tolist()
        assert times == [0, 0, 8_000_000_000, 8_000_000_000]
    assert code == 2 and capsys.readouterr().err.count("\n") == 1


def test_another_nights_measured_file_is_refused_by_calibrate(tiny_tokenizer, tmp_path, capsys):
    """docs/ANALYSIS.md: `kvtrace calibrate night --measured night-rejected/measured-RUNID.jsonl`.
    The measured file is keyed by shard and row only (read/measured.py) and names no night, so
    the file of another night whose rows fit is read as this night's: each count lands on
    another request and the fit is silently wrong. Two nights of the same six requests, the
    second's arrivals reversed: given the first night's file, calibrate must refuse in one
    line (exit 2), as it refuses a file naming a row the trace lacks."""
    user = {"role": "user", "content": "the quick brown fox jumps over the lazy dog " * 4}

    def night(name: str, times: list[int]) -> Path:
        records = [
            {
                "timestamp": t,
                "messages": [user] if i % 2 else [{**user, "content": user["content"] * 2}],
                "output_length": 3,
                "num_cached_tokens": 4 * i,
            }
            for i, t in enumerate(times)
        ]
        source = write_jsonl(tmp_path / f"{name}.jsonl", records)
        assert anonymize(tiny_tokenizer, [source], tmp_path / name, "--block-size", "4") == 0
        return tmp_path / name

    first = night("first", [1_000 * i for i in range(6)])
    second = night("second", [1_000 * (6 - i) for i in range(6)])
    (measured,) = (tmp_path / "first-rejected").glob("measured-*.jsonl")
    args = ["calibrate", "--block-size", "4", "--measured", str(measured)]
    assert main([*args, str(first)]) == 0  # the check can fail: its own night's file reads
    capsys.readouterr()
    assert main([*args, str(second)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
