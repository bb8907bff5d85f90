"""Engine hash captures: request records that hold an engine's block hashes instead of text.

Each format is read as its writer writes it (docs/CAPTURES.md names the code and commit read):
- dynamo-request-trace: Dynamo's request trace (`dynamo.request.trace.v1`), a `request_end`
  event whose `request.replay` holds `trace_block_size`, `input_length` and
  `input_sequence_hashes` (u64), one per block, the partial last block included: cut exactly
  where kvtrace's text path cuts.
- lmcache-lookup-hashes: LMCache's lookup hash log (`--lookup-hash-log-dir`), one line per
  lookup with `timestamp` (epoch s), `chunk_size`, `seq_len` and `chunk_hashes` (hex strings),
  full chunks only: the tokens past the last full chunk have no hash, so their block gets a key
  of its own request (Capture.tail), never shared, as the manifest says.

A capture's hashes are unkeyed (or keyed with a secret the engine's operators share): they must
reach nothing kvtrace writes. They are read here into a Capture, re-keyed with the run's salt
first thing in the encode step (encode/captures.py), and never quoted: the messages below name
fields and counts, never values. A capture record's dead letter withholds its line
(dead_letters.DeadLetter.withhold): every letter of a capture run, and a text run's letter of a
record holds_engine_hashes finds.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.timestamps import timestamp_ms
from kvtrace.transforms.trace_format import (
    CAPTURE_FORMATS,
    CAPTURE_ROW_FIELDS,
    MAX_OUTPUT_LENGTH,
    OUTPUT_LENGTH_FIELD,
    RESPONSE_FIELD,
    SESSION_FIELD,
)

DYNAMO, LMCACHE = CAPTURE_FORMATS
DYNAMO_REQUEST_TRACE = "dynamo.request.trace.v1"
# The hash scheme a Dynamo request trace names when its writer keyed the hashes
# (DYN_REQUEST_TRACE_HASH_KEY_FILE); without it they are the KV router's XXH3-64 chain.
DYNAMO_UNKEYED = "dynamo-xxh3-64-seed1337"
# LMCache writes a bytes hash (blake3, sha256_cbor: 32 bytes) as 0x + hex, an int hash
# (Python's builtin) as hex(), a sign included; matched a line per hash (_hex_hashes).
_HEX_LINES = re.compile(r"-?0x[0-9a-f]{1,64}(?:\n-?0x[0-9a-f]{1,64})*")
_LMCACHE_FIELDS = ("chunk_hashes", "chunk_size", "seq_len")
_MAX_COUNT = MAX_OUTPUT_LENGTH
_SCHEME_CHARS = 64  # a scheme name or key id longer than this is no writer's
_MAX_REQUEST_ID_CHARS = 1024
# What the fields engines keep their block hashes in are named with (Dynamo's request trace:
# input_sequence_hashes, output_sequence_hashes; LMCache's lookup hash log: chunk_hashes).
ENGINE_HASH_FIELDS = ("sequence_hashes", "chunk_hashes")
# A decoded key differs from its text only through an escape, and only \u makes a letter.
_ESCAPE = b"\\u"


@dataclass(frozen=True)
class Capture:
    """One request's engine block hashes, as the engine logged them."""

    scheme: str  # which hash function (and key id) made them: hashes of two schemes never match
    block_size: int
    input_length: int
    hashes: tuple[bytes, ...]  # each hash's bytes as logged, in block order
    # For an engine that hashes full blocks only, what keys the partial last block: the
    # request's own identity, so that block is its request's alone. None: no such block.
    tail: bytes | None = None


def is_capture(record: dict[str, Any]) -> bool:
    """Whether a decoded record is an engine hash capture of any format kvtrace reads."""
    return _format_of(record) is not None


