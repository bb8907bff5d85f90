"""Red team round 22, real logs as providers have them: reproducers of the holes found past the
round-1..21 fixes. Each feeds a log shaped as a gateway, an API or the serving engine writes it
through `kvtrace anonymize` with the real Qwen3 tokenizer and asserts the promised behaviour
(read = exported + rejected; exactly what the serving engine would see; never a made-up length;
no false letter on a request the engine serves). Each fails today (2026-11-28)."""

from __future__ import annotations

import pytest

from helpers import qwen3_run

pytestmark = pytest.mark.slow

T0 = 1763700000000  # 2025-11-21, epoch ms
USER = [{"role": "user", "content": "Write a haiku about the sea."}]
ALL_REJECTABLE = ("--max-rejected-fraction", "1")  # a log of a few records, some of them letters


def test_a_responses_reasoning_item_is_rendered_as_the_engine_renders_it(tmp_path):
    """Exactly what the engine would see. A reasoning model's client on the Responses API sends
    the previous turn's output back as `input` items, its `reasoning` item included (the
    engine's own example does so). The engine's Responses server turns a reasoning item into
    an assistant message holding that reasoning (its summary text), as it turns each
    function_call into an assistant message; chat.responses_messages drops it (`continue`), so
    the prompt kvtrace tokenizes lacks the assistant turn Qwen3's template renders for it
    (181 tokens where the engine's prompt is 200) and its block ids are another prompt's.
    Promised: the Responses request exports the input length of the chat the engine builds
    from it (written here as Chat Completions messages)."""
    reasoning = "I should call the weather tool for Paris now."
    arguments = '{"city": "Paris"}'
    function = {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    responses = {
        "timestamp": T0,
        "request": {
            "model": "m",
            "tools": [{"type": "function", **function}],
            "input": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [{"type": "summary_text", "text": reasoning}],
                },
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": arguments,
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "18C, sunny"},
            ],
        },
        "output_length": 3,
    }
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather"}}
    as_built = {
        "timestamp": T0 + 1000,
        "request": {
            "model": "m",
            "tools": [{"type": "function", "function": function}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "reasoning": reasoning},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {**call, "function": {**call["function"], "arguments": arguments}}
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
            ],
        },
        "output_length": 3,
    }
    code, rows, dead = qwen3_run(tmp_path, [responses, as_built])
    assert (code, dead) == (0, [])
    assert rows[0]["input_length"] == rows[1]["input_length"]


def test_a_gateways_cache_hit_is_not_exported_as_a_request_the_engine_served(tmp_path):
    """Exactly what the engine would see. LiteLLM's proxy answers a repeated request from its
    own response cache and logs it like any call: its standard logging payload says
    `cache_hit: true` (its spend logs' `cache_hit` column "True"), status success, the cached
    response and its usage. The engine never saw the request; records._check_outcome reads no
    `cache_hit`, so it is exported as a served request whose blocks all repeat the first
    call's, a prefix-cache hit the engine never had (a replay then overstates hit rate and
    load). Promised: the call the engine served is exported, the cache hit is a letter (read
    = exported + rejected)."""
    response = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": T0 // 1000,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Waves fold into foam"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 15, "completion_tokens": 5, "total_tokens": 20},
    }

    def payload(second: int, hit: bool) -> dict:
        return {
            "id": f"call-{second}",
            "call_type": "acompletion",
            "status": "success",
            "startTime": T0 / 1000 + second,
            "endTime": T0 / 1000 + second + (0.01 if hit else 1.5),
            "messages": USER,
            "response": response,
            "model_parameters": {},
            "completion_tokens": 5,
            "cache_hit": hit,
            "cache_key": "9f2c" if hit else None,
        }

    code, rows, dead = qwen3_run(tmp_path, [payload(0, False), payload(1, True)], *ALL_REJECTABLE)
    assert code == 0
    assert (len(rows), len(dead)) == (1, 1), (rows, [letter["error"] for letter in dead])


