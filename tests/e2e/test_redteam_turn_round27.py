"""Red team round 27, real logs' lengths (the output turn): reproducers of the holes found past
the round-1..26 fixes. Each feeds a log without usage, as an OpenAI-compatible engine, a gateway
or an Anthropic server writes it, through `kvtrace anonymize` with the real Qwen3 tokenizer,
and asserts the promised behaviour: the output length the serving engine generated (vLLM
0.33.0), never a made-up one. Each fails today (2026-11-28)."""

from __future__ import annotations

import pytest

from helpers import qwen3_run, shared_path

pytestmark = pytest.mark.slow

T0 = 1763700000000  # 2025-11-21T04:40:00Z, epoch ms
THINKING_OFF = ("--chat-template-kwargs", '{"enable_thinking": false}')
NOTES = [{"role": "user", "content": "Write today's high tides in Kyoto and Osaka to notes.txt."}]
WRITE_FILE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write a file",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        },
    },
}


def _tokens(text: str) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(shared_path("tokenizers", "qwen3")))
    return len(tokenizer(text, add_special_tokens=False).input_ids)


def _chunk(delta: dict, finish: str | None = None) -> dict:
    """A Chat Completions stream chunk, as the API streams it."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": T0 // 1000,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def test_a_streamed_tool_call_cut_at_max_tokens_is_exported_at_max_tokens(tmp_path):
    """Never a made-up length. An agent writing a long tool call (a file's content) runs into
    its `max_tokens`: the engine generated exactly max_tokens tokens (finish_reason "length":
    the sampler stopped at the request's budget, vLLM's get_max_tokens), here the 34 of
    `<tool_call>\\n{"name": "write_file", "arguments": {"path": ... "Osaka high tide at`.
    A default stream holds no usage, so kvtrace counts the turn through the template
    (output_turn.render_turn): the arguments cut mid-string are no JSON, read as `{}`
    (chat._arguments), the rendered call is shorter than the text, and the text's floor
    (name + arguments, without the `<tool_call>` markup the model wrote) stands: 24. The log
    states the count (max_tokens with a length finish); kvtrace makes up another."""
    arguments = '{"path": "notes.txt", "content": "Kyoto high tide at noon; Osaka high tide at'
    generated = _tokens('<tool_call>\n{"name": "write_file", "arguments": ' + arguments)  # 34
    call = {"index": 0, "id": "call_a", "type": "function"}
    deltas = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"tool_calls": [call | {"function": {"name": "write_file", "arguments": ""}}]}),
        *(
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            for piece in (arguments[:22], arguments[22:50], arguments[50:])
        ),
        _chunk({}, "length"),
    ]
    request = {"model": "m", "messages": NOTES, "tools": [WRITE_FILE], "stream": True}
    record = {"timestamp": T0, "request": request | {"max_tokens": generated}, "response": deltas}
    code, rows, dead = qwen3_run(tmp_path, [record], "--max-rejected-fraction", "1", *THINKING_OFF)
    assert dead == [] and len(rows) == 1  # the engine served it: no letter
    assert rows[0]["output_length"] == generated


def test_a_request_ignoring_eos_cut_at_max_tokens_is_exported_at_max_tokens(tmp_path):
    """Never a made-up length. `ignore_eos` (a vLLM sampling parameter, load generators' and
    benchmark clients' default) makes the engine generate past the end-of-turn token until
    `max_tokens`: 64 decode steps and KV slots, finish_reason "length". The text the response
    holds is what the detokenizer kept, the end-of-turn tokens and whatever special tokens
    followed skipped (skip_special_tokens): "Done." kvtrace counts the text, 2 tokens, for a
    request the engine generated 64 for."""
    request = {"model": "m", "messages": NOTES, "max_tokens": 64, "ignore_eos": True}
    response = {
        "object": "chat.completion",
        "created": T0 // 1000,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Done."},
                "finish_reason": "length",
            }
        ],
    }
    record = {"timestamp": T0, "request": request, "response": response}
    code, rows, dead = qwen3_run(tmp_path, [record], "--max-rejected-fraction", "1", *THINKING_OFF)
    assert dead == [] and len(rows) == 1
    assert rows[0]["output_length"] == 64


ANTHROPIC_TOOL = {
    "name": "get_tide",
    "description": "The day's high tide",
    "input_schema": {"type": "object", "properties": {"place": {"type": "string"}}},
}
THOUGHT = "The user wants tides for two places. I will call the tool twice."
PLACES = [("a", "Kyoto"), ("b", "Osaka")]


def _anthropic_stream() -> list[dict]:
    """An Anthropic Messages stream as vLLM's Anthropic server sends it (thinking, text, two
    tool_use blocks), its stop_reason in the message_delta event, the usage dropped by the
    gateway that logged it."""
    events: list[dict] = [
        {
            "type": "message_start",
            "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": []},
        }
    ]
    blocks = [
        ({"type": "thinking", "thinking": ""}, {"type": "thinking_delta", "thinking": THOUGHT}),
        ({"type": "text", "text": ""}, {"type": "text_delta", "text": "Let me look both up."}),
    ]
    for suffix, place in PLACES:
        start = {"type": "tool_use", "id": f"toolu_{suffix}", "name": "get_tide", "input": {}}
        delta = {"type": "input_json_delta", "partial_json": f'{{"place": "{place}"}}'}
        blocks.append((start, delta))
    for index, (start, delta) in enumerate(blocks):
        events += [
            {"type": "content_block_start", "index": index, "content_block": start},
            {"type": "content_block_delta", "index": index, "delta": delta},
            {"type": "content_block_stop", "index": index},
        ]
    events.append({"type": "message_delta", "delta": {"stop_reason": "tool_use"}})
    events.append({"type": "message_stop"})
    return events


def _anthropic_message() -> dict:
    """The same message logged whole."""
    content = [
        {"type": "thinking", "thinking": THOUGHT, "signature": ""},
        {"type": "text", "text": "Let me look both up."},
    ] + [
        {"type": "tool_use", "id": f"toolu_{s}", "name": "get_tide", "input": {"place": p}}
        for s, p in PLACES
    ]
    return {"type": "message", "role": "assistant", "content": content, "stop_reason": "tool_use"}


@pytest.mark.xfail(strict=True, reason="red team round 27")
def test_an_anthropic_stream_that_stopped_counts_the_stop_token_it_generated(tmp_path):
    """Never a made-up length. An Anthropic stream says how it ended in its message_delta
    event (`delta.stop_reason`, "tool_use" here), not in a message object: the message
    kvtrace builds from the events (streamed._anthropic_message) carries no stop_reason, so
    chat.ended_at_stop reads the stream as not said to have stopped and the end-of-turn token
    the engine generated is never counted: every Anthropic stream logged without usage is one
    token short of the same message logged whole (69 against 70 here), and a stream whose
    turn is all thinking loses the markup closing it too."""
    request = {
        "model": "m",
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": "When is high tide in Kyoto and Osaka today?"}],
        "tools": [ANTHROPIC_TOOL],
    }
    streamed = {"timestamp": T0, "request": request | {"stream": True}}
    streamed["response"] = _anthropic_stream()
    whole = {"timestamp": T0 + 1000, "request": request, "response": _anthropic_message()}
    code, rows, dead = qwen3_run(tmp_path, [streamed, whole], "--max-rejected-fraction", "1")
    assert dead == [] and len(rows) == 2
    assert rows[0]["output_length"] == rows[1]["output_length"]


@pytest.mark.xfail(strict=True, reason="red team round 27")
def test_a_sequence_stopped_at_a_stop_string_counts_the_stop_strings_tokens(tmp_path):
    """Never a made-up length. A ReAct agent stops its model at "Observation:" (`stop`); the
    engine generated the stop string's tokens (the detokenizer matches the string after they
    are sampled, and they are in completion_tokens) and leaves them out of the text, naming
    the string in the choice's `stop_reason` (vLLM's field). kvtrace counts the turn through
    its end-of-turn token (output_turn.through_end_of_turn: stopped, so the template's
    `<|im_end|>` is taken as the stop token), a token the engine never generated, in place
    of the stop string's tokens: 21 for the 23 generated."""
    content = (
        "Thought: I need the current weather in Paris.\nAction: get_weather\nAction Input: Paris\n"
    )
    stop = "Observation:"
    question = [{"role": "user", "content": "Answer with ReAct. What is the weather in Paris?"}]
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "finish_reason": "stop",
        "stop_reason": stop,
    }
    record = {
        "timestamp": T0,
        "request": {"model": "m", "messages": question, "stop": [stop]},
        "response": {"object": "chat.completion", "created": T0 // 1000, "choices": [choice]},
    }
    code, rows, dead = qwen3_run(tmp_path, [record], "--max-rejected-fraction", "1", *THINKING_OFF)
    assert dead == [] and len(rows) == 1
    assert rows[0]["output_length"] == _tokens(content + stop)


TIDE_DEFERRED = {
    "name": "get_tide",
    "description": "The day's high tide",
    "input_schema": {"type": "object", "properties": {"place": {"type": "string"}}},
    "defer_loading": True,
}
KYOTO = {"role": "user", "content": "When is high tide in Kyoto today?"}
NOON = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [{"type": "text", "text": "Noon."}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 1, "output_tokens": 3},
}