def holds_engine_hashes(line: bytes, value: Any) -> bool:
    """Whether a decoded JSON value (line: its text) may hold an engine's block hashes: it is a
    capture, or any key anywhere in it, decoded, names a field engines keep them in. Its keys
    are walked only when the line holds such a name or an escape; otherwise no decoded key can
    name one. Iterative: the value may be nested past what a parse check allows."""
    if isinstance(value, dict) and is_capture(value):
        return True
    if _ESCAPE not in line and not any(name.encode() in line for name in ENGINE_HASH_FIELDS):
        return False
    keys: list = []
    level = [value]
    while level:  # a level at a time over containers only, as json_tree's depth check walks
        keys += [key for node in level if type(node) is dict for key in node]
        level = [
            child
            for node in level
            for child in (node.values() if type(node) is dict else node)
            if type(child) in (dict, list)
        ]
    names = "\0".join(key for key in keys if type(key) is str)
    return any(name in names for name in ENGINE_HASH_FIELDS)


def _format_of(record: dict[str, Any]) -> str | None:
    if record.get("schema") == DYNAMO_REQUEST_TRACE:
        return DYNAMO
    if all(name in record for name in _LMCACHE_FIELDS):
        return LMCACHE
    return None


def capture_fields(record: dict[str, Any], capture: str | None) -> dict[str, Any]:
    """The Request fields of a capture record in a run of --capture `capture`: kind, capture,
    timestamp_ms, output_length, session, response_ms, defaulted. Raises Rejected, quoting no
    value: a capture outside a capture run, a record of another format in one (ids of text and
    of captures never meet: a night is one or the other, its manifest says)."""
    if capture is None:
        raise Rejected(
            "engine_capture", "an engine hash capture: anonymize it with --capture (its format)"
        )
    if _format_of(record) != capture:
        raise Rejected("not_a_capture", f"not a record of the --capture {capture} format")
    return _as_its_format_gives(capture, _READERS[capture](record))


# The Request field each capturable row field is read into (trace_format.CAPTURED_FIELDS but the
# parent: a capture carries no links, so no capture row continues one).
_REQUEST_FIELDS = {
    OUTPUT_LENGTH_FIELD: "output_length",
    SESSION_FIELD: "session",
    RESPONSE_FIELD: "response_ms",
}


