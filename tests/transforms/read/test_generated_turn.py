"""chat.generated_turn and chat.ended_at_stop: the assistant message a response holds, read by
the same walk as its generated text, from each API's shape (streamed or whole), and how its
sequence ended; records put both on a request whose output is counted from its response."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvtrace.transforms.read.chat import ended_at_stop, generated_text, generated_turn
from kvtrace.transforms.read.json_tree import ContainerBudget
from kvtrace.transforms.read.records import parse_record

USER = [{"role": "user", "content": "Tide in Kyoto and Osaka?"}]


def _turn(response: Any) -> dict[str, Any] | None:
    return generated_turn(response, ContainerBudget(1 << 16))


def _delta(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _call(index: int, name: str | None, arguments: str, call_id: str | None = None) -> dict:
    function = {"arguments": arguments} | ({"name": name} if name else {})
    return {"index": index, "function": function} | ({"id": call_id} if call_id else {})


def test_a_streams_tool_calls_are_joined_per_call_with_arguments_as_objects():
    stream = [
        _delta({"role": "assistant", "content": None}),
        _delta({"tool_calls": [_call(0, "get_tide", '{"place": ', "a")]}),
        _delta({"tool_calls": [_call(1, "get_tide", "", "b")]}),
        _delta({"tool_calls": [_call(0, None, '"Kyoto"}')]}),
        _delta({"tool_calls": [_call(1, None, '{"place": "Osaka"}')]}),
        _delta({}, "tool_calls"),
    ]
    turn = _turn(stream)
    assert turn == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": {"place": p}}}
            for i, n, p in (("a", "get_tide", "Kyoto"), ("b", "get_tide", "Osaka"))
        ],
    }
    # The same pieces the text counts, in the text's order.
    assert generated_text(stream) == 'get_tide{"place": get_tide"Kyoto"}{"place": "Osaka"}'
    assert ended_at_stop(stream) is True


def test_a_reasoning_turn_keeps_its_reasoning_apart_from_its_content():
    response = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "reasoning_content": "2+2=4.", "content": "4"},
                "finish_reason": "length",
            }
        ]
    }
    assert _turn(response) == {
        "role": "assistant",
        "content": "4",
        "reasoning": "2+2=4.",
        "reasoning_content": "2+2=4.",
    }
    assert ended_at_stop(response) is False


def test_a_responses_output_is_the_turn_of_its_items():
    response = {
        "object": "response",
        "status": "completed",
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Look it up."}]},
            {"type": "message", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "name": "get_tide", "arguments": '{"place": "Kyoto"}'},
        ],
    }
    turn = _turn(response)
    assert turn is not None
    assert (turn["reasoning_content"], turn["content"]) == ("Look it up.", "Checking.")
    assert turn["tool_calls"][0]["function"] == {
        "name": "get_tide",
        "arguments": {"place": "Kyoto"},
    }
    assert ended_at_stop(response) is True
    assert ended_at_stop({**response, "status": "incomplete"}) is False


def test_an_anthropic_message_is_the_turn_of_its_blocks():
    response = {
        "type": "message",
        "stop_reason": "tool_use",
        "content": [
            {"type": "thinking", "thinking": "Kyoto first."},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "t", "name": "get_tide", "input": {"place": "Kyoto"}},
        ],
    }
    turn = _turn(response)
    assert turn is not None
    assert (turn["reasoning_content"], turn["content"]) == ("Kyoto first.", "Let me check.")
    assert turn["tool_calls"][0]["id"] == "t"  # a call keeps its id, as a prompt's does
    assert turn["tool_calls"][0]["function"] == {
        "name": "get_tide",
        "arguments": {"place": "Kyoto"},
    }
    assert ended_at_stop(response) is True
    assert ended_at_stop({**response, "stop_reason": "max_tokens"}) is False


@pytest.mark.parametrize(
    ("response", "ended"),
    [
        ({"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}]}, True),
        ({"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}, False),
        ({"choices": [{"index": 0, "text": "x", "finish_reason": "abort"}]}, None),
        ({"choices": [{"index": 0, "text": "x"}]}, None),
        ([_delta({"content": "x"}, "stop"), _delta({}, None)], True),  # the last said wins
    ],
)
def test_how_a_sequence_ended_is_read_where_the_response_says(response, ended):
    assert ended_at_stop(response) is ended


def test_a_response_without_a_generation_has_no_turn():
    assert _turn({"choices": [{"index": 0, "message": {"role": "assistant"}}]}) is None
    assert _turn({"object": "response", "output": []}) is None


def _parse(record: dict[str, Any]):
    return parse_record(json.dumps({"timestamp": 1, **record}).encode(), "src")


def test_records_carry_the_turn_only_where_the_output_is_counted_from_the_response():
    response = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Noon."}}]}
    counted = _parse({"request": {"messages": USER}, "response": response})
    assert counted.output_text == "Noon."
    assert counted.output_turn == {"role": "assistant", "content": "Noon."}
    usage = {"completion_tokens": 3}
    logged = _parse({"request": {"messages": USER}, "response": {**response, "usage": usage}})
    assert (logged.output_length, logged.output_turn, logged.output_stopped) == (3, None, None)
    completion = _parse(
        {
            "request": {"prompt": "Tide?"},
            "response": {"choices": [{"index": 0, "text": "Noon.", "finish_reason": "stop"}]},
        }
    )
    assert (completion.output_turn, completion.output_stopped) == (None, True)


@pytest.mark.parametrize(
    "arguments",
    ['{"a": ' + "[" * 100 + "]" * 100 + "}", '{"a": [' + ",".join(["[]"] * 600_000) + "]}"],
    ids=["deeper", "bigger"],
)
def test_a_turn_past_the_json_bounds_is_no_turn_and_the_text_counts(arguments):
    # The engine served the request: its call's arguments past what a record's JSON may hold
    # make no turn (its text is counted), never a letter.
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    response = {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    request = _parse({"request": {"messages": USER}, "response": response})
    assert (request.output_turn, request.output_text) == (None, "f" + arguments)
    assert request.output_stopped is True


@pytest.mark.parametrize(
    "request_fields, finish, counted",
    [
        ({"messages": USER, "max_tokens": 64}, "length", 64),
        ({"messages": USER, "max_completion_tokens": 40, "max_tokens": 64}, "length", 40),
        ({"prompt": "Tide?", "max_tokens": 9}, "length", 9),
        ({"messages": USER, "max_tokens": 64}, "stop", None),  # stopped: counted as generated
        ({"messages": USER}, "length", None),  # no cap: the response's count stands
        ({"messages": USER, "max_tokens": True}, "length", None),  # no count: not a cap
    ],
    ids=["chat", "completion-tokens-first", "completions", "stopped", "no-cap", "not-a-count"],
)
def test_a_sequence_cut_at_its_length_generated_the_requests_cap(request_fields, finish, counted):
    """The engine generates exactly the request's cap when it ends a sequence at its length
    (ignore_eos, or a cut mid-call): the text a response keeps says less."""
    choice = {"index": 0, "finish_reason": finish}
    if "prompt" in request_fields:
        choice["text"] = "Done."
    else:
        choice["message"] = {"role": "assistant", "content": "Done."}
    request = _parse({"request": request_fields, "response": {"choices": [choice]}})
    if counted is None:
        assert (request.output_length, request.output_text) == (None, "Done.")
    else:
        assert (request.output_length, request.output_text, request.output_turn) == (
            counted,
            None,
            None,
        )
