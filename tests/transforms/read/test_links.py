"""The links a record carries (read/links.py): what names a request, what it continues."""

from __future__ import annotations

import json

import pytest

from helpers import ANTHROPIC, OPENAI_TOOL_TURN, RESPONSES
from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.links import MAX_LINK_CHARS, continued, names
from kvtrace.transforms.read.records import ParseOptions, parse_record


def parsed(record: dict, links: bool = True):
    return parse_record(json.dumps(record).encode(), "logs.jsonl", ParseOptions(links=links))


CALL = {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(
    "response, expected",
    [
        # chat: the completion's id and its tool calls' ids
        (
            {
                "id": "chatcmpl-1",
                "choices": [{"message": {"role": "assistant", "tool_calls": [CALL]}}],
            },
            ("response:chatcmpl-1", "call:call_9"),
        ),
        # streamed chunks: one id for all, each call's id where a delta opens it
        (
            [
                {"id": "chatcmpl-2", "choices": [{"delta": {"tool_calls": [{"id": "c1"}]}}]},
                {"id": "chatcmpl-2", "choices": [{"delta": {"tool_calls": [{"index": 0}]}}]},
            ],
            ("response:chatcmpl-2", "call:c1"),
        ),
        # Responses: the response's id and its function calls' call ids
        (
            {"id": "resp_a", "output": [{"type": "function_call", "call_id": "c2"}]},
            ("response:resp_a", "call:c2"),
        ),
        # Anthropic: the message's id and its tool_use blocks' ids
        (
            {
                "id": "msg_1",
                "content": [{"type": "text", "text": "x"}, {"type": "tool_use", "id": "t"}],
            },
            ("response:msg_1", "call:t"),
        ),
        # ids that name nothing: empty, too long, of another type
        ({"id": "", "output": [{"type": "function_call", "call_id": ["x"]}]}, ()),
        ({"id": "x" * (MAX_LINK_CHARS + 1)}, ()),
        (None, ()),
    ],
)
def test_a_response_names_its_request_by_its_id_and_its_calls(response, expected):
    assert names(response) == expected


def test_each_shape_continues_the_call_its_newest_tool_result_answers():
    assert parsed(OPENAI_TOOL_TURN).continues == "call:call_1"
    assert parsed(RESPONSES).continues == "call:c1"
    assert parsed(ANTHROPIC).continues == "call:t1"


def test_only_the_newest_run_of_tool_results_counts():
    """A user turn after a tool result continues the conversation, not that old call."""
    messages = [*OPENAI_TOOL_TURN["messages"], {"role": "user", "content": "and Rome?"}]
    assert parsed({**OPENAI_TOOL_TURN, "messages": messages}).continues is None
    two = [{"role": "tool", "tool_call_id": "a"}, {"role": "tool", "tool_call_id": "b"}]
    assert continued([{"role": "user"}, {"role": "assistant"}, *two]) == "call:a"


def test_a_record_continuing_a_stored_response_is_a_stored_context_letter():
    """Its prompt is the stored conversation and its input, and a log holds only the input
    (docs/ANONYMIZE.md): refused whatever the id, links read or not."""
    for links in (True, False):
        for previous in ("resp_a", 7):
            with pytest.raises(Rejected) as refused:
                parsed({**RESPONSES, "previous_response_id": previous}, links)
            assert refused.value.reason == "stored_context"


def test_a_record_without_links_has_none():
    request = parsed({"timestamp": 0, "messages": [{"role": "user", "content": "hi"}]})
    assert (request.links, request.continues) == ((), None)


def test_links_are_read_only_when_asked():
    """Without --emit-parents no response is walked for them: runs that publish no
    parent_row read their logs as before."""
    record = {**RESPONSES, "response": {"id": "resp_a", "output": []}}
    request = parsed(record, links=False)
    assert (request.links, request.continues) == ((), None)
