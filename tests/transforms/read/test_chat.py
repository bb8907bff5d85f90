"""chat.py's readers of real-log forms: the Responses API's input items turned by one table into
the messages the engine builds of them, and content parts read as the engine's chat parser reads
them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.records import ParseOptions, Request, parse_record

USER = {"role": "user", "content": "Weather in Paris?"}
CALL = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}


def messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    request = parse_record(json.dumps(record).encode(), "t", ParseOptions())
    assert isinstance(request, Request) and request.messages is not None
    return request.messages


def letter(record: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(Rejected) as caught:
        parse_record(json.dumps(record).encode(), "t", ParseOptions())
    return caught.value.reason, caught.value.message


def responses(*items: dict[str, Any]) -> dict[str, Any]:
    return {"timestamp": 0, "output_length": 1, "input": [USER, *items]}


def reasoning(**fields: Any) -> dict[str, Any]:
    return {"type": "reasoning", "id": "rs_1", **fields}


def text_parts(kind: str, *texts: str) -> list[dict[str, str]]:
    return [{"type": kind, "text": text} for text in texts]


@pytest.mark.parametrize(
    "item, expected",
    [
        (reasoning(summary=text_parts("summary_text", "s1", "s2")), "s1"),
        (reasoning(summary=text_parts("summary_text", "s"), content=text_parts("r", "c")), "c"),
        (reasoning(summary=[]), ""),
        (reasoning(summary=[], encrypted_content=""), ""),
    ],
)
def test_a_reasoning_item_is_an_assistant_message_of_its_first_reasoning_text(item, expected):
    built = messages(responses(item))[1]
    assert built == {
        "role": "assistant",
        "content": "",
        "reasoning": expected,
        "reasoning_content": expected,
    }


def test_encrypted_reasoning_is_the_engines_refusal():
    reason, message = letter(responses(reasoning(summary=[], encrypted_content="gAAAA")))
    assert (reason, "encrypted" in message) == ("invalid_request", True)


def test_an_mcp_call_joins_the_reasoning_before_it_and_a_function_call_does_not():
    thought = reasoning(summary=text_parts("summary_text", "think"))
    joined = messages(responses(thought, {**CALL, "id": "mcp_1"}))
    assert len(joined) == 2
    assert (joined[1]["reasoning"], joined[1]["tool_calls"][0]["id"]) == ("think", "c1")
    apart = messages(responses(thought, {**CALL, "id": "fc_1"}))
    assert [("reasoning" in m, "tool_calls" in m) for m in apart[1:]] == [
        (True, False),
        (False, True),
    ]


def test_an_output_message_item_is_its_text():
    output = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": text_parts("output_text", "Sunny."),
    }
    assert messages(responses(output))[1] == {"role": "assistant", "content": "Sunny."}


def test_an_output_message_is_its_first_parts_text_as_the_engine_builds_it():
    """A previous response's output message replayed (its `id` and `status` say so) is read
    from its first content part only; an input message of the same parts joins them all."""
    parts = [*text_parts("output_text", "Sunny."), *text_parts("output_text", " Warm.")]
    output = {"type": "message", "id": "m", "role": "assistant", "status": "completed"}
    assert messages(responses({**output, "content": parts}))[1]["content"] == "Sunny."
    own = {"type": "message", "role": "assistant", "content": parts}
    assert messages(responses(own))[1]["content"] == "Sunny.\n Warm."


def test_an_item_of_an_unknown_type_is_a_letter_naming_it():
    assert letter(responses({"type": "web_search_call", "id": "ws_1"})) == (
        "unsupported_content",
        "input item 1 has type 'web_search_call'",
    )


def test_a_refusal_part_is_read_as_text():
    turn = {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]}
    record = {"timestamp": 0, "output_length": 1, "messages": [USER, turn, USER]}
    assert messages(record)[1]["content"] == "No."
    turn["content"] = [{"type": "refusal", "refusal": 5}]
    assert letter(record)[0] == "wrong_type"


def test_empty_instructions_add_no_system_turn_as_the_engine_adds_none():
    assert [m["role"] for m in messages({**responses(), "instructions": ""})] == ["user"]
    assert [m["role"] for m in messages({**responses(), "instructions": "x"})] == ["system", "user"]
