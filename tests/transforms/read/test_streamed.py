"""A streamed response's text chunks merged before the record is read (read/streamed.py): the
record reads exactly as with the whole list of chunks, Request or dead letter alike."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.chat import generated_text
from kvtrace.transforms.read.records import (
    ParseOptions,
    Request,
    load_json_line,
    parse_record,
    request_from_object,
)
from kvtrace.transforms.read.streamed import condensed, final_response


def text_chunk(content: Any = "ab ", **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_767_225_600,
        "model": "m",
        "choices": [
            {"index": 0, "delta": {"content": content}, "logprobs": None, "finish_reason": None}
            | choice
        ],
    }


# Chunks of every form a stream may hold: text chunks, and chunks a reader reads (usage, times,
# tool calls, a message, output items), chunks the shapes refuse and ones nested past labels.
OTHER_CHUNKS = {
    "usage": {"choices": [], "usage": {"completion_tokens": 7, "prompt_tokens": 3}},
    "cached": {
        "choices": [],
        "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}},
    },
    "num_cached": text_chunk() | {"num_cached_tokens": 5},
    "arrival": text_chunk() | {"arrival_time": 1_767_225_601_000},
    "tool_call": text_chunk(
        None, delta={"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]}
    ),
    "message": {"choices": [{"message": {"content": "whole"}}]},
    "output": {"output": [{"type": "message", "content": [{"type": "output_text", "text": "o"}]}]},
    "two_choices": text_chunk() | {"choices": [{"delta": {"content": "a"}}] * 2},
    "second_sequence": text_chunk("other", index=1),
    "logprobs": text_chunk(logprobs={"content": []}),
    "nested_label": text_chunk() | {"system_fingerprint": {"a": [1]}},
    "index_string": text_chunk(index="0"),
    "index_bool": text_chunk(index=True),
    "finish_number": text_chunk(finish_reason=1),
    "content_number": text_chunk(5),
    "content_list": text_chunk([{"type": "text", "text": "x"}]),
    "delta_list": text_chunk(delta=["x"]),
    "choice_null": text_chunk() | {"choices": [None]},
    "not_object": "chunk",
    "null": None,
    "typed": {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "t"}]},
}
TEXT_CHUNKS = {
    "content": text_chunk("cd "),
    "empty": text_chunk(""),
    "no_text": text_chunk(None),
    "role": text_chunk(delta={"role": "assistant", "content": None, "refusal": None}),
    "reasoning_content": text_chunk(delta={"reasoning_content": "r", "content": None}),
    "reasoning_null": text_chunk(delta={"reasoning_content": None, "reasoning": "s"}),
    "both": text_chunk(delta={"reasoning": "t", "content": "u"}),
    "finish": text_chunk(finish_reason="stop"),
    "usage_null": text_chunk("v") | {"usage": None, "service_tier": "default"},
}


def record(chunks: list[Any], **fields: Any) -> dict[str, Any]:
    return {
        "timestamp": 1_767_225_600_000,
        "request": {"messages": [{"role": "user", "content": "hi"}], "session_id": "s"},
        "response": chunks,
    } | fields


def read_whole(line: bytes, options: ParseOptions) -> Request | tuple[str, str]:
    """The record read with its whole list of chunks, as before they were merged: its strings
    checked, as a Parquet row's are, so none is merged."""
    value, _ = load_json_line(line)
    try:
        return request_from_object(value, line, "src", options, check_strings=True)
    except Rejected as err:
        return err.reason, err.message


def read(line: bytes, options: ParseOptions) -> Request | tuple[str, str]:
    try:
        return parse_record(line, "src", options)
    except Rejected as err:
        return err.reason, err.message


def assert_reads_as_whole(
    value: dict[str, Any], options: ParseOptions = ParseOptions()
) -> Request | tuple[str, str]:
    line = json.dumps(value).encode()
    got = read(line, options)
    assert got == read_whole(line, options)
    return got


@pytest.mark.parametrize("name", sorted(OTHER_CHUNKS))
def test_each_other_chunk_between_text_chunks_reads_as_whole(name: str) -> None:
    text = list(TEXT_CHUNKS.values())
    assert_reads_as_whole(record([text_chunk("first"), *text, OTHER_CHUNKS[name], *text]))


@pytest.mark.parametrize("name", sorted(TEXT_CHUNKS))
def test_each_text_chunk_merges_and_reads_as_whole(name: str) -> None:
    chunks = [text_chunk("first"), TEXT_CHUNKS[name], TEXT_CHUNKS[name], OTHER_CHUNKS["usage"]]
    merged = condensed(json.loads(json.dumps(chunks)))
    # Reasoning and content interleaved chunk by chunk keep their order: nothing merges.
    assert (merged is None) if name == "both" else (merged is not None and len(merged) <= 3)
    assert_reads_as_whole(record(chunks))