@pytest.mark.xfail(strict=True, reason="red team round 27")
def test_an_anthropic_request_changing_its_tools_in_a_system_message_is_served_not_a_letter(
    tmp_path,
):
    """No false letter; exactly what the engine built. vLLM's Anthropic server takes
    `tool_addition` and `tool_removal` blocks in a message of role "system" (its
    AnthropicContentBlock types; `_resolve_tools`): the tools the template sees are the
    request's with a tool added by reference no longer deferred and a removed one dropped, and
    the system message, holding no text, is not emitted. kvtrace letters the request
    (`unsupported_content`): a tool-search agent sends these on every request of its session.
    Promised: exported, its prompt the twin's whose tools are the resolved ones."""
    weather = {
        "name": "get_weather",
        "description": "Current weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    changes = [
        {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "get_tide"}},
        {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "get_weather"}},
    ]
    changed = {
        "model": "m",
        "max_tokens": 100,
        "tools": [TIDE_DEFERRED, weather],
        "messages": [{"role": "system", "content": changes}, KYOTO],
    }
    resolved = {
        "model": "m",
        "max_tokens": 100,
        "tools": [{**TIDE_DEFERRED, "defer_loading": None}],
        "messages": [KYOTO],
    }
    records = [
        {"timestamp": T0, "request": changed, "response": NOON},
        {"timestamp": T0 + 1000, "request": resolved, "response": NOON},
    ]
    code, rows, dead = qwen3_run(tmp_path, records, "--max-rejected-fraction", "1")
    assert dead == [] and len(rows) == 2
    assert rows[0]["input_length"] == rows[1]["input_length"]


