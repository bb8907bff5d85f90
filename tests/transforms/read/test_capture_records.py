"""Engine hash captures read as their writers write them (read/captures.py): the fields a row
needs, one-line refusals, and never a hash value in a message."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import dynamo_request_end, lmcache_lookup
from kvtrace.transforms.dead_letters import WITHHELD_LINE
from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.batch_join import batch_half
from kvtrace.transforms.read.captures import DYNAMO, DYNAMO_UNKEYED, LMCACHE, is_capture
from kvtrace.transforms.read.records import ParseOptions, parse_record
from kvtrace.transforms.read.sources import parse_one

TOKENS = list(range(10))  # 10 tokens: two full blocks of 4 and a partial one


def _line(record: dict) -> bytes:
    return json.dumps(record).encode()


def _parsed(record: dict, capture: str | None):
    return parse_record(_line(record), "cap.jsonl", ParseOptions(capture=capture))


def test_a_dynamo_request_end_becomes_a_capture_request():
    record = dynamo_request_end(5_000, TOKENS, 4, output_tokens=7, session="agent-1")
    request = _parsed(record, DYNAMO)
    capture = request.capture
    assert request.kind == "capture" and capture is not None
    assert (capture.block_size, capture.input_length, capture.tail) == (4, 10, None)
    assert capture.scheme == DYNAMO_UNKEYED
    hashes = record["request"]["replay"]["input_sequence_hashes"]
    assert [struct.unpack("<Q", h)[0] for h in capture.hashes] == hashes
    assert (request.timestamp_ms, request.output_length, request.response_ms) == (5_000, 7, 25)
    assert request.session == "agent-1" and request.defaulted == ()


def test_a_keyed_dynamo_trace_is_a_scheme_of_its_own():
    record = dynamo_request_end(1, TOKENS, 4, output_tokens=1)
    record["request"]["replay"] |= {"hash_algorithm": "blake3-keyed-chain64-v1", "hash_key_id": "k"}
    assert _parsed(record, DYNAMO).capture.scheme == "blake3-keyed-chain64-v1:k"


def test_an_lmcache_lookup_becomes_a_capture_request_with_its_own_tail():
    record = lmcache_lookup(1_700_000_000.25, "req-9", TOKENS, 4)
    request = _parsed(record, LMCACHE)
    capture = request.capture
    assert len(capture.hashes) == 2  # full chunks only: the writer hashes no partial one
    assert capture.hashes == tuple(h.encode() for h in record["chunk_hashes"])
    assert capture.tail is not None and b"req-9" in capture.tail
    assert request.timestamp_ms == 1_700_000_000_250
    assert request.output_length is None and request.defaulted == ("output_length",)
    whole = lmcache_lookup(1.0, "req-9", TOKENS[:8], 4)
    assert _parsed(whole, LMCACHE).capture.tail is None  # no partial block: nothing to key


def test_bytes_hashes_of_lmcache_read_as_written():
    record = lmcache_lookup(1.0, "r", TOKENS[:8], 4) | {"chunk_hashes": ["0x" + "ab" * 32] * 2}
    assert _parsed(record, LMCACHE).capture.hashes == (b"0x" + b"ab" * 32,) * 2


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda r: r.update(event_type="tool_start"), "not_a_request"),
        (lambda r: r["request"]["replay"]["input_sequence_hashes"].pop(), "capture_mismatch"),
        (lambda r: r["request"]["replay"].update(input_length=0), "no_input"),
        (lambda r: r["request"]["replay"].update(trace_block_size=0), "no_input"),
        (lambda r: r["request"]["replay"]["input_sequence_hashes"].append(-1), "wrong_type"),
        (lambda r: r["request"]["replay"]["input_sequence_hashes"].append(1 << 64), "wrong_type"),
        (lambda r: r["request"]["replay"].update(input_length="10"), "wrong_type"),
        (lambda r: r["request"].pop("request_received_ms"), "missing_timestamp"),
        (lambda r: r["request"].update(request_received_ms=1.5), "wrong_type"),
        (lambda r: r["request"].update(output_tokens=-1), "out_of_range"),
        (lambda r: r["request"].pop("replay"), "wrong_type"),
        (lambda r: r.update(agent_context={"session_id": 3}), "wrong_type"),
    ],
)
def test_a_malformed_dynamo_record_is_a_dead_letter_naming_no_value(change, reason):
    record = dynamo_request_end(1_000, TOKENS, 4, output_tokens=2)
    change(record)
    with pytest.raises(Rejected) as refused:
        _parsed(record, DYNAMO)
    assert refused.value.reason == reason
    for value in record["request"].get("replay", {}).get("input_sequence_hashes", []):
        assert str(value) not in refused.value.message


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda r: r["chunk_hashes"].append("0x1"), "capture_mismatch"),
        (lambda r: r["chunk_hashes"].__setitem__(0, "1f"), "wrong_type"),
        (lambda r: r["chunk_hashes"].__setitem__(0, "0x" + "f" * 65), "wrong_type"),
        (lambda r: r.update(timestamp="soon"), "wrong_type"),
        (lambda r: r.update(timestamp=None), "missing_timestamp"),
        (lambda r: r.update(request_id=7), "wrong_type"),
        (lambda r: r.update(chunk_size=0), "no_input"),
    ],
)
def test_a_malformed_lmcache_line_is_a_dead_letter(change, reason):
    record = lmcache_lookup(1.0, "r", TOKENS, 4)
    change(record)
    with pytest.raises(Rejected) as refused:
        _parsed(record, LMCACHE)
    assert refused.value.reason == reason


def test_captures_and_text_never_mix_in_a_night():
    """A capture in a text run, text (or another format) in a capture run: dead letters."""
    dynamo = dynamo_request_end(1, TOKENS, 4, output_tokens=1)
    assert is_capture(dynamo) and is_capture(lmcache_lookup(1.0, "r", TOKENS, 4))
    with pytest.raises(Rejected, match="--capture") as refused:
        _parsed(dynamo, None)
    assert refused.value.reason == "engine_capture"
    text = {"timestamp": 1, "prompt": "hello"}
    for record, capture in ((text, DYNAMO), (dynamo, LMCACHE)):
        with pytest.raises(Rejected) as refused:
            _parsed(record, capture)
        assert refused.value.reason == "not_a_capture"


@given(st.lists(st.integers(1 << 40, (1 << 64) - 1), min_size=1, max_size=6), st.integers(0, 11))
def test_no_letter_of_a_capture_holds_a_hash(hashes, which):
    """Whatever is wrong with a capture record, its letter holds neither its line nor any of
    its hashes, in decimal or hex (dead_letters.DeadLetter withholds them). Hashes are 64-bit:
    none is as short as a count its message may say."""
    record = dynamo_request_end(1_000, list(range(4 * len(hashes))), 4, output_tokens=1)
    record["request"]["replay"]["input_sequence_hashes"] = hashes
    broken = [
        lambda r: r.update(event_type="x"),
        lambda r: r["request"]["replay"].update(input_length=4 * len(hashes) + 5),
        lambda r: r["request"].update(request_received_ms="x"),
    ][which % 3]
    broken(record)
    letter = parse_one("cap.jsonl", _line(record), ParseOptions(capture=DYNAMO))
    written = letter.to_line().decode()
    for value in hashes:
        for form in (str(value), f"{value:x}", f"{value:016x}"):
            assert form not in written


HASH = 18373232785129012599  # a u64 no count or time of these records holds


@pytest.mark.parametrize(
    "line",
    [
        b"  " + str(HASH).encode() + b",",  # a pretty-printed record's line: not JSON
        b"[" + str(HASH).encode() + b"]",  # JSON, not an object
        _line({"timestamp": 1, "prompt": f"text {HASH}"}),  # text: not_a_capture
        b'{"a": ' * 70 + str(HASH).encode() + b"}" * 70,  # too deep
    ],
)
def test_every_letter_of_a_capture_run_withholds_its_line_whatever_it_holds(line):
    """A capture run decides by the run, not the bytes: each letter's line is withheld and its
    message loses its long numbers, whether or not the line names a hash field."""
    letter = parse_one("cap.jsonl", line, ParseOptions(capture=DYNAMO))
    assert letter.line == WITHHELD_LINE and str(HASH)[:8] not in letter.to_line().decode()


def test_a_text_run_withholds_the_letter_of_a_record_whose_decoded_key_names_hashes():
    """A text run decides on the decoded record, where it is decoded: a key naming a hash field
    through an escape, or deep in a list, withholds the letter of the record (refused then or
    later, by encode); a text record that merely mentions the name in a value, or a line that
    is not JSON, keeps its line for its provider to repair."""
    text = ParseOptions()
    escaped = b'{"timestamp": 1, "input_sequence_hashe\\u0073": [' + str(HASH).encode() + b"]}"
    nested = _line({"timestamp": 1, "meta": [{"x": {"chunk_hashes": [str(HASH)]}}]})
    for line in (escaped, nested):
        assert parse_one("in.jsonl", line, text).line == WITHHELD_LINE
    accepted = parse_one(
        "in.jsonl", _line({"timestamp": 1, "prompt": "hi", "meta": {"chunk_hashes": []}}), text
    )
    assert accepted.letter("no_input", "m").line == WITHHELD_LINE
    plain = _line({"timestamp": 1, "prompt": "hi"})
    assert parse_one("in.jsonl", plain, text).letter("no_input", "m").line == plain
    mention = _line({"timestamp": "x", "prompt": "what are chunk_hashes?"})
    assert parse_one("in.jsonl", mention, text).line == mention
    assert parse_one("in.jsonl", b"  1234,", text).line == b"  1234,"
    dynamo = _line(dynamo_request_end(1, TOKENS, 4, output_tokens=1))
    assert parse_one("in.jsonl", dynamo, text).line == WITHHELD_LINE  # engine_capture


def test_a_parquet_row_of_a_capture_run_too_large_is_withheld():
    """A row (decoded already) refused for its size: withheld in a capture run, its excerpt
    kept in a text run unless it names a hash field."""
    row = {"timestamp": 1, "prompt": "x" * 100, "chunk_size": HASH}
    small = ParseOptions(max_record_bytes=64)
    assert parse_one("t.parquet", row, small).line.startswith(b'{"timestamp"')
    assert (
        parse_one("t.parquet", row, ParseOptions(max_record_bytes=64, capture=LMCACHE)).line
        == WITHHELD_LINE
    )


def test_a_capture_run_joins_no_batch_lines():
    """Batch lines are parsed alone in a capture run, so every letter is made where the run's
    rule is (ParseOptions.withholds): none by the Batch join, which knows no run."""
    line = _line({"custom_id": "a", "body": {"prompt": "x"}, "url": "/v1/completions"})
    assert batch_half(line, ParseOptions()) is not None
    assert batch_half(line, ParseOptions(capture=DYNAMO)) is None


def test_a_capture_row_holds_only_the_fields_its_formats_table_lists(monkeypatch):
    """The reader builds a capture's row from trace_format.CAPTURE_ROW_FIELDS, the table the
    audit holds the night to: a format the table gives no session, output length or response
    time publishes none, whatever its record holds."""
    from kvtrace.transforms.trace_format import CAPTURE_FORMATS, CAPTURE_ROW_FIELDS, CAPTURED_FIELDS

    assert set(CAPTURE_ROW_FIELDS) == set(CAPTURE_FORMATS)  # closed: every format, no other
    assert all(given <= set(CAPTURED_FIELDS) for given in CAPTURE_ROW_FIELDS.values())
    record = dynamo_request_end(5_000, TOKENS, 4, output_tokens=7, session="agent-1")
    monkeypatch.setitem(CAPTURE_ROW_FIELDS, DYNAMO, frozenset())
    request = _parsed(record, DYNAMO)
    assert (request.output_length, request.session, request.response_ms) == (None, None, None)
    assert request.defaulted == ("output_length",)
