"""The template variables each API resolves for a request (chat.chat_completions_settings,
responses_settings, anthropic_settings), as the serving engine's request models resolve them,
each field honoured with the engine's type or a letter with its reason."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.chat import (
    ANTHROPIC_EFFORTS,
    REASONING_EFFORTS,
    TEMPLATE_FIELDS,
    anthropic_settings,
    chat_completions_settings,
    request_fields,
    responses_settings,
)
from kvtrace.transforms.read.records import ParseOptions, parse_record

MESSAGES = [{"role": "user", "content": "hi"}]
GOOD: dict[str, Any] = {
    "add_generation_prompt": False,
    "continue_final_message": False,
    "documents": [{"title": "t", "text": "x"}],
    "reasoning_effort": "low",
}
# What a Chat Completions request without template fields renders with: the engine's defaults.
DEFAULTS = {"add_generation_prompt": True, "continue_final_message": False}
template_settings = chat_completions_settings


def _reason(body: dict[str, Any], settings=chat_completions_settings) -> str:
    with pytest.raises(Rejected) as caught:
        settings(body)
    return caught.value.reason


def test_a_request_without_settings_renders_with_the_engines_defaults():
    assert template_settings({"messages": MESSAGES}) == DEFAULTS


def test_the_list_is_the_one_tested():
    assert set(TEMPLATE_FIELDS) == set(GOOD)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_each_field_is_honoured_top_level(name):
    assert template_settings({name: GOOD[name]})[name] == GOOD[name]


@pytest.mark.parametrize("name", ["documents", "reasoning_effort"])
def test_an_unset_field_leaves_the_kwarg_of_its_name(name):
    assert template_settings({"chat_template_kwargs": {name: GOOD[name]}})[name] == GOOD[name]


@pytest.mark.parametrize("name", ["add_generation_prompt", "continue_final_message"])
def test_the_top_level_fields_override_the_kwargs_even_unset(name):
    """Their defaults (true, false) are set values: the engine merges them over the kwargs."""
    flipped = not DEFAULTS[name]
    assert template_settings({"chat_template_kwargs": {name: flipped}})[name] == DEFAULTS[name]
    both = {name: DEFAULTS[name], "chat_template_kwargs": {name: flipped}}
    assert template_settings(both)[name] == DEFAULTS[name]


def test_a_top_level_reasoning_effort_overrides_the_kwarg():
    body = {"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}}
    assert template_settings(body)["reasoning_effort"] == "low"


@pytest.mark.parametrize("name", sorted(GOOD))
def test_a_wrong_type_is_a_letter(name):
    wrong = "yes" if TEMPLATE_FIELDS[name] is not str else 1
    assert _reason({name: wrong}) == "wrong_type"
    if name not in DEFAULTS:
        assert _reason({"chat_template_kwargs": {name: wrong}}) == "wrong_type"


@pytest.mark.parametrize("settings", [chat_completions_settings, anthropic_settings])
@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_a_kwarg_every_api_overrides_is_never_checked(name, settings):
    """The generation prompt's two kwargs never reach the template: whatever they hold, the
    request is served with its API's values."""
    body = {"messages": MESSAGES, "chat_template_kwargs": {name: "yes"}}
    assert settings(body)[name] == DEFAULTS[name]
    assert responses_settings({"input": "hi", **body})[name] == DEFAULTS[name]


def test_the_request_kwargs_are_template_variables_of_any_name():
    kwargs = {"enable_thinking": False, "custom": {"a": [1]}}
    assert template_settings({"chat_template_kwargs": kwargs}) == kwargs | DEFAULTS


@pytest.mark.parametrize(
    "effort, thinking", [("none", False), ("low", True), ("high", True), ("minimal", True)]
)
def test_a_reasoning_effort_turns_thinking_on_unless_none(effort, thinking):
    chat = template_settings({"reasoning_effort": effort})
    assert (chat["reasoning_effort"], chat["enable_thinking"]) == (effort, thinking)
    responses = responses_settings({"input": "hi", "reasoning": {"effort": effort}})
    assert (responses["reasoning_effort"], responses["enable_thinking"]) == (effort, thinking)
    if effort in ANTHROPIC_EFFORTS:
        anthropic = anthropic_settings({"messages": MESSAGES, "output_config": {"effort": effort}})
        assert (anthropic["reasoning_effort"], anthropic["enable_thinking"]) == (effort, thinking)


@pytest.mark.parametrize("effort", ["banana", "auto", "None", "minimal", "none"])
def test_an_effort_the_apis_model_does_not_take_is_a_letter(effort):
    """Each API's efforts as its request model declares them; the engine refuses any other."""
    anthropic = {"messages": MESSAGES, "output_config": {"effort": effort}}
    assert _reason(anthropic, anthropic_settings) == "invalid_request"
    for body, settings in (
        ({"reasoning_effort": effort}, chat_completions_settings),
        ({"input": "hi", "reasoning": {"effort": effort}}, responses_settings),
    ):
        if effort in REASONING_EFFORTS:
            assert settings(body)["reasoning_effort"] == effort
        else:
            assert _reason(body, settings) == "invalid_request"
    assert REASONING_EFFORTS == ANTHROPIC_EFFORTS | {"none", "minimal"}
    assert {"low", "medium", "high", "xhigh", "max"} == ANTHROPIC_EFFORTS