def test_a_responses_stream_that_ended_in_an_error_event_is_a_failed_request(tmp_path):
    """Exactly what the engine would see; never a made-up length. A Responses API stream that
    fails mid-way ends in an `error` event (`{"type": "error", "code", "message"}`), whose type
    does not start with `response.`: streamed.final_response then reads the list as Chat
    Completions chunks, records._check_outcome finds no `error` field in the event, and the
    call is exported as served with output_length 0 (the text it did stream is not counted
    either). A Chat Completions stream ending in an error chunk is already a failed_request
    letter (docs/ANONYMIZE.md: "a stream's error chunk included"). Promised: the same, a
    failed_request letter; the served call beside it is exported."""
    created = {"id": "resp_1", "object": "response", "created_at": T0 // 1000}
    events = [
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": {**created, "status": "in_progress", "output": []},
        },
        {
            "type": "response.output_text.delta",
            "sequence_number": 1,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": "Waves fold",
        },
        {
            "type": "error",
            "sequence_number": 2,
            "code": "server_error",
            "message": "The server had an error while processing your request.",
            "param": None,
        },
    ]
    failed = {
        "timestamp": T0,
        "request": {"model": "m", "input": "Write a haiku about the sea.", "stream": True},
        "response": events,
    }
    served = {
        "timestamp": T0 + 1000,
        "request": {"model": "m", "messages": USER},
        "output_length": 3,
    }
    code, rows, dead = qwen3_run(tmp_path, [failed, served], *ALL_REJECTABLE)
    assert code == 0
    assert [row["output_length"] for row in rows] == [3]
    assert [letter["error"] for letter in dead] == ["failed_request"]


def test_a_responses_stream_cut_short_counts_its_reasoning_as_a_chat_stream_does(tmp_path):
    """Usage and text agree across shapes; never a made-up length. A Responses API stream cut
    short (the client went away: no `response.completed`, so no usage) is counted from its
    events, but streamed.final_response merges only `response.output_text.delta` events: a
    reasoning model's `response.reasoning_text.delta` text is left out (5 tokens), where the
    same generation streamed as Chat Completions chunks counts its `reasoning_content` too
    (14). Promised: one generation, one length, whichever API streamed it."""
    reasoning = "Let me think about the sea and its waves."
    text = "Waves fold into foam"
    response = {"id": "resp_1", "object": "response", "created_at": T0 // 1000}
    events = [
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": {**response, "status": "in_progress", "output": []},
        },
        {
            "type": "response.reasoning_text.delta",
            "sequence_number": 1,
            "item_id": "rs_1",
            "output_index": 0,
            "content_index": 0,
            "delta": reasoning,
        },
        {
            "type": "response.output_text.delta",
            "sequence_number": 2,
            "item_id": "msg_1",
            "output_index": 1,
            "content_index": 0,
            "delta": text,
        },
    ]
    chunks = [
        {
            "created": T0 // 1000,
            "choices": [{"index": 0, "delta": {"reasoning_content": reasoning}}],
        },
        {"created": T0 // 1000, "choices": [{"index": 0, "delta": {"content": text}}]},
    ]
    prompt = "Write a haiku about the sea."
    responses = {
        "timestamp": T0,
        "request": {"model": "m", "input": prompt, "stream": True},
        "response": events,
    }
    chat = {
        "timestamp": T0 + 1000,
        "request": {"model": "m", "messages": USER, "stream": True},
        "response": chunks,
    }
    code, rows, _ = qwen3_run(tmp_path, [responses, chat])
    assert code == 0
    assert rows[0]["output_length"] == rows[1]["output_length"]


def test_a_response_of_two_sequences_exports_no_summed_length_however_n_was_logged(tmp_path):
    """Never a made-up length (a variant of round 21's n > 1). The response itself says the
    engine generated two sequences (choices of index 0 and 1; usage.completion_tokens their
    sum), but records._check_one_sequence reads only the request's `n` as a JSON number: `n:
    "2"` (which the engine's request model, in pydantic's lax mode, takes as 2) and a log that
    kept the request's messages without its sampling parameters both pass, and the row
    publishes the sum (9) as one request's output length. Promised: both refused as
    unsupported_request, as `n: 2` is; the request of one sequence beside them exported."""
    response = {
        "created": T0 // 1000,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "one two three four"}},
            {"index": 1, "message": {"role": "assistant", "content": "alpha beta gamma delta"}},
        ],
        "usage": {"prompt_tokens": 15, "completion_tokens": 9, "total_tokens": 24},
    }
    as_string = {
        "timestamp": T0,
        "request": {"model": "m", "messages": USER, "n": "2"},
        "response": response,
    }
    unlogged = {
        "timestamp": T0 + 1000,
        "request": {"model": "m", "messages": USER},
        "response": response,
    }
    single = {
        "timestamp": T0 + 2000,
        "request": {"model": "m", "messages": USER},
        "output_length": 3,
    }
    code, rows, dead = qwen3_run(tmp_path, [as_string, unlogged, single], *ALL_REJECTABLE)
    assert code == 0
    assert [row["output_length"] for row in rows] == [3]
    assert [letter["error"] for letter in dead] == ["unsupported_request"] * 2


