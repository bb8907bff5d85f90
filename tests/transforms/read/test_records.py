"""Parsing one record: shapes, fields, ranges, Unicode; property-based over arbitrary JSON."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.json_tree import MAX_NESTING_DEPTH, check_tree
from kvtrace.transforms.read.records import ParseOptions, Request, parse_record, without_nulls
from kvtrace.transforms.read.timestamps import timestamp_ms

USER = [{"role": "user", "content": "hi"}]
TS = {"timestamp": 1_700_000_000_000}


def parse(record, **options) -> Request:
    line = record if isinstance(record, bytes) else json.dumps(record).encode()
    return parse_record(line, "src.jsonl", ParseOptions(**options))


def reason(record, **options) -> str:
    with pytest.raises(Rejected) as caught:
        parse(record, **options)
    return caught.value.reason


def test_chat_from_messages_or_responses_input():
    assert parse({"messages": USER, **TS}).messages == USER
    assert parse({"input": USER, **TS}).kind == "chat"
    assert parse({"input": "hello", **TS}).messages == [{"role": "user", "content": "hello"}]


def test_content_parts_are_joined_with_newlines():
    content = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    request = parse({"messages": [{"role": "user", "content": content}], **TS})
    assert request.messages[0]["content"] == "a\nb"


def test_prompt_and_tokens_shapes():
    assert parse({"prompt": "formatted", **TS}).prompt == "formatted"
    assert parse({"input_ids": [1, 2, 3], **TS}).input_ids == [1, 2, 3]


@pytest.mark.parametrize("prompt", [[1, 2, 3], [[1, 2, 3]]])
def test_a_completions_prompt_of_token_ids_reads_as_input_ids(prompt):
    request = parse({"request": {"prompt": prompt}, **TS})
    assert (request.kind, request.input_ids) == ("tokens", [1, 2, 3])


def test_a_completions_prompt_of_one_string_is_that_string():
    assert parse({"prompt": ["formatted"], **TS}).prompt == "formatted"


@pytest.mark.parametrize(
    "prompt, refused",
    [
        (["a", "b"], "unsupported_request"),  # two requests in one
        ([[1], [2]], "unsupported_request"),
        ([1, "a"], "invalid_request"),  # the engine's 400
        ([], "no_input"),
        ([""], "no_input"),
        ([[]], "no_input"),
        ([-1], "wrong_type"),
        ([[1, "a"]], "wrong_type"),
        ([1.5], "wrong_type"),
    ],
)
def test_a_completions_prompt_list_that_is_not_one_prompt_is_a_letter(prompt, refused):
    assert reason({"prompt": prompt, **TS}) == refused


def test_openai_envelope():
    request = parse(
        {
            "request": {
                "messages": USER,
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            "response": {"created": 1700000000, "usage": {"completion_tokens": 42}},
        }
    )
    assert request.kind == "chat" and request.tools and request.output_length == 42
    assert request.timestamp_ms == 1_700_000_000_000


def test_output_length_sources_in_order():
    both = {"messages": USER, "output": "text", "output_length": 3, **TS}
    assert parse(both).output_text == "text" and parse(both).output_length is None
    assert parse({"messages": USER, "output_length": 3, **TS}).output_length == 3
    response = {"choices": [{"message": {"content": "answer", "reasoning_content": "think"}}]}
    assert (
        parse({"request": {"messages": USER}, "response": response, **TS}).output_text
        == "thinkanswer"
    )
    assert parse({"messages": USER, **TS}).defaulted == ("output_length",)


def test_output_counts_tool_calls_and_streamed_chunks():
    call = {"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    response = {"choices": [{"message": {"content": None, "tool_calls": [call]}}]}
    text = parse({"request": {"messages": USER}, "response": response, **TS}).output_text
    assert text == 'get_weather{"city": "Paris"}'
    chunks = [
        {"choices": [{"delta": {"reasoning_content": "hm"}}]},
        {"choices": [{"delta": {"content": "Hel"}}]},
        {"choices": [{"delta": {"content": "lo"}}]},
        {"choices": []},
    ]
    assert parse({"request": {"messages": USER}, "response": chunks, **TS}).output_text == "hmHello"
    with_usage = [*chunks, {"choices": [], "usage": {"completion_tokens": 9}}]
    assert parse({"request": {"messages": USER}, "response": with_usage, **TS}).output_length == 9


def test_openai_tool_calling_history_is_normalized_as_vllm_does():
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "20C"},
        {"role": "assistant", "tool_calls": []},
    ]
    got = parse({"messages": messages, **TS}).messages
    assert got[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    }
    assert got[2] == {"role": "tool", "content": "20C", "tool_call_id": "c1"}
    assert got[3] == {"role": "assistant", "content": ""}


def test_anthropic_messages_become_openai_messages():
    record = {
        **TS,
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "look it up"},
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "20C"}],
            },
        ],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
    }
    request = parse(record)
    assert [m["role"] for m in request.messages] == ["system", "user", "assistant", "tool"]
    assert request.messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert request.messages[2]["reasoning_content"] == "look it up"
    assert request.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": None,
                "parameters": {"type": "object"},
            },
        }
    ]


def test_tools_are_normalized_as_vllms_request_model_dumps_them():
    tools = [
        {
            "function": {"parameters": {"type": "object"}, "strict": True, "name": "f"},
            "type": "function",
        },
        {"type": "function", "function": {"name": "g"}, "x-note": 1},
    ]
    served = parse({**TS, "messages": USER, "tools": tools}).tools
    assert served == [
        {
            "type": "function",
            "function": {
                "name": "f",
                "description": None,
                "parameters": {"type": "object"},
                "strict": True,
            },
        },
        {
            "type": "function",
            "function": {"name": "g", "description": None, "parameters": None},
        },  # a key the model does not declare is dropped as it dumps the tool
    ]
    assert list(served[0]["function"]) == ["name", "description", "parameters", "strict"]


def test_responses_api_items():
    record = {
        **TS,
        "instructions": "sys",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "20C"},
        ],
    }
    messages = parse(record).messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[3]["tool_call_id"] == "c1"


def test_parallel_function_call_items_are_one_assistant_message_each_as_vllm_makes_them():
    calls = [
        {
            "type": "function_call",
            "call_id": f"c{i}",
            "name": "get_weather",
            "arguments": json.dumps({"city": city}),
        }
        for i, city in enumerate(["Oslo", "Rome"])
    ]
    outputs = [
        {"type": "function_call_output", "call_id": f"c{i}", "output": "20C"} for i in range(2)
    ]
    messages = parse(
        {**TS, "input": [{"role": "user", "content": "both?"}, *calls, *outputs]}
    ).messages
    assert [m["role"] for m in messages] == ["user", "assistant", "assistant", "tool", "tool"]
    assert [m["tool_calls"][0]["function"]["arguments"] for m in messages[1:3]] == [
        {"city": "Oslo"},
        {"city": "Rome"},
    ]


def test_non_text_parts_are_dead_letters_unless_dropped():
    image = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this"},
                    {"type": "image_url", "image_url": {"url": "x"}},
                ],
            }
        ],
        **TS,
    }
    assert reason(image) == "non_text_content"
    assert parse(image, drop_non_text_parts=True).messages[0]["content"] == "what is this"


@pytest.mark.parametrize(
    "value, unit, expected",
    [
        (1_700_000_000, "auto", 1_700_000_000_000),  # epoch seconds
        (1_700_000_000.5, "auto", 1_700_000_000_500),
        (1_700_000_000_123, "auto", 1_700_000_000_123),  # ms
        (1_700_000_000_123_456, "auto", 1_700_000_000_123),  # us
        (1_700_000_000_123_456_789, "auto", 1_700_000_000_123),  # ns
        (1500.7, "auto", 1500),  # small: relative ms
        (1500, "s", 1_500_000),
        ("2001-09-09T01:46:40.5Z", "auto", 1_000_000_000_500),
        ("2025-01-01T01:00:00+01:00", "auto", 1_735_689_600_000),
        ("2025-01-01 00:00:00", "auto", 1_735_689_600_000),
    ],
)
def test_timestamp_units(value, unit, expected):
    assert timestamp_ms(value, unit) == expected


def test_created_is_epoch_seconds_and_missing_timestamp_is_a_dead_letter():
    assert parse({"messages": USER, "created": 2_000_000_000}).timestamp_ms == 2_000_000_000_000
    assert reason({"messages": USER}) == "missing_timestamp"


def test_sessions_are_kept_as_strings_for_keyed_hashing():
    assert parse({"messages": USER, "session_id": 7, **TS}).session == "7"
    assert parse({"messages": USER, "conversation_id": "c", **TS}).session == "c"


@pytest.mark.parametrize("holder", ["record", "request"])
def test_an_empty_session_id_is_no_session_as_null_is(holder):
    """ "" is how a table export writes no value: taken as an id it would make one session of
    every request without one."""
    ids = {"session_id": "", "conversation_id": "c"}
    record = {"messages": USER, **TS, **ids}
    if holder == "request":
        record = {"request": {"messages": USER, **ids}, **TS}
    assert parse(record).session == "c"
    assert parse({"messages": USER, "session_id": "", **TS}).session is None


def test_forced_format_ignores_other_shapes():
    assert parse({"prompt": "p", "messages": USER, **TS}, input_format="prompt").kind == "prompt"
    assert reason({"messages": USER, **TS}, input_format="tokens") == "no_input"


def test_oversized_record_is_rejected_before_decoding():
    assert reason({"prompt": "x" * 5000, **TS}, max_record_bytes=1024) == "too_large"


@pytest.mark.parametrize(
    "record, expected",
    [
        (b"not json", "invalid_json"),
        (b"[1, 2]", "not_an_object"),
        (b"\xff\xfe{}", "invalid_utf8"),
        (b"[" * 100_000 + b"]" * 100_000, "too_deep"),
        (
            {"x": json.loads("[" * (MAX_NESTING_DEPTH + 1) + "]" * (MAX_NESTING_DEPTH + 1)), **TS},
            "too_deep",
        ),
        (b'{"prompt": "a\\ud800b", "timestamp": 1}', "invalid_unicode"),
        (
            b'{"messages": [{"role": "user", "content": "\\udfff"}], "timestamp": 1}',
            "invalid_unicode",
        ),
        (b'{"prompt": "p", "session_id": "\\ud83d", "timestamp": 1}', "invalid_unicode"),
        (b'{"prompt": "p", "timestamp": 1, "\\ud800": 1}', "invalid_unicode"),
        (
            b'{"prompt": "p", "timestamp": 1, "output_length": 99999999999999999999999}',
            "out_of_range",
        ),
        (b'{"prompt": "p", "timestamp": 99999999999999999999999999}', "implausible_timestamp"),
        (
            b'{"prompt": "p", "timestamp": 9223372036854775808}',
            "implausible_timestamp",
        ),  # > int64 ns
        (b'{"prompt": "p", "timestamp": 1e308}', "implausible_timestamp"),
        (b'{"prompt": "p", "timestamp": 1e400}', "bad_timestamp"),
        (b'{"prompt": "p", "timestamp": "9999-12-31T23:00:00-05:00"}', "implausible_timestamp"),
        (b'{"prompt": "p", "timestamp": "2101-01-01T00:00:00Z"}', "implausible_timestamp"),
        (b'{"prompt": "p", "timestamp": "1985-01-01T00:00:00Z"}', "implausible_timestamp"),
        (b'{"prompt": "p", "timestamp": -5}', "negative_timestamp"),
        (b'{"prompt": "p", "timestamp": "1969-12-31T00:00:00Z"}', "negative_timestamp"),
        (b'{"prompt": "p", "timestamp": "2025-13-01T00:00:00Z"}', "bad_timestamp"),
        (b'{"prompt": "p", "timestamp": NaN}', "bad_timestamp"),
        ({"timestamp": 1}, "no_input"),
        ({"messages": [], **TS}, "invalid_request"),
        ({"messages": 5, **TS}, "wrong_type"),
        ({"messages": json.dumps(USER), **TS}, "wrong_type"),  # messages as a JSON string
        ({"messages": [{"content": "no role"}], **TS}, "invalid_request"),
        ({"messages": [{"role": "wizard", "content": "x"}], **TS}, "invalid_request"),
        ({"messages": [{"role": "user", "content": 5}], **TS}, "wrong_type"),
        ({"messages": [{"role": "user"}], **TS}, "invalid_request"),
        (
            {"messages": [{"role": "user", "content": [{"type": "hologram"}]}], **TS},
            "unsupported_content",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"type": "x"}]}], **TS},
            "invalid_request",
        ),
        ({"messages": USER, "tools": "f", **TS}, "wrong_type"),
        ({"prompt": "", **TS}, "no_input"),
        ({"prompt": 5, **TS}, "wrong_type"),
        ({"input_ids": [1, -2], **TS}, "wrong_type"),
        ({"input_ids": [1, True], **TS}, "wrong_type"),
        ({"input_ids": [2**40], **TS}, "wrong_type"),
        ({"messages": USER, "timestamp": "yesterday"}, "bad_timestamp"),
        ({"messages": USER, "timestamp": True}, "wrong_type"),
        ({"messages": USER, "timestamp": [1]}, "wrong_type"),
        ({"messages": USER, "output": 5, **TS}, "wrong_type"),
        ({"messages": USER, "output_length": -1, **TS}, "out_of_range"),
        ({"messages": USER, "output_length": 2.5, **TS}, "wrong_type"),
        ({"messages": USER, "session_id": {"a": 1}, **TS}, "wrong_type"),
    ],
)
def test_bad_records_are_rejected_with_a_reason(record, expected):
    assert reason(record) == expected


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=30,
)
VALID = {
    "timestamp": 1_700_000_000_000,
    "session_id": "s",
    "output_length": 5,
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
}


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_arbitrary_json_is_parsed_or_rejected_never_crashes(value):
    line = json.dumps(value).encode("utf-8", errors="surrogatepass")
    try:
        parse(line)
    except Rejected as err:
        assert err.reason and err.message


def _mutations():
    paths = [
        ("timestamp",),
        ("session_id",),
        ("output_length",),
        ("messages",),
        ("messages", 0),
        ("messages", 1, "content"),
        ("messages", 1, "role"),
    ]
    return st.tuples(
        st.sampled_from(paths), JSON | st.sampled_from(["\ud800", 2**70, -1, 1e308, None])
    )


@settings(max_examples=300, deadline=None)
@given(_mutations())
def test_mutated_valid_records_are_parsed_or_rejected_never_crash(mutation):
    path, value = mutation
    record = json.loads(json.dumps(VALID))
    holder = record
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    line = json.dumps(record).encode("utf-8", errors="surrogatepass")
    try:
        request = parse(line)
    except Rejected as err:
        assert err.reason
        return
    # What is accepted is usable downstream: encodable text, int64-safe numbers.
    assert 0 <= request.timestamp_ms < 2**63 and (request.output_length or 0) < 2**31
    json.dumps(request.messages, ensure_ascii=False).encode("utf-8")
    if request.session is not None:
        request.session.encode("utf-8")


def test_an_anthropic_system_list_is_joined_as_vllm_joins_it():
    record = {
        **TS,
        "system": [
            {"type": "text", "text": "You are brief. "},
            {"type": "text", "text": "x-anthropic-billing-header: cc=1;"},
            {"type": "text", "text": ""},
            {"type": "text", "text": "Be kind."},
        ],
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "a"},
                    {"type": "thinking", "thinking": "b"},
                    {"type": "text", "text": "ok"},
                ],
            },
        ],
    }
    messages = parse(record).messages
    assert messages[0] == {"role": "system", "content": "You are brief. Be kind."}
    assert messages[2]["reasoning_content"] == "ab"


def test_a_system_or_developer_message_the_template_leaves_out_is_marked():
    from kvtrace.transforms.encode.encode_requests import MESSAGE_NOT_RENDERED, unrendered

    request = parse(
        {
            **TS,
            "messages": [
                {"role": "developer", "content": "Answer in French."},
                {"role": "user", "content": "hi"},
            ],
        }
    )
    assert MESSAGE_NOT_RENDERED in unrendered(request, "<user>hi</user>").defaulted
    kept = unrendered(request, "<dev>Answer in French.</dev><user>hi</user>")
    assert MESSAGE_NOT_RENDERED not in kept.defaulted


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["list", "dict"]), st.integers(0, 2)),
        min_size=1,
        max_size=MAX_NESTING_DEPTH + 6,
    ),
    st.sampled_from(["", "x", 1, None]),
)
def test_the_depth_check_rejects_exactly_what_the_full_walk_rejects(shape, leaf):
    """check_tree without strings (the orjson path) walks containers a level at a time; it must
    reject exactly the values the full walk rejects as too deep."""
    value: object = leaf
    for kind, siblings in shape:  # innermost first; siblings are shallow neighbours
        value = (
            [value, *[[]] * siblings]
            if kind == "list"
            else {"k": value, **{f"s{i}": {} for i in range(siblings)}}
        )

    def verdict(check_strings: bool) -> str:
        try:
            check_tree(value, check_strings)
        except Rejected as err:
            return err.reason
        return "ok"

    assert verdict(False) == verdict(True)


def test_a_record_of_more_containers_than_its_parse_may_cost_is_too_large_unparsed():
    """`[],` is 3 bytes of JSON and ~64 of Python: a record's brackets are counted before it is
    parsed, so many empty containers cost their bytes, not 21 x them."""
    from kvtrace.transforms.read.records import CONTAINERS_BOUND_MULTIPLE, PARSED_CONTAINER_BYTES

    bound = 1 << 16
    most = CONTAINERS_BOUND_MULTIPLE * bound // PARSED_CONTAINER_BYTES  # brackets a record may hold

    def record(lists: int) -> bytes:  # lists, the junk list and the record itself
        return b'{"timestamp": 1, "prompt": "hi", "junk": [' + b",".join([b"[]"] * lists) + b"]}"

    options = ParseOptions(max_record_bytes=bound)
    assert parse_record(record(most - 2), "s", options).prompt == "hi"
    with pytest.raises(Rejected) as refused:
        parse_record(record(most - 1), "s", options)
    assert refused.value.reason == "too_large" and "JSON objects and lists" in str(refused.value)


@pytest.mark.parametrize("calls", [1, 40])
def test_tool_call_arguments_together_are_held_to_the_record_s_container_bound(calls):
    """Containers inside arguments strings are text to the line's count; parsed, they are held
    to the record's bound all together, one text or many small ones, before each is parsed."""
    from kvtrace.transforms.read.records import record_containers

    bound = 1 << 16
    each = record_containers(bound) // calls + 1  # together one over the bound
    arguments = json.dumps({"a": [[]] * (each - 2)})
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    turn = {"role": "assistant", "content": None, "tool_calls": [call] * calls}
    record = {**TS, "messages": [*USER, turn]}
    with pytest.raises(Rejected) as refused:
        parse(record, max_record_bytes=bound)
    assert refused.value.reason == "too_large" and "inside a string" in str(refused.value)
    assert parse(record, max_record_bytes=2 * bound).messages[1]["tool_calls"]


