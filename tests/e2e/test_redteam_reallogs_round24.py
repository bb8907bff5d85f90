"""Red team round 24, real logs as providers have them: reproducers of the holes found past the
round-1..23 fixes. Each feeds a log shaped as a gateway, an API or the engine writes it through
`kvtrace anonymize` with the real Qwen3 tokenizer and asserts the promised behaviour (exactly
what the serving engine would see; never a made-up length or time; no false letter).
Each fails today (2026-11-28)."""

from __future__ import annotations

import pytest

from helpers import qwen3_run

pytestmark = pytest.mark.slow

T0 = 1763700000000  # 2025-11-21T04:40:00Z, epoch ms
HAIKU = "Write a haiku about the sea, in the style of Basho, with a note on each line's meaning."
TEXT = "Waves fold into foam, the tide keeps its slow promise, salt wind carries gulls"


def _responses_response(number: int, text: str, input_tokens: int, output_tokens: int) -> dict:
    """A completed Responses API response, as the API returns it."""
    return {
        "id": f"resp_{number}",
        "object": "response",
        "created_at": T0 // 1000 + number,
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": f"msg_{number}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
    }


def test_a_responses_request_continuing_a_stored_response_is_not_exported_as_its_new_input(
    tmp_path,
):
    """Never a made-up length; exactly what the engine would see. A Responses API request with
    `previous_response_id` (the API's own way to hold a conversation: `store` is its default)
    sends only its new input; the server prepends the stored conversation (the previous
    request's input and the previous response's output items) before it renders the prompt.
    kvtrace renders the request's `input` alone (chat.responses_messages reads `instructions`
    and `input`; links.py reads the id only for --emit-parents): the second turn, 245 input
    tokens by the response's own usage, is published with 11, and block ids that share no
    prefix with the turn it continues, so the replayed cache never sees the hit the engine
    had. (A request naming a stored `conversation` is read the same way.) Promised: the
    prompt the engine built (here, at least the previous turn's input and output), or a
    dead letter saying the log does not hold it."""
    first = {
        "timestamp": T0,
        "request": {"model": "m", "input": HAIKU, "store": True},
        "response": _responses_response(1, "Waves fold into foam " * 40, 30, 200),
    }
    second = {
        "timestamp": T0 + 5000,
        "request": {"model": "m", "input": "Shorter.", "previous_response_id": "resp_1"},
        "response": _responses_response(2, "Foam.", 245, 3),
    }
    code, rows, dead = qwen3_run(tmp_path, [first, second], "--max-rejected-fraction", "1")
    assert code == 0
    assert len(rows) + len(dead) == 2
    continued = rows[1:]
    assert continued == [] or continued[0]["input_length"] >= (
        rows[0]["input_length"] + rows[0]["output_length"]
    )


def test_a_request_the_engine_truncated_is_not_exported_with_its_whole_length(tmp_path):
    """Never a made-up length. The engine's chat and completions requests take
    `truncate_prompt_tokens` (one of its extra sampling parameters, declared in its request
    models): the prompt is tokenized and only its last N tokens are kept, so the engine
    prefilled N tokens and cached N tokens' blocks. kvtrace ignores the field (read/shapes.py
    does not declare it, records.py never reads it): the request is published with the whole
    rendered length (91 tokens where the engine, and the response's usage, say 32) and block
    ids of a prefix the engine never held. Promised: the length and blocks of the tokens the
    engine kept, or a dead letter."""
    system = "You are the support assistant of Acme Cloud. Answer briefly, cite the status page. "
    messages = [
        {"role": "system", "content": system * 4},
        {"role": "user", "content": "Is eu-west up?"},
    ]

    def record(offset: int, prompt_tokens: int, **fields: object) -> dict:
        return {
            "timestamp": T0 + offset,
            "request": {"model": "m", "messages": messages, **fields},
            "response": {
                "object": "chat.completion",
                "created": T0 // 1000,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "Yes."},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 2},
            },
        }

    whole, cut = record(0, 91), record(1000, 32, truncate_prompt_tokens=32)
    code, rows, dead = qwen3_run(tmp_path, [whole, cut], "--max-rejected-fraction", "1")
    assert code == 0
    assert len(rows) + len(dead) == 2
    assert [row["input_length"] for row in rows[1:]] in ([32], [])