def test_runs_merge_in_order_around_kept_chunks() -> None:
    chunks = [
        text_chunk("a"),
        text_chunk("b"),
        TEXT_CHUNKS["reasoning_content"],
        OTHER_CHUNKS["tool_call"],
        text_chunk("c"),
        text_chunk(None),
        OTHER_CHUNKS["usage"],
        text_chunk(None),
    ]
    assert condensed(chunks) == [
        chunks[0],  # the first is kept: its `created` may date the request
        {"choices": [{"delta": {"content": "b"}}]},  # reasoning and content apart, in order
        {"choices": [{"delta": {"reasoning_content": "r"}}]},
        chunks[3],
        {"choices": [{"delta": {"content": "c"}}]},
        chunks[6],
        {"choices": [{"delta": {}}]},  # a run that generated nothing: its sequence still seen
    ]
    request = assert_reads_as_whole(record(chunks, timestamp=None))
    assert isinstance(request, Request)
    assert request.output_length == 7 and request.timestamp_ms == 1_767_225_600_000


def test_a_run_that_generated_nothing_still_counts_its_sequence() -> None:
    """Another sequence's chunk, then the first's generating nothing: two sequences, merged or
    whole (hypothesis found the merged reading exporting it: the empty run left no chunk)."""
    got = assert_reads_as_whole(record([text_chunk("other", index=1), text_chunk(None)]))
    assert got[0] == "unsupported_request"


def test_generated_text_is_the_whole_streams() -> None:
    chunks = [text_chunk("a"), *TEXT_CHUNKS.values(), OTHER_CHUNKS["tool_call"], text_chunk("z")]
    request = assert_reads_as_whole(record(chunks))
    assert isinstance(request, Request)
    # Chunk by chunk, reasoning before content, then a tool call's name and arguments.
    assert request.output_text == "acd rstuab vf{}z"


def test_a_stream_of_nothing_to_merge_is_left_whole() -> None:
    assert condensed([text_chunk("a"), OTHER_CHUNKS["usage"]]) is None
    assert condensed([]) is None


def test_a_refused_stream_names_the_chunk_at_its_index_in_the_whole() -> None:
    chunks = [text_chunk("a"), *[text_chunk("b")] * 5, OTHER_CHUNKS["index_string"]]
    reason, message = assert_reads_as_whole(record(chunks))
    assert reason == "wrong_type" and "response[6]" in message


def test_a_record_refused_elsewhere_gives_the_wholes_letter() -> None:
    value = record([text_chunk("a")] * 4)
    value["request"]["messages"][0]["role"] = 3
    reason, _ = assert_reads_as_whole(value)
    assert reason == "wrong_type"


def test_the_text_of_a_stream_needing_the_standard_parser_is_read_whole() -> None:
    """A line orjson declines (a lone surrogate) has its strings checked: never merged."""
    value = record([text_chunk("a"), text_chunk("b"), text_chunk("c")])
    line = json.dumps(value).replace('"b"', '"\\ud800"').encode()
    assert (
        read(line, ParseOptions())
        == read_whole(line, ParseOptions())
        == (
            "invalid_unicode",
            "a string holds a lone surrogate at character 0 (not encodable as UTF-8)",
        )
    )


CHUNK = st.one_of(
    st.sampled_from(list(TEXT_CHUNKS.values())),
    st.sampled_from(list(OTHER_CHUNKS.values())),
    st.builds(
        lambda chunk, name: chunk | {"id": name},  # a response's id, or none (the role chunk)
        st.builds(
            text_chunk,
            st.one_of(st.none(), st.text(max_size=5), st.integers()),
            index=st.one_of(st.none(), st.integers(0, 2), st.booleans()),
            finish_reason=st.one_of(st.none(), st.sampled_from(["stop", "length"])),
        ),
        st.one_of(st.none(), st.sampled_from(["resp_1", "resp_2"]), st.integers(0, 1)),
    ),
)


@settings(max_examples=300)
@given(st.lists(CHUNK, max_size=40), st.booleans())
def test_any_stream_reads_as_whole(chunks: list[Any], dated_by_chunk: bool) -> None:
    value = record(chunks, timestamp=None if dated_by_chunk else 1)
    # The links too (read/links.py): a text chunk's id names its request, merged or not.
    for options in (ParseOptions(), ParseOptions(links=True)):
        assert_reads_as_whole(value, options)


def test_a_merged_text_chunks_id_still_names_its_request() -> None:
    """The first chunk (the role) carries no id, the text chunks merged after it do."""
    chunks = [{"choices": [{"delta": {"role": "assistant"}}]}, text_chunk("a"), text_chunk("b")]
    request = assert_reads_as_whole(record(chunks), ParseOptions(links=True))
    assert isinstance(request, Request) and request.links == ("response:chatcmpl-1",)