# ---- a null field is not given; a reader reads only declared fields ---------------------------

CALL = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
WITH_CALLS = [*USER, {"role": "assistant", "content": "ok", "tool_calls": [CALL]}]
ANTHROPIC_TOOL = {"name": "g", "input_schema": {"properties": {}}}


def test_a_null_system_or_input_schema_does_not_make_a_request_anthropic():
    openai = parse({"messages": WITH_CALLS, **TS})
    assert parse({"messages": WITH_CALLS, "system": None, **TS}).messages == openai.messages
    assert openai.messages[1]["tool_calls"]  # the Anthropic reader would have dropped them
    assert parse({"messages": USER, "system": "s", **TS}).messages[0]["role"] == "system"


def test_a_null_field_does_not_decide_the_kind_of_request():
    assert parse({"messages": None, "prompt": "p", **TS}).kind == "prompt"
    assert parse({"prompt": None, "input_ids": [1], **TS}).kind == "tokens"
    assert reason({"messages": None, **TS}) == "no_input"


def test_litellm_tools_decide_anthropic_as_the_same_tools_in_a_request_envelope():
    envelope = parse({"request": {"messages": USER, "tools": [ANTHROPIC_TOOL]}, **TS})
    litellm = parse(
        {"messages": USER, "model_parameters": {"tools": [ANTHROPIC_TOOL]}, "startTime": 1.7e9}
    )
    assert litellm.tools == envelope.tools
    assert litellm.tools[0]["function"]["parameters"]["type"] == "object"


