"""Red team round 25, real logs as providers have them: reproducers of the holes found past the
round-1..24 fixes. Each feeds a log shaped as a gateway, an API or the engine writes it through
`kvtrace anonymize` with the real Qwen3 tokenizer and asserts the promised behaviour (exactly
what the serving engine would see; never a made-up length; no false letter).
Each fails today (2026-11-28)."""

from __future__ import annotations

import json

import pytest

from helpers import qwen3_run, shared_path

pytestmark = pytest.mark.slow

T0 = 1763700000000  # 2025-11-21T04:40:00Z, epoch ms
QUESTION = [{"role": "user", "content": "When is high tide in Kyoto and in Osaka today?"}]
TIDE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_tide",
        "description": "The day's high tide at a place",
        "parameters": {"type": "object", "properties": {"place": {"type": "string"}}},
    },
}
CALLS = [("call_a", {"place": "Kyoto"}), ("call_b", {"place": "Osaka"})]


def _chunk(delta: dict, finish: str | None = None) -> dict:
    """A Chat Completions stream chunk, as the API streams it."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": T0 // 1000,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def test_a_streamed_tool_call_without_usage_is_not_exported_shorter_than_the_engine_generated(
    tmp_path,
):
    """Never a made-up length. A Chat Completions stream carries no usage unless the client
    asks for it (`stream_options.include_usage`, off by default), so a gateway's log of a
    default stream holds the deltas only and kvtrace counts the output from their text
    (records._output -> chat.generated_text): the tool calls' names and arguments concatenated,
    `get_tide{"place": "Kyoto"}get_tide{"place": "Osaka"}`, 20 tokens. The model did not
    generate that: the engine's tool parser cut the calls out of what the model wrote in its
    template's tool-call format (Qwen3's `<tool_call>\\n{"name": ..., "arguments": ...}\\n
    </tool_call>` per call, then its end-of-turn token), 42 tokens and more for these two
    calls, each counted in the engine's completion_tokens and each a decode step and a KV slot
    in the replay. (The same cause shorts every text-counted output: a reasoning model's
    `<think>` markup and the end-of-turn token the engine counts are never in it.) Promised:
    the length the engine generated (at least the calls as its template writes them), or a
    letter saying the log does not hold it."""
    from transformers import AutoTokenizer

    deltas = [_chunk({"role": "assistant", "content": None})]
    for index, (call_id, arguments) in enumerate(CALLS):
        call = {"index": index, "id": call_id, "type": "function"}
        call["function"] = {"name": "get_tide", "arguments": json.dumps(arguments)}
        deltas.append(_chunk({"tool_calls": [call]}))
    deltas.append(_chunk({}, "tool_calls"))
    record = {
        "timestamp": T0,
        "request": {"model": "m", "messages": QUESTION, "tools": [TIDE_TOOL], "stream": True},
        "response": deltas,
    }
    code, rows, dead = qwen3_run(tmp_path, [record], "--max-rejected-fraction", "1")
    tokenizer = AutoTokenizer.from_pretrained(str(shared_path("tokenizers", "qwen3")))
    written = "".join(
        "<tool_call>\n"
        + json.dumps({"name": "get_tide", "arguments": arguments})
        + "\n</tool_call>"
        for _, arguments in CALLS
    )
    generated = len(tokenizer(written, add_special_tokens=False).input_ids)  # 42
    assert len(rows) + len(dead) == 1
    assert rows == [] or rows[0]["output_length"] >= generated


def test_a_stream_logged_as_its_raw_event_stream_is_served_not_a_letter(tmp_path):
    """No false letter. A proxy that records the response body as it passed through keeps a
    streamed completion as the server sent it: one string of `data: {chunk}` events, blank
    lines between, ending `data: [DONE]`. kvtrace reads a stream only as a JSON list of chunk
    objects (read/streamed.py) and refuses the string ("response is a string, not an object
    or a list or null"), so every streamed request in such a log, a valid one the engine
    served, is a letter, and a night of mostly streamed traffic fails its rejected-fraction
    gate. Promised: the stream read as its chunks are (here: its usage's 3 output tokens)."""
    chunks = [
        _chunk({"role": "assistant", "content": "High tide"}),
        _chunk({"content": " at noon."}),
        _chunk({}, "stop"),
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": T0 // 1000,
            "model": "m",
            "choices": [],
            "usage": {"prompt_tokens": 21, "completion_tokens": 3, "total_tokens": 24},
        },
    ]
    body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    plain = {"timestamp": T0, "request": {"model": "m", "messages": QUESTION}, "output": "Noon."}
    streamed = {
        "timestamp": T0 + 1000,
        "request": {
            "model": "m",
            "messages": QUESTION,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        "response": body,
    }
    code, rows, dead = qwen3_run(tmp_path, [plain, streamed], "--max-rejected-fraction", "1")
    assert (code, dead) == (0, [])
    assert [row["output_length"] for row in rows][1:] == [3]


def test_a_log_row_holding_its_request_and_response_as_json_text_is_served_not_a_letter(tmp_path):
    """No false letter (the raw-body hole above, its other shape). A gateway's log table keeps
    the request and response bodies in JSON columns; exported to Parquet or read through a
    text column, each is its JSON text, a string. kvtrace takes a body only as an object
    (records._request_body, shapes), so the row, a request the engine served, is a letter
    ("proxy_server_request is a string, not an object"), and a night of such rows is refused
    whole. Promised: the row read as its decoded twin is (here: 2 rows, its usage's 2 output
    tokens)."""
    response = {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "created": T0 // 1000 + 1,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "At noon."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 21, "completion_tokens": 2, "total_tokens": 23},
    }
    plain = {"timestamp": T0, "request": {"model": "m", "messages": QUESTION}, "output": "Noon."}
    row = {
        "request_id": "r1",
        "call_type": "acompletion",
        "status": "success",
        "startTime": "2025-11-21T04:40:01.000Z",
        "proxy_server_request": json.dumps({"model": "m", "messages": QUESTION}),
        "response": json.dumps(response),
    }
    code, rows, dead = qwen3_run(tmp_path, [plain, row], "--max-rejected-fraction", "1")
    assert (code, dead) == (0, [])
    assert [row["output_length"] for row in rows][1:] == [2]
