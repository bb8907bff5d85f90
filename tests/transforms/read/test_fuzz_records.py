"""Fuzz harness for the record parser and the render step: every node of every supported request
shape replaced by hostile values (wrong types, unhashable `type`s, huge and deep values), as a
JSONL line and as a Parquet row. Invariant: each record is a Request that renders (or a dead
letter), never an exception; and good records are untouched by the bad ones beside them."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.dead_letters import DeadLetter
from kvtrace.transforms.encode.encode_requests import EncodeOptions, RequestEncoder
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.tokenize import load_tokenizer
from kvtrace.transforms.read.json_tree import ContainerBudget, loads_checked
from kvtrace.transforms.read.records import ParseOptions, Request, load_json_line
from kvtrace.transforms.read.sources import parse_one

TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
SHAPES = {
    "chat_tools": {
        "timestamp": 1_700_000_000_000,
        "session_id": "s",
        "output_length": 5,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "description": "d",
                    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
                },
            }
        ],
    },
    "responses": {
        "timestamp": "2025-01-01T00:00:00Z",
        "request": {
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "x"},
            ],
            "instructions": "sys",
        },
        "response": {
            "output": [
                {"type": "message", "content": [{"type": "output_text", "text": "yo"}]},
                {"type": "function_call", "name": "f", "arguments": "{}"},
                {"type": "reasoning", "summary": [{"text": "s"}]},
            ]
        },
    },
    "anthropic": {
        "timestamp": 1_700_000_000,
        "request": {
            "system": [{"type": "text", "text": "sys"}],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [{"type": "text", "text": "r"}],
                        },
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm"},
                        {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}},
                    ],
                },
            ],
            "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        },
        "response": {
            "type": "message",
            "content": [
                {"type": "text", "text": "ok"},
                {"type": "tool_use", "name": "f", "input": {}},
            ],
        },
    },
    "streamed": {
        "timestamp": 1_700_000_000_123,
        "request": {"messages": [{"role": "user", "content": "hi"}]},
        "response": [
            {
                "created": 1_700_000_000,
                "choices": [
                    {
                        "delta": {
                            "content": "a",
                            "tool_calls": [
                                {"index": 0, "function": {"name": "f", "arguments": "{"}}
                            ],
                        }
                    }
                ],
            },
            {"choices": [{"delta": {"content": "b", "reasoning_content": "r"}}]},
            {"choices": [{"text": "c"}]},
        ],
    },
    "completion": {
        "timestamp": 5,
        "prompt": "hello world",
        "response": {
            "choices": [{"message": {"content": "a", "tool_calls": [TOOL_CALL]}}],
            "usage": {"completion_tokens": 2},
        },
    },
    "tokens": {"timestamp": 5, "input_ids": [1, 2, 3], "conversation_id": 7, "output": "bye"},
    "anthropic_tools_only": {
        "timestamp": 5,
        "max_tokens": 9,
        "tools": [{"name": "f", "input_schema": {"properties": {"a": {"type": "integer"}}}}],
        "messages": [{"role": "user", "content": "hi"}],
    },
    "litellm_payload": {
        "startTime": 1_700_000_000.5,
        "endTime": 1_700_000_001.25,
        "messages": [{"role": "user", "content": "hi"}],
        "model_parameters": {"tools": [{"type": "function", "function": {"name": "f"}}]},
        "response": {"created": 1_700_000_001, "choices": [{"message": {"content": "a"}}]},
        "completion_tokens": 1,
    },
    "litellm_spend_log": {
        "startTime": "2023-11-14T22:13:20.5Z",
        "endTime": "2023-11-14 22:13:21.25",
        "messages": {},
        "response": {},
        "session_id": "s",
        "completion_tokens": 1,
        "proxy_server_request": {"messages": [{"role": "user", "content": "hi"}]},
    },
    "batch_joined": {
        "custom_id": "r",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9},
        "response": {
            "status_code": 200,
            "request_id": "q",
            "body": {"created": 1_700_000_000, "usage": {"completion_tokens": 2}},
        },
        "error": None,
    },
}


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


HOSTILE = [
    None,
    True,
    0,
    -1,
    2**70,
    1.5,
    1e308,
    "",
    "\u202e",
    [],
    {},
    [1, [2]],
    {"a": {"b": "c"}},
    [{"type": [1]}],
    {"type": {"x": 1}},
    _nested(3000),
    '{"a":' * 3000 + "1" + "}" * 3000,
]


def _paths(value: object, path: tuple = ()) -> Iterator[tuple]:
    yield path
    children = (
        value.items()
        if isinstance(value, dict)
        else (enumerate(value) if isinstance(value, list) else ())
    )
    for key, child in children:
        yield from _paths(child, path + (key,))


def _replaced(record: dict, path: tuple, value: object) -> object:
    if not path:
        return value
    record = copy.deepcopy(record)
    holder = record
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return record


@pytest.fixture(scope="module", params=["tiny", "qwen3", "deepseek-r1"])
def encoder(request, tiny_tokenizer):
    if request.param == "tiny":
        path = tiny_tokenizer
    else:
        from helpers import shared_path

        path = str(shared_path("tokenizers", request.param))
    return RequestEncoder(
        load_tokenizer(path), b"\0" * 16, EncodeOptions(path, SaltSource("random"), block_size=16)
    )


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_every_node_of_every_shape_with_any_value_is_a_request_or_a_dead_letter(shape, encoder):
    seed = SHAPES[shape]
    good = parse_one("f", json.dumps(seed).encode(), ParseOptions())
    assert isinstance(good, Request), good
    cases = 0
    for path in list(_paths(seed)):
        for value in HOSTILE:
            record = _replaced(seed, path, value)
            try:
                line = json.dumps(record).encode()
            except RecursionError:
                line = None
            for item in ([line] if line else []) + [record]:  # a JSONL line, a Parquet row
                parsed = parse_one("f", item, ParseOptions())
                cases += 1
                if isinstance(parsed, DeadLetter):
                    assert parsed.reason and parsed.reason != "malformed_record", parsed
                    continue
                batch, letters = encoder.encode([parsed, good])
                # The good record beside it always comes through, whatever this one did.
                assert batch is not None and len(batch) + len(letters) == 2
    assert cases > 100


# Engine hash captures (anonymize --capture FORMAT), each as its writer writes it.
CAPTURE_SHAPES = {
    "dynamo-request-trace": {
        "schema": "dynamo.request.trace.v1",
        "event_type": "request_end",
        "event_time_unix_ms": 1_700_000_000_050,
        "agent_context": {"session_id": "s", "parent_session_id": None},
        "request": {
            "request_id": "r",
            "output_tokens": 3,
            "request_received_ms": 1_700_000_000_000,
            "replay": {
                "trace_block_size": 4,
                "input_length": 6,
                "input_sequence_hashes": [12_345_678_901_234_567_890, 98_765_432_109_876_543],
                "hash_algorithm": "blake3-keyed-chain64-v1",
                "hash_key_id": "k",
            },
        },
    },
    "lmcache-lookup-hashes": {
        "timestamp": 1_700_000_000.25,
        "request_id": "r",
        "model_name": "m",
        "chunk_size": 4,
        "seq_len": 9,
        "dtypes": ["torch.bfloat16"],
        "shapes": [[2, 4, 4, 8]],
        "chunk_hashes": ["0x" + "ab" * 32, "-0x1f2e3d4c5b6a7988"],
    },
}


@pytest.mark.parametrize("capture", sorted(CAPTURE_SHAPES))
def test_every_node_of_every_capture_with_any_value_is_a_request_or_a_dead_letter(capture):
    """As for text shapes; the capture encoder needs no tokenizer (anonymize --capture)."""
    seed = CAPTURE_SHAPES[capture]
    options = ParseOptions(capture=capture)
    encoder = RequestEncoder(None, b"\0" * 16, EncodeOptions("", SaltSource("random"), 4))
    good = parse_one("f", json.dumps(seed).encode(), options)
    assert isinstance(good, Request) and good.capture is not None, good
    cases = 0
    for path in list(_paths(seed)):
        for value in HOSTILE:
            record = _replaced(seed, path, value)
            try:
                line = json.dumps(record).encode()
            except RecursionError:
                line = None
            for item in ([line] if line else []) + [record]:  # a JSONL line, a Parquet row
                parsed = parse_one("f", item, options)
                cases += 1
                if isinstance(parsed, DeadLetter):
                    assert parsed.reason and parsed.reason != "malformed_record", parsed
                    continue
                batch, letters = encoder.encode([parsed, good])
                assert batch is not None and len(batch) + len(letters) == 2
    assert cases > 100


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(value=JSON_VALUES, spacing=st.sampled_from([None, (",", ":"), (", ", ": ")]))
def test_a_line_reads_exactly_as_the_standard_parser_reads_it(value, spacing):
    """orjson where it reads the same, the standard parser elsewhere: the same value with the
    same types (integers past 64 bits stay integers, -0.0 stays a float)."""
    line = json.dumps({"extra": value}, separators=spacing).encode()
    assert repr(load_json_line(line)[0]) == repr(json.loads(line))


@settings(max_examples=400, deadline=None)
@given(
    value=JSON_VALUES | st.just(float("nan")) | st.just(float("-inf")),
    spacing=st.sampled_from([None, (",", ":"), (", ", ": ")]),
    ascii_only=st.booleans(),
    surrogate=st.booleans(),
)
def test_tool_call_arguments_read_exactly_as_the_standard_parser_reads_them(
    value, spacing, ascii_only, surrogate
):
    """Arguments strings (orjson where it reads the same): the same value and types, NaN and
    infinities, lone surrogates escaped or raw, integers past 64 bits."""
    text = json.dumps(
        {"a": value, "s": "\ud800" if surrogate else "x"},
        separators=spacing,
        ensure_ascii=ascii_only,
    )
    assert repr(loads_checked(text, ContainerBudget(10**6))) == repr(json.loads(text))
