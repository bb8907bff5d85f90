"""Red team round 23, real logs as providers have them: reproducers of the holes found past the
round-1..22 fixes. Each feeds a streamed response logged as its server's events through
`kvtrace anonymize` with the real Qwen3 tokenizer and asserts the promised behaviour (exactly
what the serving engine computed; never a made-up length; usage and text agree across shapes).
Each fails today (2026-11-28)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import SALT, anonymize, letters, shared_path, trace, write_jsonl

pytestmark = pytest.mark.slow

T0 = 1763700000000  # 2025-11-21, epoch ms
USER = [{"role": "user", "content": "Write a haiku about the sea."}]
TEXT = "Waves fold into foam, the tide keeps its slow promise, salt wind carries gulls"


def _run(tmp_path: Path, records: list[dict]) -> tuple[int, list[dict], list[dict]]:
    """(exit code, trace rows, dead letters) of one anonymize run on the records."""
    source = write_jsonl(tmp_path / "in.jsonl", records)
    (tmp_path / "salt").write_text(SALT)
    out, dead = tmp_path / "out", tmp_path / "dead"
    code = anonymize(
        str(shared_path("tokenizers", "qwen3")),
        [source],
        out,
        "--salt-file",
        str(tmp_path / "salt"),
        "--dead-letter",
        str(dead),
        "--quiet",
    )
    return code, trace(out) if out.exists() else [], letters(dead) if dead.exists() else []


@pytest.mark.xfail(strict=True, reason="red team round 23")
def test_a_responses_stream_with_a_keepalive_event_exports_the_count_its_usage_gives(tmp_path):
    """Never a made-up length. A Responses API stream logged as its events may hold an event
    whose type is not `response.*`: OpenAI's stream sends `{"type": "keepalive"}` while a
    reasoning model thinks, and a gateway that logs the stream keeps it. One such event and
    streamed.final_response no longer reads the list as a stream of events (every element must
    be `response.*` or `error`): the final response, its usage (9 output tokens) and its
    output items are all left unread, chat.generated_text finds nothing in the raw events, and
    records._output defaults the length as if no response had been logged: published with 0.
    (Without a gateway's `timestamp` the same record is a false `missing_timestamp` letter:
    the response's `created_at` is unread too.) Promised: the usage the engine reported."""
    response = {"id": "resp_1", "object": "response", "created_at": T0 // 1000, "model": "m"}
    done = {
        **response,
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": TEXT, "annotations": []}],
            }
        ],
        "usage": {"input_tokens": 14, "output_tokens": 9, "total_tokens": 23},
    }
    events = [
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": {**response, "status": "in_progress", "output": []},
        },
        {"type": "keepalive", "sequence_number": 1},
        {
            "type": "response.output_text.delta",
            "sequence_number": 2,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": TEXT,
        },
        {"type": "response.completed", "sequence_number": 3, "response": done},
    ]
    record = {
        "timestamp": T0,
        "request": {"model": "m", "input": USER[0]["content"], "stream": True},
        "response": events,
    }
    code, rows, dead = _run(tmp_path, [record])
    assert (code, dead) == (0, [])
    assert [row["output_length"] for row in rows] == [9]


@pytest.mark.xfail(strict=True, reason="red team round 23")
def test_an_anthropic_stream_cut_short_counts_the_text_it_streamed(tmp_path):
    """Usage and text agree across shapes; never a made-up length (the Anthropic variant of
    round 22's cut-short Responses stream). An Anthropic Messages stream logged as its events
    (`message_start`, `content_block_delta`, ...) is read only through the usage of its
    `message_delta` event; a stream cut short (the client went away before `message_delta`)
    holds its text only in `content_block_delta` events, which no reader reads
    (chat._generated_pieces reads a whole `message`, streamed._built_output only Responses
    events): published with 0, where the same text streamed as Chat Completions chunks counts
    its tokens. Promised: one generation, one length, whichever API streamed it."""
    anthropic = {
        "timestamp": T0,
        "request": {"model": "m", "max_tokens": 100, "messages": USER, "stream": True},
        "response": [
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "m",
                    "content": [],
                    "usage": {"input_tokens": 14, "output_tokens": 1},
                },
            },
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            {"type": "ping"},
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": TEXT},
            },
        ],
    }
    chat = {
        "timestamp": T0 + 1000,
        "request": {"model": "m", "messages": USER, "stream": True},
        "response": [
            {"created": T0 // 1000, "choices": [{"index": 0, "delta": {"content": TEXT}}]}
        ],
    }
    code, rows, dead = _run(tmp_path, [anthropic, chat])
    assert (code, dead) == (0, [])
    assert rows[1]["output_length"] > 0
    assert rows[0]["output_length"] == rows[1]["output_length"]