def test_a_litellm_payload_of_a_text_completion_renders_its_prompt_not_a_chat(tmp_path):
    """Exactly what the engine would see; a real writer's file reads as its twin. LiteLLM's
    text_completion (the proxy's /v1/completions) turns the prompt into
    `messages = [{"role": "user", "content": prompt}]` before it calls the provider's
    completions endpoint with the prompt as it was; its standard logging payload keeps that
    wrapper as `messages`, its `call_type` "text_completion" (or "atext_completion"). kvtrace
    reads any payload's `messages` as a chat: the prompt, already formatted, is rendered
    through the chat template a second time and published with 21 tokens, where the engine
    (and the same call's spend-log row, whose `proxy_server_request` holds the `prompt`)
    counts 13. Promised: one call, one length, whichever of LiteLLM's logs it was read from
    (or a dead letter for the payload)."""
    prompt = "<|im_start|>user\nIs eu-west up?<|im_end|>\n<|im_start|>assistant\n"
    payload = {
        "id": "cmpl-0",
        "trace_id": "3f1c9d2e-0",
        "call_type": "atext_completion",
        "status": "success",
        "startTime": T0 / 1000,
        "messages": [{"role": "user", "content": prompt}],
        "model_parameters": {},
        "completion_tokens": 2,
        "response": {
            "object": "text_completion",
            "created": T0 // 1000,
            "choices": [{"index": 0, "text": "Yes.", "finish_reason": "stop"}],
        },
    }
    spend_log = {
        "request_id": "cmpl-1",
        "call_type": "atext_completion",
        "status": "success",
        "startTime": "2025-11-21T04:40:01.000Z",
        "completion_tokens": 2,
        "messages": {},
        "response": {},
        "proxy_server_request": {"model": "m", "prompt": prompt},
    }
    code, rows, dead = qwen3_run(tmp_path, [payload, spend_log], "--max-rejected-fraction", "1")
    assert code == 0
    assert len(rows) + len(dead) == 2
    served = rows[-1]["input_length"]  # the spend log's, published last (its later time)
    assert [row["input_length"] for row in rows] in ([served, served], [served])


def test_a_litellm_payload_of_an_anthropic_call_is_not_exported_without_its_system_prompt(tmp_path):
    """Never a made-up length (a variant of the text completion above: a payload's `messages`
    is LiteLLM's rebuilding of the call, not what the engine saw, whenever its `call_type` is
    not a chat completion). LiteLLM's /v1/messages (`call_type` "anthropic_messages") sends
    the engine the system prompt as a system message, but its standard logging payload keeps
    only the user and assistant turns in `messages`, and the system prompt nowhere
    (`model_parameters` holds `max_tokens` alone; seen with LiteLLM 1.85.7 against a loopback
    server, `hosted_vllm/` model). kvtrace renders the payload's `messages`: every such call
    (an agent's, whose system prompt is most of its prompt) is published with its user turn's
    length and no shared prefix. (A Responses call, "aresponses", keeps its `instructions` in
    `model_parameters`, which kvtrace does not render either.) Promised: the length of the
    request the engine served, as the same call logged in an envelope gives, or a letter."""
    system = "You are the support assistant of Acme Cloud. Answer briefly. " * 20
    user = [{"role": "user", "content": "Is eu-west up?"}]
    envelope = {
        "timestamp": T0,
        "request": {"model": "m", "max_tokens": 50, "system": system, "messages": user},
        "response": {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": "Yes."}],
            "usage": {"input_tokens": 260, "output_tokens": 2},
        },
    }
    payload = {
        "id": "chatcmpl-1",
        "trace_id": "6f41df66-269a-474d-9712-3e19ebab678e",
        "call_type": "anthropic_messages",
        "status": "success",
        "custom_llm_provider": "hosted_vllm",
        "startTime": T0 / 1000 + 1,
        "endTime": T0 / 1000 + 1.2,
        "prompt_tokens": 260,
        "completion_tokens": 2,
        "messages": user,
        "response": {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": T0 // 1000 + 1,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Yes."},
                    "finish_reason": "stop",
                }
            ],
        },
        "model_parameters": {"max_tokens": 50},
    }
    code, rows, dead = qwen3_run(tmp_path, [envelope, payload], "--max-rejected-fraction", "1")
    assert code == 0
    assert len(rows) + len(dead) == 2
    served = rows[0]["input_length"]  # the envelope's, published first (its earlier time)
    assert [row["input_length"] for row in rows] in ([served, served], [served])


