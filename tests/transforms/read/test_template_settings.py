"""chat.template_settings: the closed list of request fields the serving engine hands its chat
template, each honoured with the engine's type or a letter with its reason."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.chat import TEMPLATE_FIELDS, request_fields, template_settings
from kvtrace.transforms.read.records import ParseOptions, parse_record

MESSAGES = [{"role": "user", "content": "hi"}]
GOOD: dict[str, Any] = {
    "add_generation_prompt": False,
    "continue_final_message": False,
    "documents": [{"title": "t", "text": "x"}],
    "reasoning_effort": "low",
}


def _reason(body: dict[str, Any]) -> str:
    with pytest.raises(Rejected) as caught:
        template_settings(body)
    return caught.value.reason


def test_a_request_without_settings_sets_nothing():
    assert template_settings({"messages": MESSAGES}) == {}


def test_the_list_is_the_one_tested():
    assert set(TEMPLATE_FIELDS) == set(GOOD)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_each_field_is_honoured_top_level_and_inside_the_kwargs(name):
    assert template_settings({name: GOOD[name]}) == {name: GOOD[name]}
    assert template_settings({"chat_template_kwargs": {name: GOOD[name]}}) == {name: GOOD[name]}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_a_wrong_type_is_a_letter(name):
    wrong = "yes" if TEMPLATE_FIELDS[name] is not str else 1
    assert _reason({name: wrong}) == "wrong_type"
    assert _reason({"chat_template_kwargs": {name: wrong}}) == "wrong_type"


def test_the_request_kwargs_are_template_variables_of_any_name():
    kwargs = {"enable_thinking": False, "custom": {"a": [1]}}
    assert template_settings({"chat_template_kwargs": kwargs}) == kwargs


def test_the_responses_reasoning_effort_is_reasoning_effort():
    assert template_settings({"reasoning": {"effort": "high"}}) == {"reasoning_effort": "high"}
    assert template_settings({"reasoning": {"summary": "auto"}}) == {}
    assert _reason({"reasoning": "high"}) == "wrong_type"
    assert _reason({"reasoning": {"effort": 3}}) == "wrong_type"


@pytest.mark.parametrize(
    "body", [{"chat_template": "{{ messages }}"}, {"chat_template_kwargs": {"chat_template": "x"}}]
)
def test_a_requests_own_template_is_untrusted(body):
    assert _reason(body) == "untrusted_template"


@pytest.mark.parametrize(
    "body, reason",
    [
        ({"chat_template_kwargs": [1]}, "wrong_type"),
        ({"chat_template_kwargs": {"tokenize": True}}, "invalid_request"),
        ({"chat_template_kwargs": {"tools": []}}, "invalid_request"),
        ({"chat_template_kwargs": {f"k{i}": 1 for i in range(65)}}, "too_large"),
        ({"continue_final_message": True}, "invalid_request"),  # add_generation_prompt: true
        ({"documents": ["a"]}, "wrong_type"),
        ({"documents": [{"text": 1}]}, "wrong_type"),
        (
            {"add_generation_prompt": True, "chat_template_kwargs": {"add_generation_prompt": 0}},
            "wrong_type",
        ),
        (
            {"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}},
            "invalid_request",
        ),
    ],
)
def test_what_the_engine_refuses_is_a_letter(body, reason):
    assert _reason(body) == reason


def test_continuing_the_final_message_needs_no_generation_prompt():
    body = {"continue_final_message": True, "add_generation_prompt": False}
    assert template_settings(body) == body


def test_the_parsed_request_carries_its_settings_and_a_refusal_is_its_letter():
    record = {"timestamp": 0, "messages": MESSAGES, "output_length": 1}
    options = ParseOptions()
    plain = parse_record(json.dumps(record).encode(), "t", options)
    assert plain.template_kwargs is None
    own = {**record, "chat_template_kwargs": {"enable_thinking": False}}
    request = parse_record(json.dumps(own).encode(), "t", options)
    assert request.template_kwargs == {"enable_thinking": False}
    with pytest.raises(Rejected) as caught:
        parse_record(json.dumps({**record, "chat_template": "x"}).encode(), "t", options)
    assert caught.value.reason == "untrusted_template"


def test_a_gateways_payload_sets_them_in_its_parameters_and_their_extra_body():
    off, on = {"enable_thinking": False}, {"enable_thinking": True}
    payload = {"messages": MESSAGES, "model_parameters": {"chat_template_kwargs": off}}
    assert template_settings(request_fields(payload, payload)) == off
    # The client sends extra_body's fields over the parameters of the same name.
    both = {"chat_template_kwargs": on, "extra_body": {"chat_template_kwargs": off}}
    payload["model_parameters"] = both
    assert template_settings(request_fields(payload, payload)) == off
    # A request logged beside its envelope is read as logged; so are a payload's own fields.
    record = {"request": {"messages": MESSAGES}, "model_parameters": both}
    assert request_fields(record, record["request"]) is record["request"]
    own = {**payload, "reasoning_effort": "low", "model_parameters": {"reasoning_effort": "high"}}
    assert template_settings(request_fields(own, own)) == {"reasoning_effort": "low"}


def test_a_gateways_extra_body_not_an_object_is_a_letter():
    payload = {"messages": MESSAGES, "model_parameters": {"extra_body": "x"}}
    with pytest.raises(Rejected) as caught:
        request_fields(payload, payload)
    assert caught.value.reason == "wrong_type"


@pytest.mark.parametrize("name", ["enable_thinking", "tools", "add_generation_prompt"])
def test_a_null_kwarg_is_unset_and_a_null_inside_one_is_its_value(name):
    """Free-form only below its top level: a null kwarg reads as absent, as a Parquet row
    (which cannot tell the two apart) reads it; a null inside a kwarg's value stays."""
    body = {"add_generation_prompt": True, "chat_template_kwargs": {name: None, "x": [None]}}
    assert template_settings(body) == {"add_generation_prompt": True, "x": [None]}


def test_a_null_kwarg_reads_alike_from_jsonl_and_its_parquet_twin(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from helpers import records_of
    from kvtrace.transforms.read.sources import FileRange, parse_one

    rows = [
        {"timestamp": 0, "messages": MESSAGES, "chat_template_kwargs": {"tools": None, "a": 1}},
        {"timestamp": 1, "messages": MESSAGES, "chat_template_kwargs": {"tools": None, "a": 2}},
    ]
    jsonl = [parse_one("t", json.dumps(row).encode(), ParseOptions()) for row in rows]
    path = tmp_path / "twin.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    parquet = [
        parse_one("t", row, ParseOptions())
        for _, row in records_of(FileRange(str(path), 0, None), 1 << 20)
    ]
    assert [r.template_kwargs for r in jsonl] == [r.template_kwargs for r in parquet]
    assert [r.template_kwargs for r in jsonl] == [{"a": 1}, {"a": 2}]
