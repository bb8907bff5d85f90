"""Red team round 21, real logs as providers have them: reproducers of the holes found past the
round-1..20 fixes. Each feeds a log shaped as a gateway or an engine writes it through
`kvtrace anonymize` with the real Qwen3 tokenizer and asserts the promised behaviour (read =
exported + rejected; exactly what the serving engine would see; never a made-up length). Each
fails today (2026-11-28)."""

from __future__ import annotations

import pytest

from helpers import qwen3_run

pytestmark = pytest.mark.slow

T0 = 1763700000000  # 2025-11-21, epoch ms
USER = [{"role": "user", "content": "Write a haiku about the sea."}]
FIRST = "one two three four five six seven eight"
SECOND = "alpha beta gamma delta epsilon zeta eta theta"
ALL_REJECTABLE = ("--max-rejected-fraction", "1")  # a log of a few records, most of them letters


def _responses_stream_events(created_at: int) -> list[dict]:
    """A Responses API stream as its server-sent events are logged: the response (its time,
    output and usage) inside the `response.created` and `response.completed` events."""
    response = {"id": "resp_1", "object": "response", "created_at": created_at}
    return [
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": {**response, "status": "in_progress", "output": []},
        },
        {
            "type": "response.output_text.delta",
            "sequence_number": 1,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": "one two three four five",
        },
        {
            "type": "response.completed",
            "sequence_number": 2,
            "response": {
                **response,
                "status": "completed",
                "output": [
                    {
                        "type": "message",
                        "id": "msg_1",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "one two three four five"}],
                    }
                ],
                "usage": {"input_tokens": 15, "output_tokens": 5, "total_tokens": 20},
            },
        },
    ]