def test_a_chunk_of_another_sequence_refuses_the_stream_as_whole() -> None:
    """Two sequences streamed (round 22): their lengths summed would be no request's, so the
    merged and the whole list alike are refused."""
    chunks = [text_chunk("a"), text_chunk("b", index=1), text_chunk("c")]
    refused = assert_reads_as_whole(record(chunks))
    assert isinstance(refused, tuple) and refused[0] == "unsupported_request"


# ---- A Responses API stream logged as its events ----------------------------------------------

CREATED_AT = 1_767_225_600
OUTPUT = [{"type": "message", "content": [{"type": "output_text", "text": "one two"}]}]


def responses_events(final: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A stream's events: created (an empty output), two output_text deltas, completed holding
    `final` over the created response (no completed event when None)."""
    response = {"id": "resp_1", "object": "response", "created_at": CREATED_AT}
    events = [
        {"type": "response.created", "response": {**response, "output": []}},
        {"type": "response.output_text.delta", "item_id": "m", "delta": "one "},
        {"type": "response.output_text.delta", "item_id": "m", "delta": "two"},
    ]
    if final is not None:
        events.append({"type": "response.completed", "response": {**response, **final}})
    return events


def read_value(value: dict[str, Any]) -> Request | tuple[str, str]:
    return read(json.dumps(value).encode(), ParseOptions())


def test_a_responses_stream_reads_as_its_final_response_logged_whole() -> None:
    final = {"output": OUTPUT, "usage": {"output_tokens": 2}, "completed_at": CREATED_AT + 3}
    events = responses_events(final)
    assert final_response(events) == events[-1]["response"]
    streamed = read_value(record(events, timestamp=None))
    whole = read_value(record(events[-1]["response"], timestamp=None))
    assert isinstance(streamed, Request) and isinstance(whole, Request)
    assert (streamed.output_length, streamed.timestamp_ms, streamed.response_ms) == (
        2,
        CREATED_AT * 1000,
        3000,
    )
    assert dataclasses.replace(streamed, line=whole.line) == whole


@pytest.mark.parametrize("final", [None, {"status": "incomplete"}])
def test_a_responses_stream_without_final_output_reads_its_deltas(final: Any) -> None:
    request = read_value(record(responses_events(final), timestamp=None))
    assert isinstance(request, Request)
    assert (request.output_text, request.timestamp_ms) == ("one two", CREATED_AT * 1000)


def test_a_responses_streams_final_response_is_held_to_the_response_shape() -> None:
    events = responses_events({"usage": {"output_tokens": "2"}})
    reason, message = read_value(record(events))
    assert reason == "wrong_type" and message.startswith("response[3].response.usage")


def test_a_responses_streams_delta_of_no_text_is_refused_naming_it() -> None:
    events = responses_events()
    events[2]["delta"] = ["two"]
    assert read_value(record(events)) == ("wrong_type", "response[2].delta is a list, not a string")


def test_a_list_not_all_responses_events_is_left_as_it_is() -> None:
    chunks = [*responses_events(), text_chunk("a")]
    assert final_response(chunks) is chunks
    assert final_response([]) == []


def test_a_responses_stream_ending_in_an_error_event_is_a_failed_request() -> None:
    error = {"type": "error", "code": "server_error", "message": "m", "param": None}
    events = [*responses_events(), error]
    assert final_response(events)["error"] == {"code": "server_error", "message": "m"}
    assert read_value(record(events)) == ("failed_request", "the call logged an error: not served")
    failed = responses_events({"status": "failed", "error": {"code": "c", "message": "m"}})
    assert read_value(record(failed))[0] == "failed_request"


@pytest.mark.parametrize(
    "kind", ["reasoning_text", "reasoning_summary_text", "refusal", "function_call_arguments"]
)
def test_every_generated_text_delta_of_a_responses_stream_counts(kind: str) -> None:
    events = responses_events()
    events.insert(1, {"type": f"response.{kind}.delta", "item_id": "r", "delta": "zero "})
    request = read_value(record(events))
    assert isinstance(request, Request) and request.output_text == "zero one two"


def test_a_function_calls_name_counts_where_its_item_opens() -> None:
    call = {"type": "function_call", "name": "get_weather", "arguments": "", "call_id": "c"}
    events = responses_events()
    events[1:1] = [
        {"type": "response.output_item.added", "output_index": 0, "item": call},
        {"type": "response.output_item.added", "output_index": 1, "item": {"type": "message"}},
    ]
    request = read_value(record(events))
    assert isinstance(request, Request) and request.output_text == "get_weatherone two"
    call["name"] = 5
    assert read_value(record(events)) == (
        "wrong_type",
        "response[1].item.name is an integer, not a string",
    )


def test_a_responses_stream_of_events_generates_what_the_same_response_logged_whole_does() -> None:
    """One statement of what a response generated: the items rebuilt from a stream's events
    (by output_index, else item_id) are read as the response logged whole is, a reasoning
    item's content, else its summary, never both (reviewer, round 22)."""
    reasoning = {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "sum"}],
        "content": [{"type": "reasoning_text", "text": "raw"}],
    }
    answer = {"type": "message", "content": [{"type": "output_text", "text": "ans"}]}
    whole = read_value(record({"created_at": CREATED_AT, "output": [reasoning, answer]}))
    delta = "response.{}.delta".format
    events = [
        {"type": "response.created", "response": {"created_at": CREATED_AT}},
        {"type": delta("reasoning_summary_text"), "output_index": 0, "delta": "sum"},
        {"type": delta("reasoning_text"), "output_index": 0, "delta": "r"},
        {"type": delta("output_text"), "item_id": "m", "output_index": 1, "delta": "an"},
        {"type": delta("reasoning_text"), "output_index": 0, "delta": "aw"},
        {"type": delta("output_text"), "item_id": "m", "delta": "s"},  # its index said before
    ]
    streamed = read_value(record(events))
    assert isinstance(whole, Request) and isinstance(streamed, Request)
    assert streamed.output_text == whole.output_text == "rawans"
    assert final_response(events)["output"] == [
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "sum"}],
            "content": [{"type": "reasoning_text", "text": "raw"}],
        },
        answer,
    ]
    # A summary alone is what the item generated, as from the whole response.
    summary_only = [event for event in events if "reasoning_text" not in event["type"]]
    assert read_value(record(summary_only)).output_text == "sumans"


