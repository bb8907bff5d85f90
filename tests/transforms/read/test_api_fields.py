"""records.API_FIELDS: every request field each API declares in the serving engine (0.33.0's
request models, by name) is read, a letter, or named as leaving the prompt alone, so a field
cannot slip through unread."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.records import (
    ANTHROPIC,
    API_FIELDS,
    CHAT_COMPLETIONS,
    COMPLETIONS,
    RESPONSES,
    parse_record,
)

# The fields each API's request model declares in the engine kvtrace follows (0.33.0:
# ChatCompletionRequest, CompletionRequest, ResponsesRequest, AnthropicMessagesRequest).
DECLARED = {
    CHAT_COMPLETIONS: """messages model frequency_penalty logit_bias logprobs top_logprobs
        max_tokens max_completion_tokens n presence_penalty response_format seed stop stream
        stream_options temperature top_p tools tool_choice reasoning_effort thinking_token_budget
        include_reasoning parallel_tool_calls user use_beam_search top_k min_p repetition_penalty
        watermarking length_penalty stop_token_ids include_stop_str_in_output ignore_eos
        min_tokens skip_special_tokens spaces_between_special_tokens truncate_prompt_tokens
        truncation_side prompt_logprobs logprob_token_ids allowed_token_ids bad_words echo
        add_generation_prompt continue_final_message add_special_tokens documents chat_template
        chat_template_kwargs media_io_kwargs mm_processor_kwargs structured_outputs priority
        request_id session_id return_tokens_as_token_ids return_token_ids return_weight_versions
        routed_experts_prompt_start return_token_offsets return_prompt_text mm_payload
        return_mm_kwargs cache_salt kv_transfer_params ec_transfer_params vllm_xargs
        repetition_detection stream_interval""",
    COMPLETIONS: """model prompt echo frequency_penalty logit_bias logprobs max_tokens n
        presence_penalty seed stop stream stream_options suffix temperature top_p user
        use_beam_search top_k min_p repetition_penalty watermarking length_penalty stop_token_ids
        include_stop_str_in_output ignore_eos min_tokens skip_special_tokens
        spaces_between_special_tokens truncate_prompt_tokens truncation_side allowed_token_ids
        prompt_logprobs logprob_token_ids bad_words prompt_embeds add_special_tokens
        response_format structured_outputs priority request_id session_id
        return_tokens_as_token_ids return_token_ids return_weight_versions
        routed_experts_prompt_start return_token_offsets mm_payload return_mm_kwargs cache_salt
        kv_transfer_params ec_transfer_params vllm_xargs repetition_detection
        thinking_token_budget stream_interval""",
    RESPONSES: """background include input instructions max_output_tokens max_tool_calls
        metadata model logit_bias parallel_tool_calls previous_response_id prompt reasoning
        include_reasoning service_tier store stream temperature text tool_choice tools
        top_logprobs top_p top_k min_p truncation user skip_special_tokens
        spaces_between_special_tokens include_stop_str_in_output presence_penalty
        frequency_penalty prompt_cache_key prompt_cache_options prompt_cache_retention
        safety_identifier watermarking request_id session_id media_io_kwargs mm_processor_kwargs
        priority mm_payload return_mm_kwargs cache_salt enable_response_messages
        previous_input_messages structured_outputs repetition_penalty seed stop stop_token_ids
        ignore_eos vllm_xargs kv_transfer_params ec_transfer_params chat_template_kwargs""",
    ANTHROPIC: """model messages max_tokens metadata output_config thinking stop_sequences
        stream system temperature tool_choice tools top_k top_p mm_payload return_mm_kwargs
        cache_salt watermarking kv_transfer_params ec_transfer_params vllm_xargs
        chat_template_kwargs""",
}
TS = {"timestamp": 0, "output_length": 1}


def _reason(record: dict[str, Any]) -> str:
    with pytest.raises(Rejected) as caught:
        parse_record(json.dumps({**record, **TS}).encode(), "t")
    return caught.value.reason


def test_the_table_has_a_row_for_each_api_and_no_other():
    assert set(API_FIELDS) == set(DECLARED)


@pytest.mark.parametrize("api", sorted(DECLARED))
def test_every_declared_field_is_read_or_named_as_leaving_the_prompt_alone(api):
    row = API_FIELDS[api]
    assert set(DECLARED[api].split()) - set(row.reads) - row.leaves == set()


@pytest.mark.parametrize("api", sorted(DECLARED))
def test_no_field_is_both_read_and_left_alone(api):
    row = API_FIELDS[api]
    assert set(row.reads) & row.leaves == set()


def test_each_chat_api_resolves_its_own_template_settings():
    settings = [API_FIELDS[api].settings for api in (CHAT_COMPLETIONS, RESPONSES, ANTHROPIC)]
    assert None not in settings and len(set(settings)) == 3
    assert API_FIELDS[COMPLETIONS].settings is None


@pytest.mark.parametrize(
    "record, reason",
    [
        ({"input": "hi", "prompt": {"id": "pmpt_1"}}, "stored_context"),
        ({"input": "hi", "previous_response_id": "resp_1"}, "stored_context"),
        ({"prompt": "def f():", "suffix": "\n    return 1\n"}, "unsupported_request"),
        ({"prompt": "p", "prompt_embeds": "AAAA"}, "unsupported_request"),
    ],
)
def test_a_field_whose_prompt_the_log_does_not_hold_is_a_letter(record, reason):
    assert _reason(record) == reason


def test_a_field_another_api_declares_is_ignored():
    """`prompt` names a stored template on Responses alone; `suffix` is the Completions API's."""
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    for record in ({**chat, "suffix": "x"}, {**chat, "prompt_embeds": "AAAA"}):
        assert parse_record(json.dumps({**record, **TS}).encode(), "t").kind == "chat"