BATCH = {"custom_id": "r", "url": "/v1/completions", "body": {"prompt": "p"}, **TS}


@pytest.mark.parametrize("status", [400, 429, 500, 199])
def test_a_batch_line_the_api_refused_is_a_failed_request(status):
    refused = {"status_code": status, "request_id": "q", "body": {"error": {"code": "x"}}}
    assert reason({**BATCH, "response": refused, "error": None}) == "failed_request"
    served = {"status_code": 200, "request_id": "q", "body": {"usage": {"completion_tokens": 2}}}
    assert parse({**BATCH, "response": served}).output_length == 2


SERVED = {"choices": [{"message": {"content": "a b"}}]}


@pytest.mark.parametrize(
    "outcome",
    [
        {"status": "failure", "error_str": "ContextWindowExceededError"},  # LiteLLM's payload
        {"status": "Failed"},
        {"error_str": "RateLimitError"},
        {"error": {"message": "overloaded"}},
        {"error": "overloaded"},
        {"status_code": 500},
        {"status": 429},
        {"response": {"error": {"code": "context_length_exceeded"}}},
        {"response": {"status": "failed", "output": []}},  # a Responses API response
        {"response": [{"choices": [{"delta": {"content": "a"}}]}, {"error": {"code": 500}}]},
    ],
)
def test_a_logged_call_that_failed_is_a_failed_request_on_any_envelope(outcome):
    """One outcome check for every envelope, as for a Batch line: a failed call served
    nothing, so it is a letter, never a request of output 0."""
    assert reason({"request": {"messages": USER}, "response": SERVED, **TS, **outcome}) == (
        "failed_request"
    )
    assert reason({"messages": USER, **TS, **outcome}) == "failed_request"