def test_an_azure_stream_takes_its_time_from_the_response_not_its_filter_chunk(tmp_path):
    """Never a made-up time; timestamps from the right field. Azure OpenAI's streams open with
    a content-filter chunk for the prompt that is no completion chunk: `{"choices": [],
    "created": 0, "id": "", "model": "", "object": "", "prompt_filter_results": [...]}`; the
    chunks after it carry the response's real `created`. A log without a gateway's own time
    is timed by records._timestamp from the first chunk's `created` alone: 0, read as a
    relative time. Three requests a minute apart are published all at 0 ms (a night of them:
    every arrival collapsed to one instant), and beside epoch-timed records each is a false
    `timestamp_kind_mismatch` letter. Promised: the response's time (60 s apart here), as the
    same stream without Azure's filter chunk gives."""

    def azure_stream(minute: int) -> dict:
        created = T0 // 1000 + 60 * minute
        chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": created}
        return {
            "request": {
                "model": "m",
                "messages": [{"role": "user", "content": HAIKU}],
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            "response": [
                {
                    "choices": [],
                    "created": 0,
                    "id": "",
                    "model": "",
                    "object": "",
                    "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}],
                },
                {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
                {**chunk, "choices": [{"index": 0, "delta": {"content": TEXT}}]},
                {**chunk, "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 17}},
            ],
        }

    code, rows, dead = qwen3_run(tmp_path, [azure_stream(minute) for minute in range(3)])
    assert (code, dead) == (0, [])
    assert [row["timestamp"] for row in rows] == [0, 60_000, 120_000]


def test_a_background_response_logged_while_queued_is_not_exported_with_a_made_up_length(tmp_path):
    """Never a made-up length (round 23's unread response, where the response is read but
    says nothing was generated yet). A Responses API request with `background: true` is
    answered at once with the response object as it stands: `status` "queued" (or
    "in_progress"), `output` [], no usage; the generation is fetched later by its id, in
    another call. A gateway logs the first answer. kvtrace reads the empty output as a place
    where nothing was generated (chat.holds_generation), so no unread_response letter, and
    publishes the request with output_length 0 (a warning says "published with 0"), where
    the engine went on to generate its whole answer. Promised: a response that says it is
    not finished is a dead letter (its length is not in the log), never a defaulted 0."""
    done = {
        "timestamp": T0,
        "request": {"model": "m", "input": HAIKU},
        "response": _responses_response(0, TEXT, 30, 17),
    }
    queued = {
        "timestamp": T0 + 1000,
        "request": {"model": "m", "input": HAIKU, "background": True},
        "response": {
            "id": "resp_1",
            "object": "response",
            "created_at": T0 // 1000 + 1,
            "status": "queued",
            "background": True,
            "output": [],
            "usage": None,
        },
    }
    code, rows, dead = qwen3_run(tmp_path, [done, queued], "--max-rejected-fraction", "1")
    assert code == 0
    assert [row["output_length"] for row in rows] == [17]
    assert len(dead) == 1


def test_requests_the_engine_cached_apart_by_their_cache_salt_share_no_block_id(tmp_path):
    """Exactly what the engine would see: identical ids are blocks the engine's cache could
    share. The engine's chat and completions requests take `cache_salt` (a multi-tenant
    server sets one per tenant so no tenant can probe another's prompts through cache hits):
    the engine mixes it into the hash of a request's first block, so requests of different
    salts share no cached block, whatever their text. kvtrace ignores the field: two tenants'
    requests with the same 300-token system prompt are published with the same 20 ids, a
    50% hit rate in stats.json and in every replay where the engine had 0%, and a
    cross-tenant prefix match published that the provider's salt exists to hide. (A log that
    keeps engine hashes, `--capture`, is hashed apart: docs/CAPTURES.md.) Promised: requests
    of different cache salts share no block id; of one salt, they share as the engine did."""
    messages = [
        {"role": "system", "content": "You are the support assistant of Acme Cloud. " * 30},
        {"role": "user", "content": "Is eu-west up?"},
    ]
    tenants = (
        "tenant-a-9f8e7d6c5b4a39281706f5e4d3c2b1a0",
        "tenant-b-0a1b2c3d4e5f60718293a4b5c6d7e8f9",
    )
    records = [
        {
            "timestamp": T0 + 1000 * turn,
            "request": {"model": "m", "messages": messages, "cache_salt": salt},
            "output_length": 2,
        }
        for turn, salt in enumerate(tenants)
    ]
    code, rows, dead = qwen3_run(tmp_path, records, "--block-size", "16")
    assert (code, dead) == (0, [])
    assert len(rows) == 2
    assert not set(rows[0]["hash_ids"]) & set(rows[1]["hash_ids"])
