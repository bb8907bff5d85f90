"""Red team round 26, real logs per API: reproducers of the holes found past the round-1..25
fixes. Each feeds a request as a client sends it to the engine's Chat Completions, Completions,
Responses or Anthropic Messages server through `kvtrace anonymize` with the real Qwen3
tokenizer, beside a twin whose prompt kvtrace already renders as the engine does, and asserts
the promised behaviour (read = exported + rejected; exactly what the serving engine would see;
never a made-up length; no false letter). Each failed on 2026-11-28; two were ruled on against the engine kvtrace follows (0.33.0), as their docstrings say."""

from __future__ import annotations

import pytest

from helpers import qwen3_run

pytestmark = pytest.mark.slow

T0 = 1763700000000  # 2025-11-21T04:40:00Z, epoch ms
QUESTION = "What is the capital of France, and what river runs through it?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city's name"}},
        "required": ["city"],
    },
}


def _chat_response() -> dict:
    """A Chat Completions response, as the API returns it."""
    return {
        "object": "chat.completion",
        "created": T0 // 1000,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Paris."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 2},
    }


def _responses_response() -> dict:
    """A completed Responses API response, as the API returns it."""
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": T0 // 1000,
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_9",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Paris.", "annotations": []}],
            }
        ],
        "usage": {"input_tokens": 20, "output_tokens": 2, "total_tokens": 22},
    }


def _anthropic_response() -> dict:
    """An Anthropic Messages response, as the API returns it."""
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "Paris."}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 20, "output_tokens": 2},
    }


def _twin_then_attack(tmp_path, twin: dict, attack: dict) -> tuple[int, list[int]]:
    """(the twin's exported input length, the attacked request's: [] when it is a letter), the
    twin logged first so rows keep their order."""
    records = [{"timestamp": T0, **twin}, {"timestamp": T0 + 1000, **attack}]
    code, rows, dead = qwen3_run(tmp_path, records, "--max-rejected-fraction", "1")
    assert code == 0
    assert len(rows) + len(dead) == 2
    assert rows and rows[0]["timestamp"] == 0  # the twin is served: its row comes first
    return rows[0]["input_length"], [row["input_length"] for row in rows[1:]]


def test_a_responses_request_with_tool_choice_none_is_exported_with_its_tools(tmp_path):
    """Exactly what the engine would see. Ruled on (round 26's fix): the red team read an engine
    whose Responses server built the template's tools with
    `construct_tool_dicts(request.tools, request.tool_choice)`, none when `tool_choice` is
    "none"; the engine kvtrace follows (0.33.0) drops them there only under the server's
    --exclude-tools-when-tool-choice-none, as its Chat Completions server does
    (OnlineRenderer.render_responses), which a log does not say: kvtrace renders them on both
    APIs alike (records.API_FIELDS, docs/ANONYMIZE.md). Promised: the tokens of its twin
    with the same tools and no tool_choice."""
    request = {"model": "m", "input": QUESTION, "tools": [WEATHER]}
    twin = {"request": request, "response": _responses_response()}
    attack = {"request": {**request, "tool_choice": "none"}, "response": _responses_response()}
    served, exported = _twin_then_attack(tmp_path, twin, attack)
    assert exported == [served]


def test_a_chat_request_with_reasoning_effort_none_renders_thinking_off(tmp_path):
    """Exactly what the engine would see; never a made-up length. The engine turns a request's
    reasoning effort into the template's `enable_thinking` (ChatCompletionRequest and
    ResponsesRequest.build_chat_params: `enable_thinking = reasoning_effort != "none"` unless
    the request's chat_template_kwargs set it), so `reasoning_effort: "none"` (an OpenAI
    client's way to turn reasoning off) renders Qwen3's closed empty think block. kvtrace
    passes `reasoning_effort` as a template variable only (chat.template_settings), which the
    Qwen3 template never reads: the request is published 4 tokens short of the engine's
    prompt, its last block's id one the engine never hashed. (The Responses API's
    `reasoning: {"effort": "none"}` is the same hole.) Promised: the tokens of its twin asking
    `enable_thinking: false` directly, or a letter."""
    request = {"model": "m", "messages": [{"role": "user", "content": QUESTION}]}
    twin = {
        "request": {**request, "chat_template_kwargs": {"enable_thinking": False}},
        "response": _chat_response(),
    }
    attack = {"request": {**request, "reasoning_effort": "none"}, "response": _chat_response()}
    served, exported = _twin_then_attack(tmp_path, twin, attack)
    assert exported in ([served], [])


