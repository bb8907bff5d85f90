import json

import pytest
from transforms.errors import Rejected
from transforms.read.records import MAX_NESTING_DEPTH, parse_record
from transforms.read.timestamps import timestamp_ms

USER = [{"role": "user", "content": "hi"}]


def parse(record, input_format="auto"):
    line = record if isinstance(record, bytes) else json.dumps(record).encode()
    return parse_record(line, "src.jsonl", input_format)


def reason(record, input_format="auto"):
    with pytest.raises(Rejected) as caught:
        parse(record, input_format)
    return caught.value.reason


def test_chat_from_messages_or_input():
    assert parse({"messages": USER}).messages == USER
    assert parse({"input": USER}).kind == "chat"
    assert parse({"input": "hello"}).messages == [{"role": "user", "content": "hello"}]


def test_content_parts_are_joined_with_newlines():
    content = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    request = parse({"messages": [{"role": "user", "content": content}]})
    assert request.messages[0]["content"] == "a\nb"


def test_prompt_and_tokens_shapes():
    assert parse({"prompt": "formatted"}).prompt == "formatted"
    assert parse({"input_ids": [1, 2, 3]}).input_ids == [1, 2, 3]


def test_openai_envelope():
    request = parse({
        "request": {"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}]},
        "response": {"created": 1700000000, "usage": {"completion_tokens": 42}},
    })
    assert request.kind == "chat" and request.tools and request.output_length == 42
    assert request.timestamp_ms == 1_700_000_000_000


def test_output_length_sources_in_order():
    both = {"messages": USER, "output": "text", "output_length": 3}
    assert parse(both).output_text == "text" and parse(both).output_length is None
    assert parse({"messages": USER, "output_length": 3}).output_length == 3
    response = {"choices": [{"message": {"content": "answer", "reasoning_content": "think"}}]}
    assert parse({"request": {"messages": USER}, "response": response}).output_text == "thinkanswer"
    assert parse({"messages": USER}).defaulted == ("timestamp", "output_length")


def test_timestamps():
    assert parse({"messages": USER, "timestamp": 1500.7}).timestamp_ms == 1500
    assert parse({"messages": USER, "timestamp": "1970-01-01T00:00:01.5Z"}).timestamp_ms == 1500
    assert parse({"messages": USER, "created": 2}).timestamp_ms == 2000
    assert timestamp_ms("2025-01-01T01:00:00+01:00", 1) == timestamp_ms("2025-01-01T00:00:00", 1)


def test_sessions_are_kept_as_strings_for_keyed_hashing():
    assert parse({"messages": USER, "session_id": 7}).session == "7"
    assert parse({"messages": USER, "conversation_id": "c"}).session == "c"


def test_forced_format_ignores_other_shapes():
    assert parse({"prompt": "p", "messages": USER}, "prompt").kind == "prompt"
    assert reason({"messages": USER}, "tokens") == "no_input"


@pytest.mark.parametrize(
    "record, expected",
    [
        (b"not json", "invalid_json"),
        (b"[1, 2]", "not_an_object"),
        (b"\xff\xfe{}", "invalid_utf8"),
        (b"[" * 100_000 + b"]" * 100_000, "too_deep"),
        ({"x": json.loads("[" * (MAX_NESTING_DEPTH + 1) + "]" * (MAX_NESTING_DEPTH + 1))}, "too_deep"),
        ({"timestamp": 1}, "no_input"),
        ({"messages": []}, "invalid_request"),
        ({"messages": 5}, "wrong_type"),
        ({"messages": [{"content": "no role"}]}, "invalid_request"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "invalid_request"),
        ({"messages": [{"role": "user", "content": 5}]}, "wrong_type"),
        ({"messages": [{"role": "user"}]}, "invalid_request"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "unsupported_content"),
        ({"messages": USER, "tools": "f"}, "wrong_type"),
        ({"prompt": ""}, "no_input"),
        ({"prompt": 5}, "wrong_type"),
        ({"input_ids": [1, -2]}, "wrong_type"),
        ({"input_ids": [1, True]}, "wrong_type"),
        ({"input_ids": [2**40]}, "wrong_type"),
        ({"messages": USER, "timestamp": "yesterday"}, "bad_timestamp"),
        ({"messages": USER, "timestamp": True}, "wrong_type"),
        ({"messages": USER, "timestamp": [1]}, "wrong_type"),
        ({"messages": USER, "output": 5}, "wrong_type"),
        ({"messages": USER, "output_length": -1}, "wrong_type"),
        ({"messages": USER, "session_id": {"a": 1}}, "wrong_type"),
    ],
)
def test_bad_records_are_rejected_with_a_reason(record, expected):
    assert reason(record) == expected