def test_a_refusal_part_is_generated_text_streamed_or_whole() -> None:
    refusal = {"type": "message", "content": [{"type": "refusal", "refusal": "No."}]}
    whole = read_value(record({"created_at": CREATED_AT, "output": [refusal]}))
    events = [
        {"type": "response.created", "response": {"created_at": CREATED_AT}},
        {"type": "response.refusal.delta", "output_index": 0, "delta": "No."},
    ]
    assert final_response(events)["output"] == [refusal]
    assert whole.output_text == read_value(record(events)).output_text == "No."


def test_a_responses_stream_skips_an_idle_event_and_reads_its_final_response():
    done = {"usage": {"output_tokens": 9}, "output": []}
    events = [
        {"type": "response.created", "response": {"output": []}},
        {"type": "keepalive"},
        {"type": "response.completed", "response": done},
    ]
    assert final_response(events) == done


def test_an_anthropic_stream_cut_short_reads_as_the_message_its_blocks_built():
    events = [
        {"type": "message_start", "message": {"type": "message", "content": []}},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "name": "f"},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"a"'},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": ": 1}"},
        },
        {"type": "ping"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "s"},
        },
    ]
    read = final_response(events)
    assert read[:-1] == events  # every other reader reads the events as logged
    assert read[-1] == {
        "type": "message",
        "content": [
            {"type": "text", "text": "hi"},
            {"type": "tool_use", "name": "f", "input": '{"a": 1}'},
        ],
    }
    assert generated_text(read) == 'hif{"a": 1}'


def test_a_list_of_other_typed_objects_is_no_stream_of_events():
    chunks = [{"type": "keepalive"}, {"type": "something"}]
    assert final_response(chunks) is chunks


def test_a_stream_opening_with_a_content_filter_chunk_is_dated_by_its_completions_chunk() -> None:
    """Azure's streams open with a chunk for the prompt's filter (`created` 0, no id, no
    choices): the request is dated by the first chunk that is the completion's, merged or not,
    as the same stream without the filter chunk is."""
    azure = {"choices": [], "created": 0, "id": "", "prompt_filter_results": [{}]}
    chunks = [text_chunk(delta={"role": "assistant"}), text_chunk("a"), text_chunk("b")]
    filtered = assert_reads_as_whole(record([azure, *chunks], timestamp=None))
    plain = assert_reads_as_whole(record(chunks, timestamp=None))
    assert isinstance(filtered, Request) and isinstance(plain, Request)
    assert filtered.timestamp_ms == plain.timestamp_ms == 1_767_225_600_000
    assert condensed([azure, *chunks])[:2] == [azure, chunks[0]]


@pytest.mark.parametrize("marker", [{"object": "response"}, {"type": "message"}])
def test_how_a_stream_ended_reads_alike_condensed_and_whole(marker: dict[str, Any]) -> None:
    """A text chunk another API's marker names still ends by its choice's finish_reason."""
    chunks = [text_chunk("a"), text_chunk("b"), text_chunk("c", finish_reason="stop") | marker]
    got = assert_reads_as_whole(record(chunks))
    assert isinstance(got, Request) and got.output_stopped is True