@pytest.mark.parametrize(
    "outcome",
    [
        {"status": "success", "error_str": None, "status_code": 200},
        {"status": 201, "error": None},
        {"response": {**SERVED, "status": "completed", "error": None, "object": "response"}},
    ],
)
def test_a_logged_call_that_was_served_is_read(outcome):
    record = {"request": {"messages": USER}, "response": SERVED, **TS, **outcome}
    assert parse(record).kind == "chat"


@pytest.mark.parametrize("kind", ["list", "embedding"])
def test_a_response_no_generation_returns_is_an_unsupported_request(kind):
    """An embeddings call's request reads as a Responses API chat (a string `input`); its
    response says it generated nothing, as a Batch line's endpoint does."""
    response = {"object": kind, "data": [{"object": "embedding", "embedding": [0.1]}]}
    assert reason({"request": {"input": "hi"}, "response": response, **TS}) == (
        "unsupported_request"
    )


@pytest.mark.parametrize(
    "outcome",
    [
        {"cache_hit": True},  # LiteLLM's logging payload
        {"cache_hit": "True"},  # its spend logs
        {"response": {**SERVED, "cache_hit": "true"}},
    ],
)
def test_a_gateways_cache_hit_is_a_letter_of_its_own(outcome):
    """The gateway answered from its own cache: the engine never saw the request."""
    assert reason({"messages": USER, **TS, **outcome}) == "gateway_cache_hit"


@pytest.mark.parametrize("hit", [False, "False", "", None])
def test_a_call_the_gateways_cache_missed_is_read(hit):
    assert parse({"messages": USER, **TS, "cache_hit": hit}).kind == "chat"