def test_a_responses_request_continuing_a_partial_assistant_message_is_not_a_new_turn(tmp_path):
    """Exactly what the engine would see; never a made-up length. The engine's Responses server
    continues an input whose last item is an assistant message (or reasoning item) of status
    "in_progress" or "incomplete" (`should_continue_final_message`): it renders with
    `continue_final_message` true and no generation prompt, as a Chat Completions request
    asking it. kvtrace reads template settings from the request's own fields only
    (chat.template_settings), the same for every API: it closes the partial message and opens
    a new assistant turn, 36 tokens where the engine's prompt holds 31. Promised: the tokens of
    its Chat Completions twin asking `continue_final_message`, or a letter."""
    partial = "The capital of France is"
    twin = {
        "request": {
            "model": "m",
            "messages": [
                {"role": "user", "content": QUESTION},
                {"role": "assistant", "content": partial},
            ],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
        "response": _chat_response(),
    }
    attack = {
        "request": {
            "model": "m",
            "input": [
                {"role": "user", "content": QUESTION},
                {
                    "type": "message",
                    "id": "msg_7",
                    "status": "incomplete",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": partial, "annotations": []}],
                },
            ],
        },
        "response": _responses_response(),
    }
    served, exported = _twin_then_attack(tmp_path, twin, attack)
    assert exported in ([served], [])


def test_an_anthropic_request_is_not_rendered_with_template_fields_its_api_lacks(tmp_path):
    """A field kvtrace honours that the engine ignores. The engine's Anthropic Messages request
    declares `chat_template_kwargs` but no `add_generation_prompt`, `continue_final_message` or
    `documents` (AnthropicMessagesRequest; it builds its chat request from its own fields
    only), so a gateway's or client's stray `add_generation_prompt: false` changes nothing.
    kvtrace reads those fields for every API alike (chat.template_settings, outside the per-API
    table records.API_FIELDS): it drops the generation prompt, 3 tokens short of what the engine
    prefilled. Promised: the tokens of its twin without the field."""
    request = {
        "model": "m",
        "max_tokens": 64,
        "system": "You are a geography tutor.",
        "messages": [{"role": "user", "content": QUESTION}],
    }
    twin = {"request": request, "response": _anthropic_response()}
    attack = {
        "request": {**request, "add_generation_prompt": False},
        "response": _anthropic_response(),
    }
    served, exported = _twin_then_attack(tmp_path, twin, attack)
    assert exported == [served]


def test_an_anthropic_system_message_in_messages_stays_where_it_stands(tmp_path):
    """Exactly what the engine would see. Ruled on (round 26's fix): the red team read an engine
    whose Anthropic Messages server joined every system message inside `messages` onto the
    top-level system prompt; the engine kvtrace follows (0.33.0) does so only for a chat
    template that refuses a system message after the first turn (it renders [system, user,
    system, user] once to tell), and keeps each where it stands otherwise, as Qwen3's template
    renders it. kvtrace keeps it in place (chat.anthropic_messages): the same prompt for such a
    template, a template_error letter for one that refuses it (docs/ANONYMIZE.md). Promised:
    the tokens of its Chat Completions twin with the system message in place."""
    twin = {
        "request": {
            "model": "m",
            "messages": [
                {"role": "system", "content": "You are a geography tutor."},
                {"role": "user", "content": QUESTION},
                {"role": "system", "content": "Answer in French."},
            ],
        },
        "response": _chat_response(),
    }
    attack = {
        "request": {
            "model": "m",
            "max_tokens": 64,
            "system": "You are a geography tutor.",
            "messages": [
                {"role": "user", "content": QUESTION},
                {"role": "system", "content": "Answer in French."},
            ],
        },
        "response": _anthropic_response(),
    }
    served, exported = _twin_then_attack(tmp_path, twin, attack)
    assert exported == [served]


def test_a_responses_request_naming_a_stored_prompt_is_not_exported_as_its_input(tmp_path):
    """Never a made-up length; exactly what the engine would see. The Responses API's `prompt`
    ({id, version, variables}) names a stored prompt template whose instructions and messages
    the server prepends to `input` (the engine's Responses server refuses it: "prompt template
    is not supported"). Either way the prompt the engine built is not the logged `input`
    alone, but API_FIELDS' Responses row does not list `prompt` (its other stored context,
    `previous_response_id` and `conversation`, is a `stored_context` letter): the request is
    published at the 22 tokens of its input. (A Completions request with `suffix`, which the
    engine refuses and fill-in-the-middle servers render with the suffix's tokens, is
    published as its bare `prompt` the same way.) Promised: a letter, never the input's
    length."""
    request = {"model": "m", "input": QUESTION}
    twin = {"request": request, "response": _responses_response()}
    attack = {
        "request": {
            **request,
            "prompt": {"id": "pmpt_68ab01", "version": "3", "variables": {"city": "Paris"}},
        },
        "response": _responses_response(),
    }
    _, exported = _twin_then_attack(tmp_path, twin, attack)
    assert exported == []


def test_a_completions_request_with_a_suffix_is_not_exported_as_its_bare_prompt(tmp_path):
    """Never a made-up length (the stored prompt's hole above, on the Completions API). A
    fill-in-the-middle request sends the code after the cursor as `suffix`: the engine's
    Completions server refuses it ("suffix is not currently supported", a 400), and servers
    that serve it render the suffix's tokens into the prompt. kvtrace's Completions row of
    API_FIELDS does not list `suffix`: the request is published with its bare `prompt`'s
    tokens, a length no server prefilled. Promised: a letter."""

    def completion(**fields: object) -> dict:
        return {
            "request": {"model": "m", "prompt": "def mean(values):\n    ", **fields},
            "response": {
                "object": "text_completion",
                "created": T0 // 1000,
                "choices": [{"index": 0, "text": "total = sum(values)", "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 5},
            },
        }

    suffix = "\n    return total / len(values)\n"
    _, exported = _twin_then_attack(tmp_path, completion(), completion(suffix=suffix))
    assert exported == []