def test_a_responses_stream_logged_as_its_events_exports_the_count_its_usage_gives(tmp_path):
    """Never a made-up length. A Responses API stream (`stream: true`) logged as its events
    keeps the usage in the last event's `response` (`response.completed`), not at the event's
    top level as a Chat Completions chunk does; records._output looks for `usage` only at a
    chunk's top level and chat.generated_text reads no event's `delta` nor its `response`, so
    the record is exported with output_length 0 (only counted in a warning) while its log
    says 5. Promised: the usage's output_tokens, 5."""
    record = {
        "timestamp": T0,
        "request": {"model": "m", "input": "Write a haiku about the sea.", "stream": True},
        "response": _responses_stream_events(T0 // 1000),
    }
    code, rows, _ = qwen3_run(tmp_path, [record])
    assert code == 0
    assert [row["output_length"] for row in rows] == [5]


def test_a_responses_stream_logged_as_its_events_takes_its_time_from_the_response(tmp_path):
    """No false letter. The same log without a gateway's own timestamp: its time is the
    response's `created_at`, as a Responses API response logged whole gives it
    (records._timestamp), but in a stream it sits in the first event's `response`, so the
    request is a missing_timestamp letter. Promised: exported, timed by created_at."""
    record = {
        "request": {"model": "m", "input": "Write a haiku about the sea.", "stream": True},
        "response": _responses_stream_events(T0 // 1000),
    }
    code, rows, dead = qwen3_run(tmp_path, [record])
    assert code == 0
    assert (len(rows), [letter["reason"] for letter in dead]) == (1, [])


def test_a_gateways_failed_call_is_a_letter_not_a_served_request(tmp_path):
    """Exactly what the engine would see. LiteLLM logs failed calls too: its standard logging
    payload with `status: "failure"` and `error_str` (here the provider refused a prompt over
    its context window), its spend logs a row with `status` "failure". Both are exported as
    served requests with output_length 0, so a replay sends requests the engine never ran
    (the Batch reader already letters the same case: failed_request). Promised: the success
    is exported, each failure is a failed_request letter."""
    success = {
        "call_type": "acompletion",
        "status": "success",
        "startTime": T0 / 1000,
        "endTime": T0 / 1000 + 0.5,
        "messages": USER,
        "model_parameters": {},
        "completion_tokens": 7,
    }
    standard_failure = {
        **success,
        "status": "failure",
        "error_str": "litellm.ContextWindowExceededError: the prompt is too long",
        "startTime": T0 / 1000 + 1,
        "endTime": T0 / 1000 + 1.1,
        "completion_tokens": 0,
    }
    spend_failure = {
        "request_id": "r2",
        "call_type": "acompletion",
        "status": "failure",
        "startTime": "2025-11-21T04:40:02.000Z",
        "endTime": "2025-11-21T04:40:02.100Z",
        "proxy_server_request": {"model": "m", "messages": USER},
        "response": {},
        "completion_tokens": 0,
    }
    # Letters weigh in --max-rejected-fraction as a Batch file's do: 2 of 3 is past the default.
    code, rows, dead = qwen3_run(
        tmp_path, [success, standard_failure, spend_failure], *ALL_REJECTABLE
    )
    assert code == 0
    assert [row["output_length"] for row in rows] == [7]
    assert sorted(letter["error"] for letter in dead) == ["failed_request"] * 2


def _choice(index: int, text: str) -> dict:
    return {"index": index, "message": {"role": "assistant", "content": text}}


def test_a_request_of_two_choices_exports_one_length_whichever_way_it_was_logged(tmp_path):
    """Never a made-up length; usage and text agree. A request with `n: 2` generates two
    sequences; the engine's usage.completion_tokens is their sum. records._output takes the
    usage (16), chat.generated_text takes choices[0] of a response (8) but choices[0] of every
    streamed chunk, which with n > 1 is each choice in turn (all of them: 16, and for
    interleaved pieces more). So one request exports 16, 8 or 16 by how its log was written,
    and a Mooncake row cannot say n. Promised: the three logs of one request export one
    length (or are refused alike). Decided (docs/ANONYMIZE.md): refused alike, each an
    unsupported_request letter naming `n`; a request of one sequence beside them is exported."""
    request = {"model": "m", "messages": USER, "n": 2}
    choices = [_choice(0, FIRST), _choice(1, SECOND)]
    with_usage = {
        "timestamp": T0,
        "request": request,
        "response": {
            "created": T0 // 1000,
            "choices": choices,
            "usage": {"prompt_tokens": 15, "completion_tokens": 16, "total_tokens": 31},
        },
    }
    without_usage = {
        "timestamp": T0 + 1000,
        "request": request,
        "response": {"created": T0 // 1000, "choices": choices},
    }
    chunks = [
        {"created": T0 // 1000, "choices": [{"index": i, "delta": {"content": word + " "}}]}
        for pair in zip(FIRST.split(), SECOND.split(), strict=True)
        for i, word in enumerate(pair)
    ]
    streamed = {"timestamp": T0 + 2000, "request": {**request, "stream": True}, "response": chunks}
    single = {"timestamp": T0 + 3000, "request": {**request, "n": 1}, "output_length": 3}
    logs = [with_usage, without_usage, streamed, single]
    code, rows, dead = qwen3_run(tmp_path, logs, "--max-rejected-fraction", "1")
    assert code == 0
    lengths = {row["output_length"] for row in rows[:-1]}
    assert (len(rows) - 1, len(lengths)) in ((3, 1), (0, 0)), (lengths, dead)
    assert [(letter["error"], letter["message"][:2]) for letter in dead] == [
        ("unsupported_request", "n ")
    ] * 3


def test_an_echoed_completion_counts_only_the_tokens_the_engine_generated(tmp_path):
    """Never a made-up length. A /v1/completions request with `echo: true` gets its prompt back
    at the start of choices[0].text; with no usage logged, chat.generated_text counts the whole
    text, prompt included (10 tokens for 2 generated). Promised: the echoed request exports
    the length of the same completion logged without echo. Decided (docs/ANONYMIZE.md): a
    row cannot say the engine echoed, so the echoed request is an unsupported_request letter
    naming `echo`, the same completion without echo is exported."""
    prompt = "Write a haiku about the sea."
    echoed = {
        "timestamp": T0,
        "request": {"model": "m", "prompt": prompt, "echo": True},
        "response": {"created": T0 // 1000, "choices": [{"index": 0, "text": prompt + " one two"}]},
    }
    plain = {
        "timestamp": T0 + 1000,
        "request": {"model": "m", "prompt": prompt},
        "response": {"created": T0 // 1000, "choices": [{"index": 0, "text": " one two"}]},
    }
    code, rows, dead = qwen3_run(tmp_path, [echoed, plain], "--max-rejected-fraction", "1")
    assert code == 0
    assert len(rows) == 1
    assert [(letter["error"], letter["message"][:5]) for letter in dead] == [
        ("unsupported_request", "echo ")
    ]


def test_an_embeddings_call_in_a_gateways_log_is_not_exported_as_a_chat(tmp_path):
    """Exactly what the engine would see. A gateway logs every endpoint alike; an embeddings
    call's request (`{"model", "input": "text"}`) is a Responses API request by its fields
    (records._detect_kind: a string `input` is a chat), so it is exported as a chat rendered
    through the template (16 tokens where the embedding model read 8) that generated 0
    tokens, though its response is an embedding list (`object: "list"`, `data`). The Batch
    reader refuses the same call by its endpoint (unsupported_request). Promised: the chat is
    exported, the embeddings call is a letter."""
    embedding = {
        "timestamp": T0,
        "request": {"model": "e5", "input": "Write a haiku about the sea."},
        "response": {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
            "usage": {"prompt_tokens": 8, "total_tokens": 8},
        },
    }
    served = {
        "timestamp": T0 + 1000,
        "request": {"model": "m", "messages": USER},
        "output_length": 3,
    }
    code, rows, dead = qwen3_run(tmp_path, [embedding, served], *ALL_REJECTABLE)
    assert code == 0
    assert ([row["output_length"] for row in rows], len(dead)) == ([3], 1)


def test_an_empty_session_id_merges_no_unrelated_requests(tmp_path):
    """Sessions neither merged nor split. A log (or a table exported from a database that
    writes no value as "") gives `session_id: ""` to every request without a session;
    records._session takes "" as an id, so all of them become one session, which the
    session-aware replayers (aiperf-sessions, dynamo-agentic) replay one after another as a
    single conversation. Null is already read as no session. Promised: "" is no session, so
    the two unrelated requests publish no `session`."""
    first = {"timestamp": T0, "session_id": "", "messages": USER, "output_length": 3}
    other = [{"role": "user", "content": "Translate 'good morning' to French."}]
    second = {"timestamp": T0 + 1000, "session_id": "", "messages": other, "output_length": 3}
    code, rows, _ = qwen3_run(tmp_path, [first, second])
    assert code == 0
    assert [row.get("session") for row in rows] == [None, None]


def test_a_spend_log_exported_from_postgres_keeps_its_hour_only_zones(tmp_path):
    """No false letter. A gateway's spend-log table exported from PostgreSQL as text (COPY,
    psql) writes a timestamptz as `2025-11-21 04:40:02.123+00`: ISO-8601 allows a zone of
    hours alone (±hh). timestamps._ISO takes only ±hh:mm or ±hhmm, so every row of such an
    export is a bad_timestamp letter and the night is refused, though each is a request the
    engine served. Promised: both rows exported, 1 s apart."""
    rows_in = [
        {
            "request_id": f"r{i}",
            "call_type": "acompletion",
            "status": "success",
            "startTime": f"2025-11-21 04:40:0{i}.123+00",
            "endTime": f"2025-11-21 04:40:0{i}.623+00",
            "proxy_server_request": {"model": "m", "messages": USER},
            "completion_tokens": 3,
        }
        for i in (1, 2)
    ]
    code, rows, dead = qwen3_run(tmp_path, rows_in)
    assert code == 0, [letter["error"] for letter in dead]
    assert [(row["timestamp"], row["response_ms"]) for row in rows] == [(0, 500), (1000, 500)]