@pytest.mark.xfail(strict=True, reason="red team round 27")
def test_an_anthropic_tool_result_naming_a_found_tool_is_served_not_a_letter(tmp_path):
    """No false letter. A tool-search tool's result names the tools it found by
    `tool_reference` items in its tool_result's content, which vLLM's Anthropic server takes
    (`_convert_user_tool_result`: a tool message of the references after the result's own)
    and a `tool_reference` block elsewhere, which it accepts and skips. kvtrace letters the
    request (`unsupported_content`), so every later request of such a session is lost from
    the trace."""
    search = {
        "name": "tool_search",
        "description": "Find tools",
        "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
    }
    used = {"type": "tool_use", "id": "toolu_1", "name": "tool_search", "input": {"query": "tide"}}
    found = [{"type": "tool_reference", "tool_name": "get_tide"}]
    messages = [
        KYOTO,
        {"role": "assistant", "content": [used]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": found}],
        },
    ]
    request = {
        "model": "m",
        "max_tokens": 100,
        "tools": [search, TIDE_DEFERRED],
        "messages": messages,
    }
    plain = {"model": "m", "max_tokens": 100, "messages": [KYOTO]}  # so the night publishes
    records = [
        {"timestamp": T0, "request": request, "response": NOON},
        {"timestamp": T0 + 1000, "request": plain, "response": NOON},
    ]
    code, rows, dead = qwen3_run(tmp_path, records, "--max-rejected-fraction", "1")
    assert dead == [] and len(rows) == 2