@pytest.mark.parametrize(
    "outcome",
    [
        {"status": 1.5},
        {"status_code": "500"},
        {"error_str": 3},
        {"response": {"object": 1}},
        {"cache_hit": 1},
    ],
)
def test_a_calls_outcome_fields_are_held_to_their_shape(outcome):
    assert reason({"messages": USER, **TS, **outcome}) == "wrong_type"


@pytest.mark.parametrize("value", ["5", [5], {}, True])
def test_a_batch_lines_completion_count_is_held_to_its_shape(value):
    assert reason({**BATCH, "completion_tokens": value}) == "wrong_type"
    assert parse({**BATCH, "completion_tokens": 5}).output_length == 5
    # null is no count: read as absent, as a Parquet row (which cannot tell the two) reads
    null = parse({**BATCH, "completion_tokens": None})
    assert (null.output_length, null.defaulted) == (None, ("output_length",))


CHAT = {"timestamp": 0, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    "fields, cached",
    [
        ({"response": {"usage": {"prompt_tokens_details": {"cached_tokens": 64}}}}, 64),
        ({"response": {"usage": {"input_tokens_details": {"cached_tokens": 32}}}}, 32),  # Responses
        (
            {
                "response": {
                    "type": "message",
                    "content": [],
                    "usage": {"cache_read_input_tokens": 16, "cache_creation_input_tokens": 90},
                }
            },
            16,  # Anthropic: what was read from its cache, not what was written to it
        ),
        ({"num_cached_tokens": 48}, 48),  # vLLM's, beside the request
        ({"response": {"num_cached_tokens": 8}}, 8),
        (  # a stream: the final chunk's usage
            {
                "response": [
                    {"choices": []},
                    {"usage": {"prompt_tokens_details": {"cached_tokens": 5}}},
                ]
            },
            5,
        ),
        ({"response": {"usage": {"prompt_tokens_details": None}}}, None),
        ({}, None),
    ],
)
def test_the_engines_cached_tokens_in_each_response_shape(fields, cached):
    # A generated count beside: a response of usage alone says no output (unread_response).
    assert parse({**CHAT, "output_length": 2, **fields}).cached_tokens == cached


def test_a_batch_output_lines_cached_tokens():
    line = {
        "custom_id": "a",
        "body": {"messages": [{"role": "user", "content": "hi"}]},
        "url": "/v1/chat/completions",
        "response": {
            "status_code": 200,
            "body": {
                "created": 1,
                "usage": {"completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 3}},
            },
        },
    }
    assert parse(line).cached_tokens == 3


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({"response": {"usage": {"prompt_tokens_details": {"cached_tokens": "64"}}}}, "wrong_type"),
        ({"response": {"usage": {"cache_read_input_tokens": 1.5}}}, "wrong_type"),
        ({"num_cached_tokens": True}, "wrong_type"),
        ({"num_cached_tokens": -1}, "out_of_range"),
    ],
)
def test_a_cached_count_of_the_wrong_type_or_range_is_a_dead_letter(fields, reason):
    with pytest.raises(Rejected) as caught:
        parse({**CHAT, **fields})
    assert caught.value.reason == reason


def _copied_without_nulls(value):
    """The rule restated as the copy it was before issue 36: every null object field left out,
    null list elements kept."""
    if isinstance(value, dict):
        return {k: _copied_without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_copied_without_nulls(v) for v in value]
    return value


@settings(max_examples=25)
@given(JSON)
def test_without_nulls_in_place_is_the_copying_rule(value):
    """Left out in place, a level at a time: the same value, key order included, as copying."""
    expected = json.dumps(_copied_without_nulls(value))
    assert json.dumps(without_nulls(value)) == expected


def test_without_nulls_reaches_every_level():
    """A null field under lists and objects many levels down, and in a streamed chunk."""
    deep: dict = {"leaf": None, "kept": 1}
    for _ in range(200):
        deep = {"down": [deep, None], "gone": None}
    chunk = {"choices": [{"delta": {"content": "x"}, "logprobs": None}], "usage": None}
    result = without_nulls({"deep": deep, "response": [chunk]})
    assert result["response"] == [{"choices": [{"delta": {"content": "x"}}]}]
    node = result["deep"]
    for _ in range(200):
        assert set(node) == {"down"} and node["down"][1] is None
        node = node["down"][0]
    assert node == {"kept": 1}


def test_a_null_inside_a_free_form_value_is_kept_and_a_model_fields_is_dropped():
    """A tool's schema, a tool call's input and template variables' values are handed on as sent
    (the template writes their nulls out); every model field's null still reads as absent."""
    schema = {"type": "object", "properties": {"unit": {"default": None}}}
    call = {"type": "tool_use", "id": "t", "name": "f", "input": {"unit": None}}
    record = {
        "model": "m",
        "max_tokens": 5,
        "tools": [{"name": "f", "input_schema": schema, "description": None}],
        "messages": [*USER, {"role": "assistant", "content": [call], "name": None}],
        "chat_template_kwargs": {"enable_thinking": None, "opts": {"a": None}},
        **TS,
    }
    request = parse(record)
    assert request.tools[0]["function"]["parameters"] == schema
    assert request.messages[1]["tool_calls"][0]["function"]["arguments"] == {"unit": None}
    # Free-form below its top level only: a null kwarg reads as unset (as from Parquet).
    assert request.template_kwargs["opts"] == {"a": None}
    assert "enable_thinking" not in request.template_kwargs
    assert "name" not in request.messages[1]


def test_a_responses_input_list_is_a_models_whose_nulls_are_dropped():
    """`input` is free-form only as an object (a tool call's): the Responses API's list of
    items is a model's, its null fields absent."""
    items = [{"role": "user", "content": "hi", "id": None, "type": None}]
    assert parse({"input": items, **TS}).messages == [{"role": "user", "content": "hi"}]


def test_without_nulls_of_no_free_form_fields_drops_them_all():
    """A Parquet row's reading: a struct cannot tell a null from an absent field."""
    row = {"tools": [{"parameters": {"default": None, "type": "object"}}]}
    assert without_nulls(row) == {"tools": [{"parameters": {"type": "object"}}]}