def test_the_requests_own_enable_thinking_wins_over_its_effort():
    own = {"chat_template_kwargs": {"enable_thinking": True}}
    assert template_settings({**own, "reasoning_effort": "none"})["enable_thinking"] is True
    body = {**own, "input": "hi", "reasoning": {"effort": "none"}}
    assert responses_settings(body)["enable_thinking"] is True


@pytest.mark.parametrize("unset", [None, "auto"])
def test_a_kwarg_the_engine_reads_as_unset_is_left_to_the_run(unset):
    """None and "auto" are unset kwargs: the run's value stands; named at all, enable_thinking
    is the server's too, whatever the request's effort."""
    own = {"chat_template_kwargs": {"enable_thinking": unset, "documents": unset}}
    assert template_settings(own) == DEFAULTS
    settings = template_settings({**own, "reasoning_effort": "low"})
    assert settings == DEFAULTS | {"reasoning_effort": "low"}
    body = {**own, "input": "hi", "reasoning": {"effort": "none"}}
    assert "enable_thinking" not in responses_settings(body)


def test_a_kwarg_reasoning_effort_alone_leaves_thinking_to_the_template():
    assert "enable_thinking" not in template_settings(
        {"chat_template_kwargs": {"reasoning_effort": "none"}}
    )


def test_the_responses_reasoning_effort_is_reasoning_effort():
    settings = responses_settings({"input": "hi", "reasoning": {"summary": "auto"}})
    assert settings == DEFAULTS
    assert _reason({"reasoning": "high"}, responses_settings) == "wrong_type"
    assert _reason({"reasoning": {"effort": 3}}, responses_settings) == "wrong_type"


def _partial(status: str, kind: str = "message") -> dict[str, Any]:
    item = {"type": kind, "id": "i", "status": status, "role": "assistant"}
    return item | {"content": [{"type": "output_text", "text": "The", "annotations": []}]}


@pytest.mark.parametrize("kind", ["message", "reasoning"])
@pytest.mark.parametrize("status", ["in_progress", "incomplete"])
def test_a_responses_input_ending_in_a_partial_item_is_continued(kind, status):
    body = {"input": [{"role": "user", "content": "hi"}, _partial(status, kind)]}
    assert responses_settings(body) == {
        "add_generation_prompt": False,
        "continue_final_message": True,
    }


@pytest.mark.parametrize(
    "items",
    [
        "hi",
        [_partial("completed")],
        [_partial("incomplete"), {"role": "user", "content": "go on"}],
        [{"type": "function_call_output", "call_id": "c", "output": "x", "status": "incomplete"}],
    ],
)
def test_any_other_responses_input_gets_a_generation_prompt(items):
    assert responses_settings({"input": items}) == DEFAULTS


def test_responses_and_anthropic_ignore_the_chat_fields_they_do_not_declare():
    stray = {"add_generation_prompt": False, "documents": [{"a": "b"}], "chat_template": "x"}
    assert responses_settings({"input": "hi", **stray}) == DEFAULTS
    assert anthropic_settings({"messages": MESSAGES, **stray}) == DEFAULTS
    # Their chat_template_kwargs are read, under the engine's own two fields.
    kwargs = {"enable_thinking": False, "add_generation_prompt": False}
    body = {"messages": MESSAGES, "chat_template_kwargs": kwargs}
    assert anthropic_settings(body) == {"enable_thinking": False, **DEFAULTS}


def test_anthropic_thinking_turned_off_is_a_letter():
    """Its effort is the server's pick (a probe of its template, or its option)."""
    body = {"messages": MESSAGES, "thinking": {"type": "disabled"}}
    assert _reason(body, anthropic_settings) == "unsupported_request"
    enabled = {"messages": MESSAGES, "thinking": {"type": "enabled", "budget_tokens": 2048}}
    assert anthropic_settings(enabled) == DEFAULTS


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
    assert plain.template_kwargs == DEFAULTS
    own = {**record, "chat_template_kwargs": {"enable_thinking": False}}
    request = parse_record(json.dumps(own).encode(), "t", options)
    assert request.template_kwargs == {"enable_thinking": False, **DEFAULTS}
    with pytest.raises(Rejected) as caught:
        parse_record(json.dumps({**record, "chat_template": "x"}).encode(), "t", options)
    assert caught.value.reason == "untrusted_template"


def test_a_gateways_payload_sets_them_in_its_parameters_and_their_extra_body():
    off, on = {"enable_thinking": False}, {"enable_thinking": True}
    payload = {"messages": MESSAGES, "model_parameters": {"chat_template_kwargs": off}}
    assert template_settings(request_fields(payload, payload)) == off | DEFAULTS
    # The client sends extra_body's fields over the parameters of the same name.
    both = {"chat_template_kwargs": on, "extra_body": {"chat_template_kwargs": off}}
    payload["model_parameters"] = both
    assert template_settings(request_fields(payload, payload)) == off | DEFAULTS
    # A request logged beside its envelope is read as logged; so are a payload's own fields.
    record = {"request": {"messages": MESSAGES}, "model_parameters": both}
    assert request_fields(record, record["request"]) is record["request"]
    own = {**payload, "reasoning_effort": "low", "model_parameters": {"reasoning_effort": "high"}}
    settings = template_settings(request_fields(own, own))
    assert settings["reasoning_effort"] == "low"


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
    assert template_settings(body) == {"x": [None], **DEFAULTS}


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
    assert [r.template_kwargs for r in jsonl] == [{"a": 1, **DEFAULTS}, {"a": 2, **DEFAULTS}]