def _as_its_format_gives(capture: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A reader's fields, each row field its format does not give (trace_format.
    CAPTURE_ROW_FIELDS, the table the audit holds the night's rows to) none, whatever the
    record holds; an output length not given is defaulted."""
    given = CAPTURE_ROW_FIELDS[capture]
    held = {**fields, **{key: None for name, key in _REQUEST_FIELDS.items() if name not in given}}
    held["defaulted"] = ("output_length",) if held["output_length"] is None else ()
    return held


def _dynamo(record: dict[str, Any]) -> dict[str, Any]:
    if record.get("event_type") != "request_end":
        raise Rejected("not_a_request", "a request-trace event other than request_end")
    request = _object(record.get("request"), "request")
    replay = _object(request.get("replay"), "request.replay")
    block_size = _count(replay.get("trace_block_size"), "request.replay.trace_block_size")
    input_length = _count(replay.get("input_length"), "request.replay.input_length")
    hashes = _u64s(replay.get("input_sequence_hashes"))
    _check_blocks(len(hashes), block_size, input_length, -(-input_length // max(block_size, 1)))
    received = request.get("request_received_ms")
    if received is None:
        raise Rejected("missing_timestamp", "no request.request_received_ms")
    if type(received) is not int:
        raise Rejected("wrong_type", "request.request_received_ms is not an integer")
    output = request.get("output_tokens")
    output_length = None if output is None else _count(output, "request.output_tokens")
    return {
        "kind": "capture",
        "capture": Capture(_dynamo_scheme(replay), block_size, input_length, hashes),
        "timestamp_ms": timestamp_ms(received, "ms"),
        "output_length": output_length,
        "session": _session(record.get("agent_context")),
        "response_ms": _response_ms(record.get("event_time_unix_ms"), received),
    }


def _u64s(hashes: Any) -> tuple[bytes, ...]:
    """Each hash of a list of u64 as its 8 bytes (little-endian); one pack checks them all."""
    if isinstance(hashes, list) and not any(h is True or h is False for h in hashes):
        try:
            packed = struct.pack(f"<{len(hashes)}Q", *hashes)
        except struct.error:  # a value no u64 is: negative, too large, not an integer
            pass
        else:
            return tuple(packed[i : i + 8] for i in range(0, len(packed), 8))
    raise Rejected("wrong_type", "request.replay.input_sequence_hashes is not a list of u64")


def _dynamo_scheme(replay: dict[str, Any]) -> str:
    """The hashes' scheme: the writer's keyed algorithm and key id, or the router's chain."""
    algorithm, key_id = replay.get("hash_algorithm"), replay.get("hash_key_id")
    if algorithm is None and key_id is None:
        return DYNAMO_UNKEYED
    if (
        not (isinstance(algorithm, str) and isinstance(key_id, str))
        or max(len(algorithm), len(key_id)) > _SCHEME_CHARS
    ):
        raise Rejected("wrong_type", "request.replay.hash_algorithm or hash_key_id is malformed")
    return f"{algorithm}:{key_id}"


def _lmcache(record: dict[str, Any]) -> dict[str, Any]:
    block_size = _count(record.get("chunk_size"), "chunk_size")
    input_length = _count(record.get("seq_len"), "seq_len")
    hashes = _hex_hashes(record.get("chunk_hashes"))
    _check_blocks(len(hashes), block_size, input_length, input_length // max(block_size, 1))
    request_id = record.get("request_id")
    if not isinstance(request_id, str) or len(request_id) > _MAX_REQUEST_ID_CHARS:
        raise Rejected("wrong_type", "request_id is not a string")
    arrival = record.get("timestamp")
    if arrival is None:
        raise Rejected("missing_timestamp", "no timestamp")
    if isinstance(arrival, bool) or not isinstance(arrival, (int, float)):
        raise Rejected("wrong_type", "timestamp is not a number")
    partial = input_length % block_size != 0
    return {
        "kind": "capture",
        "capture": Capture(
            LMCACHE,
            block_size,
            input_length,
            hashes,
            # the request's own: its id, where it was looked up, and what it looked up
            tail=f"{request_id}\0{arrival!r}\0{input_length}".encode("utf-8", "surrogatepass")
            if partial
            else None,
        ),
        "timestamp_ms": timestamp_ms(arrival, "s"),  # the writer's time.time()
    }


def _hex_hashes(hashes: Any) -> tuple[bytes, ...]:
    """Each hash of a list of LMCache's hex strings, as written (its writer spells a hash one
    way: hex() of an int, or 0x and a digest's hex), held to -?0x and 1 to 64 hex digits by one
    match over them all, a line each (a match per hash costs more than the rest of a record)."""
    if isinstance(hashes, list) and all(type(h) is str for h in hashes):
        lines = "\n".join(hashes)
        if not hashes or (lines.count("\n") == len(hashes) - 1 and _HEX_LINES.fullmatch(lines)):
            return tuple(map(str.encode, hashes))
    raise Rejected("wrong_type", "chunk_hashes is not a list of hex hashes")


_READERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    DYNAMO: _dynamo,
    LMCACHE: _lmcache,
}


def _check_blocks(hashes: int, block_size: int, input_length: int, expected: int) -> None:
    """The capture holds the hashes its writer writes for its length, a block size, a prompt."""
    if block_size == 0 or input_length == 0:
        raise Rejected("no_input", "the capture holds no tokens or no block size")
    if hashes != expected:
        raise Rejected(
            "capture_mismatch",
            f"{hashes} hashes for {input_length} tokens at block size {block_size}: "
            f"{expected} expected",
        )


def _object(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Rejected("wrong_type", f"{name} is not an object")
    return value


def _count(value: Any, name: str) -> int:
    if type(value) is not int:
        raise Rejected("wrong_type", f"{name} is not an integer")
    if not 0 <= value <= _MAX_COUNT:
        raise Rejected("out_of_range", f"{name} is outside [0, {_MAX_COUNT}]")
    return value


def _session(context: Any) -> str | None:
    """An agent trace's session id (Dynamo's agent_context), kept only as a keyed digest."""
    if not isinstance(context, dict) or context.get("session_id") is None:
        return None
    if not isinstance(context["session_id"], str):
        raise Rejected("wrong_type", "agent_context.session_id is not a string")
    return context["session_id"]


def _response_ms(end: Any, received: int) -> int | None:
    """Arrival to the response's end: the request_end event's time, when it is one."""
    if type(end) is not int or not received <= end <= received + _MAX_COUNT:
        return None
    return end - received
