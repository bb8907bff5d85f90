"""Red team round 23, real logs as providers have them: reproducers of the holes found past the
round-1..22 fixes. Each feeds a log shaped as a gateway or an API writes it through
`kvtrace anonymize` with the real Qwen3 tokenizer and asserts the promised behaviour (exactly
what the serving engine computed; never a made-up length; usage and text agree across shapes;
sessions neither split nor merged).
Each fails today (2026-11-28)."""

from __future__ import annotations

import pytest

from helpers import qwen3_run

pytestmark = pytest.mark.slow

T0 = 1763700000000  # 2025-11-21, epoch ms
USER = [{"role": "user", "content": "Write a haiku about the sea."}]
TEXT = "Waves fold into foam, the tide keeps its slow promise, salt wind carries gulls"


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
    code, rows, dead = qwen3_run(tmp_path, [record])
    assert (code, dead) == (0, [])
    assert [row["output_length"] for row in rows] == [9]


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
    code, rows, dead = qwen3_run(tmp_path, [anthropic, chat])
    assert (code, dead) == (0, [])
    assert rows[1]["output_length"] > 0
    assert rows[0]["output_length"] == rows[1]["output_length"]


# LiteLLM's proxy keeps a spend-log row's request (`proxy_server_request`, stored only with
# store_prompts_in_spend_logs) with every string longer than its MAX_STRING_LENGTH_PROMPT_IN_DB
# (2048 characters unless set) cut to its first 35% and last 65% of that limit around a marker
# naming the characters left out: the database's safeguard, its callbacks get the whole text.
SPEND_LOG_STRING_LIMIT = 2048
SYSTEM = " ".join(
    f"Rule {i}: answer questions about region {i % 7} of Acme Cloud politely, cite the status "
    f"page, and never promise an outage ends before its ticket {1000 + i} says so."
    for i in range(40)
)


def _as_spend_log_stores_it(text: str) -> str:
    """A string as LiteLLM's spend-log table keeps it (above)."""
    if len(text) <= SPEND_LOG_STRING_LIMIT:
        return text
    head, tail = int(SPEND_LOG_STRING_LIMIT * 0.35), int(SPEND_LOG_STRING_LIMIT * 0.65)
    left_out = len(text) - head - tail
    return f"{text[:head]}... (litellm_truncated skipped {left_out} chars) ...{text[-tail:]}"


def test_a_spend_log_row_whose_request_the_proxy_cut_is_not_exported_with_the_cut_length(tmp_path):
    """Never a made-up length; exactly what the engine would see. LiteLLM's spend-log rows are
    read for their request (`proxy_server_request`), but the proxy stores that request with
    every string over 2048 characters cut around a `litellm_truncated` marker (any agent's
    system prompt is longer). kvtrace renders the cut text: the row is exported with 556
    input tokens where the engine served 1,568, and block ids of a text the engine never
    saw. The same call logged by LiteLLM's callback
    (the whole text) exports the engine's length. Promised: a request whose text the log cut
    is never exported as if whole: a dead letter saying so (or its whole length)."""
    assert len(SYSTEM) > 2 * SPEND_LOG_STRING_LIMIT
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Is eu-west up?"},
    ]
    stored = [{**messages[0], "content": _as_spend_log_stores_it(SYSTEM)}, messages[1]]
    whole = {
        "id": "chatcmpl-0",
        "call_type": "acompletion",
        "status": "success",
        "startTime": T0 / 1000,
        "messages": messages,
        "model_parameters": {},
        "completion_tokens": 4,
    }
    spend_log = {
        "request_id": "chatcmpl-1",
        "call_type": "acompletion",
        "status": "success",
        "startTime": "2025-11-21T04:40:01.000Z",
        "completion_tokens": 4,
        "messages": {},
        "response": {},
        "proxy_server_request": {"model": "m", "messages": stored},
    }
    code, rows, dead = qwen3_run(tmp_path, [whole, spend_log], "--max-rejected-fraction", "1")
    assert code == 0
    lengths = [row["input_length"] for row in rows]
    whole_length = lengths[0]
    assert lengths in ([whole_length, whole_length], [whole_length])  # whole, or a letter
    assert len(rows) + len(dead) == 2


def test_a_litellm_callback_log_keeps_the_sessions_its_spend_log_twin_keeps(tmp_path):
    """Sessions neither split nor merged; a real writer's file reads as its twin. A client
    groups its calls into a session by LiteLLM's `litellm_session_id` (or the older
    `litellm_trace_id`); the proxy keeps it as its standard logging payload's `trace_id`, and
    writes that same value into its spend-log row's `session_id` (one id per call when the
    client names none). kvtrace reads `session_id` (so the spend log keeps its sessions) but
    never `trace_id`: the same two turns logged by LiteLLM's callbacks come out as two rows of
    no session, split. Promised: the two turns of one session share a session number,
    whichever of LiteLLM's two logs they were read from."""
    first = [{"role": "user", "content": "Is eu-west up?"}]
    second = [
        *first,
        {"role": "assistant", "content": "It is up."},
        {"role": "user", "content": "And us-east?"},
    ]
    payloads = [
        {
            "id": f"chatcmpl-{turn}",
            "trace_id": "3f1c9d2e-session-of-two-turns",
            "call_type": "acompletion",
            "status": "success",
            "startTime": T0 / 1000 + 10 * turn,
            "messages": messages,
            "model_parameters": {},
            "completion_tokens": 4,
        }
        for turn, messages in enumerate([first, second])
    ]
    code, rows, dead = qwen3_run(tmp_path, payloads)
    assert (code, dead) == (0, [])
    assert rows[0].get("session") is not None
    assert rows[0].get("session") == rows[1].get("session")


def test_a_litellm_payload_with_its_messages_redacted_is_not_exported_as_a_prompt(tmp_path):
    """Never a made-up length (a variant of the cut spend-log row: the log's writer replaced
    the text). With `turn_off_message_logging` (or a callback that opts out of message
    logging) LiteLLM's standard logging payload keeps its other fields, `prompt_tokens`
    included, but its `messages` become one user message holding a fixed placeholder. kvtrace
    renders the placeholder: two different conversations (1,200 and 3,400 prompt tokens by the
    engine's count) are exported as the same few-token prompt with the same block ids, a
    prefix hit the engine never had. Promised: a request whose text the log does not hold is
    never exported with the placeholder's length: a dead letter saying so."""
    served = {
        "id": "chatcmpl-0",
        "call_type": "acompletion",
        "status": "success",
        "startTime": T0 / 1000,
        "messages": USER,
        "model_parameters": {},
        "completion_tokens": 4,
    }
    redacted = [
        {
            **served,
            "id": f"chatcmpl-{turn}",
            "startTime": T0 / 1000 + turn,
            "messages": [{"role": "user", "content": "redacted-by-litellm"}],
            "prompt_tokens": prompt_tokens,
        }
        for turn, prompt_tokens in ((1, 1200), (2, 3400))
    ]
    code, rows, dead = qwen3_run(tmp_path, [served, *redacted], "--max-rejected-fraction", "1")
    assert code == 0
    assert len(rows) == 1
    assert len(dead) == 2