@pytest.mark.xfail(strict=True, reason="red team round 27")
def test_an_anthropic_request_with_thinking_disabled_is_rendered_with_thinking_off(tmp_path):
    """Exactly what the engine built; no false letter. vLLM's Anthropic server renders
    `thinking: {"type": "disabled"}` with the reasoning effort its DisabledThinkingEffortResolver
    picks: on its default ("auto") it renders a one-message probe ("Hi") with effort "none" and
    with each Anthropic effort, and takes "none" unless the template ignores it (then "low"), a
    function of the chat template alone, which kvtrace holds and renders: for Qwen3's, "none"
    (enable_thinking off: the empty think block rendered). kvtrace gets it wrong both ways:
    - a request without a top-level system prompt, tools or Anthropic-only blocks is read as
      Chat Completions (chat.is_anthropic: "renders alike either way"), its `thinking` (and
      `output_config.effort`) ignored: exported with thinking on, 4 prompt tokens short (16
      for the engine's 20), and its output turn counted under the same wrong setting;
    - with a system prompt it is read as Anthropic and lettered (`unsupported_request`,
      chat.anthropic_settings), all night for a client that turns thinking off for its quick
      calls.
    Promised: each exported as the engine rendered it, as the twin that turns thinking off
    by its kwargs."""
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    disabled = {"thinking": {"type": "disabled"}}
    plain = {"model": "m", "max_tokens": 100, "messages": [KYOTO]}
    system = plain | {"system": "You answer in one word."}
    bodies = [plain | disabled, plain | off, system | disabled, system | off]
    records = [
        {"timestamp": T0 + 1000 * at, "request": body, "response": NOON}
        for at, body in enumerate(bodies)
    ]
    code, rows, dead = qwen3_run(tmp_path, records, "--max-rejected-fraction", "1")
    assert dead == [] and len(rows) == 4
    assert rows[0]["input_length"] == rows[1]["input_length"]
    assert rows[2]["input_length"] == rows[3]["input_length"]


@pytest.mark.xfail(strict=True, reason="red team round 27")
def test_a_response_whose_reasoning_the_request_hid_is_not_exported_with_a_made_up_length(tmp_path):
    """Never a made-up length. `include_reasoning: false` (a field vLLM's Chat Completions and
    Responses request models take; records.API_FIELDS leaves it unread) makes the server drop
    the reasoning from the response (message_assembly: `reasoning = None`) though the model
    generated it: Qwen3 thinks first, here 400 tokens. Without usage kvtrace counts the turn
    the response holds, an empty think block and "Yes.": 7 tokens for the 407 the engine
    generated. The log does not hold the length: promised, a letter saying so (or, were it
    known, the engine's count), never 7."""
    thought = "I need to check divisibility of 9973 by primes up to 99. " * 20
    generated = _tokens("<think>\n" + thought.strip() + "\n</think>\n\nYes.<|im_end|>")  # 407
    question = [{"role": "user", "content": "Is 9973 prime? Answer yes or no."}]
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "Yes."},
        "finish_reason": "stop",
    }
    response = {"object": "chat.completion", "created": T0 // 1000, "choices": [choice]}
    request = {"model": "m", "messages": question}
    records = [
        {"timestamp": T0, "request": request | {"include_reasoning": False}, "response": response},
        {
            "timestamp": T0 + 1000,
            "request": request,
            "response": response,
        },  # so the night publishes
    ]
    code, rows, dead = qwen3_run(tmp_path, records, "--max-rejected-fraction", "1")
    assert len(rows) + len(dead) == 2
    hidden = [row for row in rows if row["timestamp"] == 0]
    assert hidden == [] or hidden[0]["output_length"] == generated