def test_a_completions_prompt_of_token_ids_is_served_not_a_letter(tmp_path):
    """No false letter on a request the engine serves. The Completions API (and the engine's
    request model: `prompt` a string, a list of strings, a list of token ids or a list of
    lists) takes a prompt of token ids, and a list of one string as that string; shapes.
    PROMPT_BODY declares `prompt` a string only, so both are wrong_type letters and a night of
    such requests is refused whole. Promised: the token-id prompt exports as the same ids
    given as `input_ids`, the one-string list as the string."""
    ids = [9707, 11, 1879, 0, 1096, 374, 264, 1273, 13]
    records = [
        {"timestamp": T0, "request": {"model": "m", "prompt": ids}, "output_length": 1},
        {"timestamp": T0 + 1000, "request": {"model": "m", "input_ids": ids}, "output_length": 1},
        {
            "timestamp": T0 + 2000,
            "request": {"model": "m", "prompt": ["Hi there"]},
            "output_length": 1,
        },
        {
            "timestamp": T0 + 3000,
            "request": {"model": "m", "prompt": "Hi there"},
            "output_length": 1,
        },
    ]
    code, rows, dead = qwen3_run(tmp_path, records, *ALL_REJECTABLE)
    assert code == 0, [letter["message"] for letter in dead]
    assert [row["input_length"] for row in rows] == [len(ids), len(ids), 2, 2]


def test_a_refusal_part_in_an_assistant_turn_is_served_not_a_letter(tmp_path):
    """No false letter on a request the engine serves. An assistant message's content may be a
    list of `text` and `refusal` parts (the Chat Completions API's assistant content parts);
    the engine's chat parser reads a refusal part's `refusal` as text, and shapes.BLOCK
    declares the part, but chat.text_of knows only text and non-text part types, so the
    history is an unsupported_content letter. Promised: exported with the input length of the
    same history whose assistant content is that text."""
    refusal = "I can't help with that."

    def history(content: object) -> list[dict]:
        return [
            {"role": "user", "content": "Tell me a secret."},
            {"role": "assistant", "content": content},
            {"role": "user", "content": "Then a haiku about the sea."},
        ]

    parts = {"timestamp": T0, "messages": history([{"type": "refusal", "refusal": refusal}])}
    text = {"timestamp": T0 + 1000, "messages": history(refusal)}
    records = [{**parts, "output_length": 3}, {**text, "output_length": 3}]
    code, rows, dead = qwen3_run(tmp_path, records, *ALL_REJECTABLE)
    assert (code, [letter["error"] for letter in dead]) == (0, [])
    assert rows[0]["input_length"] == rows[1]["input_length"]


def _weather_tools(unit: dict) -> list[dict]:
    """A tool whose JSON schema is written as pydantic writes an Optional field's."""
    properties = {"city": {"type": "string", "title": "City"}, "unit": unit}
    parameters = {"type": "object", "properties": properties, "required": ["city"]}
    return [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Weather", "parameters": parameters},
        }
    ]


def test_a_null_inside_a_tools_schema_or_a_tool_calls_input_is_rendered(tmp_path):
    """Exactly what the engine would see. records.without_nulls drops every null object field
    at any depth, as the engine's request models read an Optional field sent as null; but a
    tool's `parameters` (a JSON schema) and an Anthropic `tool_use` block's `input` are free
    objects the engine hands to the template as sent, and the template writes them out with
    `tojson`: pydantic's schema of an Optional field carries `"default": null`, an agent's
    call `{"city": "Paris", "unit": null}`. Each renders here as if the null were absent
    (178 and 166 tokens alike with and without it). Promised: the null is in the prompt, so
    each request is longer than its twin without it."""
    unit = {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Unit"}
    ask = [{"role": "user", "content": "Weather in Paris?"}]

    def chat(second: int, schema: dict) -> dict:
        return {"timestamp": T0 + 1000 * second, "messages": ask, "tools": _weather_tools(schema)}

    def anthropic(second: int, arguments: dict) -> dict:
        call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": arguments}
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"}
        tool = {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}
        messages = [
            *ask,
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]},
        ]
        request = {"model": "m", "max_tokens": 100, "tools": [tool], "messages": messages}
        return {"timestamp": T0 + 1000 * second, "request": request}

    records = [
        chat(0, {**unit, "default": None}),
        chat(1, unit),
        anthropic(2, {"city": "Paris", "unit": None}),
        anthropic(3, {"city": "Paris"}),
    ]
    code, rows, dead = qwen3_run(tmp_path, [{**record, "output_length": 3} for record in records])
    assert (code, dead) == (0, [])
    lengths = [row["input_length"] for row in rows]
    assert (lengths[0] > lengths[1], lengths[2] > lengths[3]) == (True, True), lengths