@pytest.mark.parametrize("parameters", [{"n": 2}, {"n": 2.0}, {"echo": True}])
@pytest.mark.parametrize("where", ["top", "request", "model_parameters", "extra_body"])
def test_a_request_of_many_sequences_or_an_echo_is_unsupported(parameters, where):
    """A trace row holds one generated length: wherever the request says it, refused (LiteLLM's
    extra_body too: the fields as the engine received them, chat.request_fields)."""
    if where == "top":
        record = {"messages": USER, **TS, **parameters}
    elif where == "request":
        record = {"request": {"prompt": "hi", **parameters}, **TS}
    elif where == "model_parameters":
        record = {"messages": USER, **TS, "model_parameters": parameters}
    else:
        record = {"messages": USER, **TS, "model_parameters": {"extra_body": parameters}}
    with pytest.raises(Rejected) as caught:
        parse(record)
    assert caught.value.reason == "unsupported_request"
    assert caught.value.message.startswith(next(iter(parameters)) + " ")


@pytest.mark.parametrize(
    "request_",
    [
        {"messages": USER, "best_of": 3},  # Chat Completions declares no best_of
        {"input": "hi", "n": 3, "best_of": 3, "echo": True},  # Responses none of them
        {"system": "Be brief.", "messages": USER, "max_tokens": 5, "n": 3, "echo": True},
    ],
    ids=["chat", "responses", "anthropic"],
)
def test_a_sequence_field_its_api_does_not_declare_is_ignored_as_the_engine_ignores_it(request_):
    assert parse({"request": request_, **TS}).messages


@pytest.mark.parametrize("parameters", [{"n": "2"}, {"best_of": " 3 "}, {"n": "2.0"}])
def test_a_sequence_count_spelled_as_a_string_is_read_as_the_engine_reads_it(parameters):
    with pytest.raises(Rejected) as caught:
        parse({"request": {"prompt": "hi", **parameters}, **TS})
    assert caught.value.reason == "unsupported_request"


@pytest.mark.parametrize(
    "choices",
    [
        [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}],
        [{"text": "a"}, {"text": "b"}],  # no index: each its place
    ],
)
@pytest.mark.parametrize("logged", [{}, {"n": 1}, {"n": "1"}])
def test_a_response_of_many_sequences_is_unsupported_however_the_request_was_logged(
    choices, logged
):
    """The response's own evidence, whatever `n` the log kept (round 22)."""
    record = {"request": {"prompt": "hi", **logged}, "response": {"choices": choices}, **TS}
    assert reason(record) == "unsupported_request"
    stream = [{"choices": [choice]} for choice in choices if "index" in choice]
    if stream:
        assert reason({**record, "response": stream}) == "unsupported_request"


@pytest.mark.parametrize(
    "parameters",
    [{"n": 1}, {"best_of": 1}, {"n": None}, {"echo": False}, {"n": True}, {"n": "1"}, {"n": "x"}],
)
def test_one_sequence_not_echoed_is_read(parameters):
    assert parse({"request": {"prompt": "hi", **parameters}, **TS}).prompt == "hi"


def test_a_litellm_payloads_trace_id_is_its_session_and_no_other_records():
    """LiteLLM's standard logging payload keeps the client's session as `trace_id` (its
    spend-log twin as `session_id`); another log's `trace_id` names no session."""
    payload = {"messages": USER, "model_parameters": {}, "trace_id": "t1", **TS}
    assert parse(payload).session == "t1"
    assert parse({**payload, "session_id": "s"}).session == "s"
    assert parse({"messages": USER, "trace_id": "t1", **TS}).session is None
    assert reason({**payload, "trace_id": 7}) == "wrong_type"


@pytest.mark.parametrize(
    "text",
    [
        "head... (litellm_truncated skipped 2345 chars) ...tail",
        "redacted-by-litellm",
        " redacted-by-litellm\n",
    ],
)
def test_a_request_whose_text_its_logs_writer_altered_is_refused(text):
    """Wherever the marker sits in the request (a message, a tool), never read as text."""
    assert reason({"messages": [{"role": "user", "content": text}], **TS}) == "altered_text"
    tools = [{"type": "function", "function": {"name": "f", "description": text}}]
    assert reason({"request": {"messages": USER, "tools": tools}, **TS}) == "altered_text"


def test_a_marker_named_in_passing_is_text():
    """Only the marker as its writer leaves it: a message that talks about one is read."""
    for text in ("why is my prompt redacted-by-litellm?", "litellm_truncated skipped 5 chars"):
        assert parse({"messages": [{"role": "user", "content": text}], **TS}).kind == "chat"


@pytest.mark.parametrize(
    "response",
    [
        {"id": "r", "model": "m"},  # no usage, no choices, no output
        [{"type": "keepalive"}, {"type": "something"}],
        [{"choices": []}],
    ],
)
def test_a_logged_response_no_reader_reads_is_a_letter_not_a_defaulted_length(response):
    assert reason({"messages": USER, "response": response, **TS}) == "unread_response"


@pytest.mark.parametrize(
    "response",
    [
        {},  # a writer that kept no response (LiteLLM's spend log without it)
        {"choices": [{"message": {"role": "assistant"}}]},  # generated nothing
        {"output": []},
        [{"choices": [{"delta": {"role": "assistant"}}]}],
    ],
)
def test_a_response_holding_an_empty_generation_defaults_its_length(response):
    request = parse({"messages": USER, "response": response, **TS})
    assert request.output_length is None and "output_length" in request.defaulted


# ---- Request fields that change what the engine tokenizes or caches (round 24) ---------------


@pytest.mark.parametrize("where", ["top", "request", "extra_body"])
def test_truncate_prompt_tokens_keeps_the_last_tokens_wherever_the_request_says_it(where):
    fields = {"truncate_prompt_tokens": 32}
    if where == "top":
        record = {"messages": USER, **fields, **TS}
    elif where == "request":
        record = {"request": {"messages": USER, **fields}, **TS}
    else:  # LiteLLM's payload: the engine's own parameters under model_parameters.extra_body
        record = {"messages": USER, "model_parameters": {"extra_body": fields}, **TS}
    assert parse(record).truncate_tokens == 32
    assert parse({"messages": USER, **TS}).truncate_tokens is None


