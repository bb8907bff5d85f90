"""Engine hash captures: request records that hold an engine's block hashes instead of text.

Supported: Dynamo's request trace (`dynamo.request.trace.v1`, a `request_end` event whose
`request.replay` holds `trace_block_size`, `input_length` and `input_sequence_hashes`; read from
ai-dynamo/dynamo lib/llm/src/request_trace/replay.rs and record.rs at 0366e63a, docs/CAPTURES.md).
Its hashes cover every block of the prompt, the partial last one included, chained as the engine
chains them, so they cut a prompt exactly where kvtrace's text path does.

A capture's hashes are unkeyed (or keyed with a secret the engine's operators share): they must
reach nothing kvtrace writes. They are read here into a Capture, re-keyed with the run's salt
first thing in the encode step (encode/captures.py), and never quoted: the messages below name
fields and counts, never values. A dead letter of a capture record withholds its line
(dead_letters.DeadLetter).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.timestamps import timestamp_ms
from kvtrace.transforms.trace_format import MAX_OUTPUT_LENGTH

DYNAMO_REQUEST_TRACE = "dynamo.request.trace.v1"
# The hash scheme a Dynamo request trace names when its writer keyed the hashes
# (DYN_REQUEST_TRACE_HASH_KEY_FILE); without it they are the KV router's XXH3-64 chain.
DYNAMO_UNKEYED = "dynamo-xxh3-64-seed1337"
_U64 = 1 << 64
_MAX_COUNT = MAX_OUTPUT_LENGTH
_SCHEME_CHARS = 64  # a scheme name or key id longer than this is no writer's


@dataclass(frozen=True)
class Capture:
    """One request's engine block hashes, as the engine logged them."""

    scheme: str  # which hash function (and key id) made them: hashes of two schemes never match
    block_size: int
    input_length: int
    hashes: bytes  # 8 bytes (u64 LE) per block, in block order


def is_capture(record: dict[str, Any]) -> bool:
    """Whether a decoded record is an engine hash capture (told by the schema its writer names)."""
    return record.get("schema") == DYNAMO_REQUEST_TRACE


def capture_fields(record: dict[str, Any], capture: str | None) -> dict[str, Any]:
    """The Request fields of a Dynamo request-trace record in a run of --capture `capture`:
    kind, capture, timestamp_ms, output_length, session, response_ms, defaulted. Raises
    Rejected, quoting no value: a capture outside a capture run, a record of another kind in
    one (ids of the two kinds never meet: a night is one or the other, its manifest says)."""
    if capture is None:
        raise Rejected(
            "engine_capture", "an engine hash capture: anonymize it with --capture (its format)"
        )
    if not is_capture(record):
        raise Rejected("not_a_capture", f"not a record of the --capture {capture} format")
    if record.get("event_type") != "request_end":
        raise Rejected("not_a_request", "a request-trace event other than request_end")
    request = _object(record.get("request"), "request")
    replay = _object(request.get("replay"), "request.replay")
    block_size = _count(replay.get("trace_block_size"), "request.replay.trace_block_size")
    input_length = _count(replay.get("input_length"), "request.replay.input_length")
    hashes = replay.get("input_sequence_hashes")
    if not isinstance(hashes, list) or not all(type(h) is int and 0 <= h < _U64 for h in hashes):
        raise Rejected("wrong_type", "request.replay.input_sequence_hashes is not a list of u64")
    if block_size == 0 or input_length == 0:
        raise Rejected("no_input", "request.replay holds no tokens or no block size")
    expected = -(-input_length // block_size)
    if len(hashes) != expected:
        raise Rejected(
            "capture_mismatch",
            f"{len(hashes)} input_sequence_hashes for input_length {input_length} at "
            f"trace_block_size {block_size}: {expected} expected",
        )
    received = request.get("request_received_ms")
    if received is None:
        raise Rejected("missing_timestamp", "no request.request_received_ms")
    if type(received) is not int:
        raise Rejected("wrong_type", "request.request_received_ms is not an integer")
    arrival = timestamp_ms(received, "ms")
    output = request.get("output_tokens")
    output_length = None if output is None else _count(output, "request.output_tokens")
    return {
        "kind": "capture",
        "capture": Capture(
            _scheme(replay), block_size, input_length, struct.pack(f"<{len(hashes)}Q", *hashes)
        ),
        "timestamp_ms": arrival,
        "output_length": output_length,
        "session": _session(record.get("agent_context")),
        "response_ms": _response_ms(record.get("event_time_unix_ms"), received),
        "defaulted": ("output_length",) if output_length is None else (),
    }


def _scheme(replay: dict[str, Any]) -> str:
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