def test_an_azure_batch_file_is_joined_as_an_openai_one(tmp_path):
    """No false letter on a request the engine serves. Azure OpenAI's Batch API takes (and its
    documentation writes) each input line's `url` as `/chat/completions`, without the `/v1`
    the OpenAI API spells; records.BATCH_URLS knows only the `/v1/...` spellings, so every
    line of an Azure batch is an unsupported_request letter saying the request is "not a
    generation", and a night of such a batch is refused whole. Promised: both pairs exported
    (the `/v1` one already is), no letter."""
    body = {"model": "gpt-4o-batch", "messages": USER}
    inputs = [
        {"custom_id": f"task-{i}", "method": "POST", "url": url, "body": body}
        for i, url in enumerate(("/chat/completions", "/v1/chat/completions"))
    ]
    outputs = [
        {
            "id": f"batch_req_{i}",
            "custom_id": f"task-{i}",
            "response": {
                "status_code": 200,
                "request_id": f"req-{i}",
                "body": {
                    "object": "chat.completion",
                    "created": T0 // 1000 + i,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Waves"}}],
                    "usage": {"prompt_tokens": 15, "completion_tokens": 5, "total_tokens": 20},
                },
            },
            "error": None,
        }
        for i in range(2)
    ]
    code, rows, dead = qwen3_run(tmp_path, [*inputs, *outputs], *ALL_REJECTABLE)
    assert code == 0
    assert (len(rows), [letter["message"] for letter in dead]) == (2, [])


def test_a_log_table_exported_from_bigquery_keeps_its_times(tmp_path):
    """No false letter on a request the engine served. A gateway's log table kept in BigQuery
    (the warehouse beside Dataflow, where kvtrace runs) and exported as newline-delimited JSON
    (`bq extract`, EXPORT DATA) writes a TIMESTAMP as `2025-11-21 04:40:01.123000 UTC`, its zone
    spelled `UTC`; timestamps._ISO takes `Z` or an offset only, so every row is a
    bad_timestamp letter and the night is refused, as round 21 found of PostgreSQL's `+00`.
    Promised: both rows exported, 1 s apart, their response times kept."""
    rows_in = [
        {
            "request_id": f"r{i}",
            "call_type": "acompletion",
            "status": "success",
            "startTime": f"2025-11-21 04:40:0{i}.123000 UTC",
            "endTime": f"2025-11-21 04:40:0{i}.623000 UTC",
            "proxy_server_request": {"model": "m", "messages": USER},
            "completion_tokens": 3,
        }
        for i in (1, 2)
    ]
    code, rows, dead = qwen3_run(tmp_path, rows_in)
    assert code == 0, [letter["error"] for letter in dead]
    assert [(row["timestamp"], row["response_ms"]) for row in rows] == [(0, 500), (1000, 500)]


def test_a_gateways_payload_renders_with_the_template_settings_its_request_sent(tmp_path):
    """Exactly what the engine would see. LiteLLM's standard logging payload keeps the chat at
    its top level and the request's other parameters in `model_parameters` (a parameter the
    OpenAI API lacks, as vLLM's `chat_template_kwargs`, under its `extra_body`); records reads
    `tools`, `n`, `best_of` and `echo` there, but chat.template_settings reads only the
    payload's top level, so a Qwen3 request sent with `enable_thinking: false` renders
    without it (16 tokens where the engine rendered 20, the empty think block it adds).
    Promised: each payload exports the input length of the same request logged as a plain
    request with its chat_template_kwargs."""
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}

    def payload(second: int, parameters: dict) -> dict:
        return {
            "call_type": "acompletion",
            "status": "success",
            "startTime": T0 / 1000 + second,
            "endTime": T0 / 1000 + second + 1,
            "messages": USER,
            "model_parameters": parameters,
            "completion_tokens": 5,
        }

    plain = {
        "timestamp": T0 + 2000,
        "request": {"model": "m", "messages": USER, **kwargs},
        "output_length": 5,
    }
    records = [payload(0, kwargs), payload(1, {"extra_body": kwargs}), plain]
    code, rows, dead = qwen3_run(tmp_path, records)
    assert (code, dead) == (0, [])
    assert [row["input_length"] for row in rows] == [rows[2]["input_length"]] * 3