@pytest.mark.parametrize(
    "value, refused",
    [
        (-1, "unsupported_request"),  # the model's length, which no log says
        (0, "invalid_request"),
        (-2, "invalid_request"),
        ("32", "wrong_type"),
        (True, "wrong_type"),
        (1.5, "wrong_type"),
    ],
)
def test_a_truncation_the_engine_cannot_be_followed_in_is_a_letter(value, refused):
    assert reason({"prompt": "p", "truncate_prompt_tokens": value, **TS}) == refused


def test_truncate_prompt_tokens_minus_one_keeps_what_the_engine_counted():
    """-1 cuts to the model's length: the engine's own prompt token count says how long."""
    usage = {"usage": {"prompt_tokens": 40, "completion_tokens": 2}}
    record = {"prompt": "p", "truncate_prompt_tokens": -1, "response": usage, **TS}
    assert parse(record).truncate_tokens == 40


@pytest.mark.parametrize(
    "side, kept, refused",
    [(None, "left", None), ("left", "left", None), ("right", "right", None)]
    + [("middle", None, "invalid_request"), (1, None, "wrong_type")],
)
def test_truncation_side_says_which_end_is_kept(side, kept, refused):
    record = {"prompt": "p", "truncate_prompt_tokens": 4, "truncation_side": side, **TS}
    if refused is None:
        assert parse(record).truncation_side == kept
    else:
        assert reason(record) == refused


RESPONSES_INPUT = {"input": "hello there"}
ANTHROPIC = {"system": "s", "messages": USER, "max_tokens": 5}


@pytest.mark.parametrize(
    "record, special",
    [
        ({"messages": USER}, False),  # a chat's template writes its own special tokens
        ({"messages": USER, "add_special_tokens": True}, True),
        ({"prompt": "p"}, True),  # a completions prompt gets the tokenizer's
        ({"prompt": "p", "add_special_tokens": False}, False),
        ({"input_ids": [1, 2], "add_special_tokens": True}, False),  # ids get none
        ({**RESPONSES_INPUT, "add_special_tokens": True}, False),  # not the API's field
        ({**ANTHROPIC, "add_special_tokens": True}, False),  # not the API's field
    ],
)
def test_add_special_tokens_is_each_apis_default_unless_its_request_says(record, special):
    assert parse({**record, **TS}).add_special_tokens is special


def test_add_special_tokens_of_another_type_is_a_letter():
    assert reason({"prompt": "p", "add_special_tokens": "yes", **TS}) == "wrong_type"


@pytest.mark.parametrize(
    "record, truncate, salt",
    [
        # fields the API's request does not declare: ignored, as the engine ignores them
        # (Anthropic's declares cache_salt, which the engine salts its chat request with)
        ({**ANTHROPIC, "cache_salt": "t", "truncate_prompt_tokens": 4}, None, "t"),
        ({**RESPONSES_INPUT, "truncate_prompt_tokens": 4}, None, None),
        ({**RESPONSES_INPUT, "truncation": "disabled", "cache_salt": "t"}, None, "t"),
        (
            {
                **RESPONSES_INPUT,
                "truncation": "auto",
                "response": {"output": [], "usage": {"input_tokens": 9}},
            },
            9,
            None,
        ),
    ],
)
def test_each_api_reads_only_the_fields_its_request_declares(record, truncate, salt):
    request = parse({**record, **TS})
    assert (request.truncate_tokens, request.cache_salt) == (truncate, salt)


@pytest.mark.parametrize(
    "record, refused",
    [
        ({**RESPONSES_INPUT, "truncation": "auto"}, "unsupported_request"),  # no count logged
        ({**RESPONSES_INPUT, "truncation": "middle"}, "invalid_request"),
        ({**RESPONSES_INPUT, "truncation": True}, "wrong_type"),
        ({"messages": USER, "truncate_prompt_tokens": -1}, "unsupported_request"),
    ],
)
def test_a_truncation_to_a_length_the_log_does_not_say_is_a_letter(record, refused):
    assert reason({**record, **TS}) == refused


def test_a_cache_salt_is_read_as_the_strictest_engine_takes_it():
    assert parse({"messages": USER, "cache_salt": "tenant-a", **TS}).cache_salt == "tenant-a"
    assert parse({"messages": USER, "cache_salt": "a" * 128, **TS}).cache_salt == "a" * 128
    assert parse({"messages": USER, **TS}).cache_salt is None
    for salt in ("", "a" * 129, "a@b", "a/b", "a\\b", "a\x00b"):
        assert reason({"messages": USER, "cache_salt": salt, **TS}) == "invalid_request", salt
    assert reason({"messages": USER, "cache_salt": 7, **TS}) == "wrong_type"


@pytest.mark.parametrize(
    "fields",
    [
        {"previous_response_id": "resp_1"},
        {"conversation": "conv_1"},
        {"conversation": {"id": "conv_1"}},
        {"model_parameters": {"previous_response_id": "resp_1"}},
        {"previous_input_messages": [{"role": "user", "content": "earlier"}]},
        {"previous_response": {"id": "resp_1", "output": []}},
    ],
)
def test_a_request_naming_a_stored_conversation_is_a_stored_context_letter(fields):
    assert reason({"input": "Shorter.", **fields, **TS}) == "stored_context"


# ---- LiteLLM's call types -----------------------------------------------------------------------

PROMPT = "<|im_start|>user\nhi<|im_end|>\n"


@pytest.mark.parametrize(
    "call_type, kind", [("completion", "chat"), ("acompletion", "chat"), (None, "chat")]
)
def test_a_litellm_payloads_chat_call_reads_its_messages(call_type, kind):
    payload = {"messages": USER, "model_parameters": {}, "call_type": call_type, **TS}
    request = parse(payload)
    assert (request.kind, request.messages) == (kind, USER)


@pytest.mark.parametrize("call_type", ["text_completion", "atext_completion"])
def test_a_litellm_payloads_text_completion_is_its_prompt_never_a_chat(call_type):
    wrapped = [{"role": "user", "content": PROMPT}]
    payload = {"messages": wrapped, "model_parameters": {}, "call_type": call_type, **TS}
    request = parse(payload)
    assert (request.kind, request.prompt, request.messages) == ("prompt", PROMPT, None)
    two = {**payload, "messages": [*wrapped, *wrapped]}
    assert reason(two) == "unsupported_request"


@pytest.mark.parametrize("call_type", ["anthropic_messages", "aresponses", "aembedding", "x"])
def test_a_litellm_payload_of_another_call_type_is_a_letter(call_type):
    payload = {"messages": USER, "model_parameters": {}, "call_type": call_type, **TS}
    assert reason(payload) == "unsupported_request"


def test_a_litellm_spend_log_reads_its_request_whatever_its_call_type():
    """The spend log's proxy_server_request is the request as the proxy took it."""
    request = {"system": "Be brief.", "messages": USER, "max_tokens": 5}
    log = {"call_type": "anthropic_messages", "proxy_server_request": request, **TS}
    assert parse(log).messages[0] == {"role": "system", "content": "Be brief."}
    assert reason({**log, "call_type": 5}) == "wrong_type"


# ---- A Responses object's status ----------------------------------------------------------------


@pytest.mark.parametrize(
    "status, refused",
    [
        ("completed", None),
        ("incomplete", None),
        ("queued", "unfinished_response"),
        ("in_progress", "unfinished_response"),
        ("cancelled", "unfinished_response"),
        ("failed", "failed_request"),
    ],
)
def test_a_responses_object_is_read_only_once_finished(status, refused):
    response = {"object": "response", "status": status, "output": [], "usage": None}
    record = {"input": "hi", "response": response, **TS}
    if refused is None:
        parse(record)
    else:
        assert reason(record) == refused


def _streamed_twin() -> tuple[dict, list[dict]]:
    """A streamed chat record (its request) and the chunks its response is."""
    delta = [{"role": "assistant", "content": "Hi"}, {"content": " there"}, {}]
    chunks = [
        {"id": "c", "created": 1, "model": "m", "choices": [{"index": 0, "delta": d}]}
        for d in delta
    ]
    chunks[-1]["choices"][0]["finish_reason"] = "stop"
    chunks.append({"id": "c", "created": 1, "model": "m", "choices": [], "usage": USAGE_3})
    request = {"model": "m", "messages": USER, "stream": True}
    return {**TS, "request": request}, chunks


USAGE_3 = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}


def _read_alike(text_record: dict, twin: dict) -> Request:
    """The Request of a record keeping its bodies as text, once checked to read as its twin's
    (but for the line each came from)."""
    read, expected = parse(text_record), parse(twin)
    assert {**vars(read), "line": b""} == {**vars(expected), "line": b""}
    return read


@pytest.mark.parametrize("separator", ["\n", "\r\n"])
def test_a_response_kept_as_its_event_stream_reads_as_its_chunks(separator):
    """A proxy's raw event stream (data lines, event names, blank lines, DONE last) is the
    list of its chunks."""
    record, chunks = _streamed_twin()
    events = "".join(
        f"event: chunk{separator}data: {json.dumps(c)}{separator}{separator}" for c in chunks
    )
    text = {**record, "response": events + f"data: [DONE]{separator}{separator}"}
    assert _read_alike(text, {**record, "response": chunks}).output_length == 3


def test_bodies_kept_as_json_text_read_as_their_objects():
    """A spend-log row's JSON columns as text: the request object, the response object or
    list."""
    request = {"model": "m", "messages": USER}
    response = {"choices": [{"message": {"content": "Hi"}, "finish_reason": "stop"}]}
    response["usage"] = USAGE_3
    row = {**TS, "proxy_server_request": request, "response": response}
    as_text = {**row, "proxy_server_request": json.dumps(request), "response": json.dumps(response)}
    assert _read_alike(as_text, row).output_length == 3
    record, chunks = _streamed_twin()
    assert _read_alike({**record, "response": json.dumps(chunks)}, {**record, "response": chunks})


@pytest.mark.parametrize(
    "response",
    [
        "Noon.",  # plain text
        '"a JSON string"',
        "[1, 2",  # not JSON
        "data: {}\n\n",  # no DONE
        'data: {"a": 1}\nid: 3\ndata: [DONE]',  # a line of another kind
        "data: [1]\ndata: [DONE]",  # a chunk not an object
        "data: [DONE]\ndata: {}",  # DONE not last
    ],
)
def test_a_response_string_that_is_no_body_text_stays_a_wrong_type_letter(response):
    assert reason({**TS, "messages": USER, "response": response}) == "wrong_type"


def test_a_request_text_that_is_no_object_stays_a_letter():
    with pytest.raises(Rejected, match="proxy_server_request is a string"):
        parse({**TS, "proxy_server_request": json.dumps([USER])})


def test_body_texts_are_held_to_the_record_s_container_bound():
    """A decoded body's containers count against the record's one bound, with its tool-call
    arguments: they are text to the line's count."""
    from kvtrace.transforms.read.records import record_containers

    bound = 1 << 16
    request = {"model": "m", "messages": USER, "junk": [[]] * record_containers(bound)}
    record = {**TS, "request": json.dumps(request)}
    with pytest.raises(Rejected) as refused:
        parse(record, max_record_bytes=bound)
    assert refused.value.reason == "too_large" and "inside a string" in str(refused.value)
    events = f"data: {json.dumps({'junk': [[]] * record_containers(bound)})}\n\ndata: [DONE]"
    assert reason({**TS, "messages": USER, "response": events}, max_record_bytes=bound) == (
        "too_large"
    )


def test_a_batch_line_s_body_kept_as_json_text_reads_as_its_object():
    body = {"model": "m", "messages": USER}
    answer = {"created": 1, "choices": [{"message": {"content": "Hi"}}], "usage": USAGE_3}
    line = {"custom_id": "r1", "url": "/v1/chat/completions", "response": {"body": answer}}
    read = _read_alike({**line, "body": json.dumps(body)}, {**line, "body": body})
    assert read.output_length == 3
