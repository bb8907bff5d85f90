"""A response's generation counted as the engine generated it where the log holds no usage
(output_turn.py): through the run's chat template (Qwen3's tool call and plain turn,
DeepSeek-R1's reasoning turn, which its template leaves out), and without a template (the
completions API) as its text and the stop token it ended at."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvtrace.transforms.encode.blocks import TOKEN_DTYPE, token_bytes
from kvtrace.transforms.encode.encode_requests import EncodeOptions, RequestEncoder
from kvtrace.transforms.encode.output_turn import (
    common_prefix,
    generated_length,
    reasoning_marker,
    through_end_of_turn,
)
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.tokenize import encode_texts, load_tokenizer
from kvtrace.transforms.read.records import parse_record

QUESTION = [{"role": "user", "content": "When is high tide in Kyoto?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_tide",
            "description": "The day's high tide at a place",
            "parameters": {"type": "object", "properties": {"place": {"type": "string"}}},
        },
    }
]
CALL = {
    "id": "call_a",
    "type": "function",
    "function": {"name": "get_tide", "arguments": '{"place": "Kyoto"}'},
}


def _lengths(tokenizer: str, *records: dict[str, Any]) -> list[int]:
    """Each record's output length as the encoder exports it."""
    encoder = RequestEncoder(
        load_tokenizer(tokenizer),
        b"s" * 16,
        EncodeOptions(tokenizer, SaltSource("random"), block_size=16),
    )
    requests = [
        parse_record(json.dumps({"timestamp": 1 + i, **r}).encode(), "src")
        for i, r in enumerate(records)
    ]
    hashed, letters = encoder.encode(requests)
    assert letters == [] and hashed is not None
    return [int(length) for length in hashed.requests["output_length"]]


def _chat(message: dict[str, Any], finish: str = "stop", **request: Any) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
    return {"request": {"messages": QUESTION, **request}, "response": {"choices": [choice]}}


def _count(tokenizer: str, text: str) -> int:
    return len(encode_texts(load_tokenizer(tokenizer), [text])[0])


def test_a_qwen3_tool_call_counts_its_template_markup_and_end_of_turn(qwen3_tokenizer):
    (length,) = _lengths(
        qwen3_tokenizer, _chat({"content": None, "tool_calls": [CALL]}, tools=TOOLS)
    )
    # What the model wrote (its empty think block, as the template renders the last turn), and
    # its end-of-turn token; not the newline the template writes after it.
    written = (
        '<think>\n\n</think>\n\n<tool_call>\n{"name": "get_tide", "arguments": {"place": '
        '"Kyoto"}}\n</tool_call><|im_end|>'
    )
    assert length == _count(qwen3_tokenizer, written)
    assert length > _count(qwen3_tokenizer, 'get_tide{"place": "Kyoto"}') + 1


def test_a_qwen3_plain_turn_counts_its_end_of_turn_unless_cut_at_its_length(qwen3_tokenizer):
    stopped, cut = _lengths(
        qwen3_tokenizer, _chat({"content": "At noon."}), _chat({"content": "At noon."}, "length")
    )
    assert stopped == _count(qwen3_tokenizer, "<think>\n\n</think>\n\nAt noon.<|im_end|>")
    assert cut == stopped - 1


@pytest.mark.parametrize("finish", ["length", "abort", None])
def test_a_turn_that_did_not_stop_counts_no_end_of_turn(qwen3_tokenizer, finish):
    (length,) = _lengths(qwen3_tokenizer, _chat({"content": "At noon."}, finish))
    assert length == _count(qwen3_tokenizer, "<think>\n\n</think>\n\nAt noon.")


def test_a_turn_cut_in_its_reasoning_counts_no_markup_closing_it(
    qwen3_tokenizer, deepseek_tokenizer
):
    reasoning = "Kyoto has no sea; its nearest port is Maizuru."
    cut = _chat({"content": "", "reasoning_content": reasoning}, "length")
    assert _lengths(qwen3_tokenizer, cut) == [_count(qwen3_tokenizer, f"<think>\n{reasoning}")]
    # DeepSeek-R1's template drops the reasoning: its own tokens, no `</think>` ending it.
    assert _lengths(deepseek_tokenizer, cut) == [_count(deepseek_tokenizer, reasoning)]
    stopped = _chat({"content": "", "reasoning_content": reasoning})
    assert _lengths(deepseek_tokenizer, stopped) == [
        _count(deepseek_tokenizer, f"{reasoning}</think><｜end▁of▁sentence｜>")
    ]


def test_a_qwen3_reasoning_turn_counts_its_reasoning_once_as_the_template_writes_it(
    qwen3_tokenizer,
):
    message = {"content": "At noon.", "reasoning_content": "\nMaizuru is nearest.\n"}
    (length,) = _lengths(qwen3_tokenizer, _chat(message))
    written = "<think>\nMaizuru is nearest.\n</think>\n\nAt noon.<|im_end|>"
    assert length == _count(qwen3_tokenizer, written)


def test_a_deepseek_r1_reasoning_turn_counts_the_reasoning_its_template_leaves_out(
    deepseek_tokenizer,
):
    reasoning = "Kyoto has no sea; its nearest port is Maizuru."
    (length,) = _lengths(
        deepseek_tokenizer, _chat({"content": "At noon.", "reasoning_content": reasoning})
    )
    # The template renders the last turn as its content and end-of-sentence token only (its
    # prompt's generation prompt opens the think block): the reasoning is counted on its own,
    # with the `</think>` that ended it, which the engine generated too.
    turn = _count(deepseek_tokenizer, "At noon.<｜end▁of▁sentence｜>")
    assert length == turn + _count(deepseek_tokenizer, reasoning) + 1
    assert length > _count(deepseek_tokenizer, reasoning + "At noon.") + 1


def test_a_dropped_reasoning_its_content_repeats_is_counted(deepseek_tokenizer):
    # Whether the template dropped the reasoning is told by rendering the turn without it, not
    # by looking for its text, which the content may hold too.
    (length,) = _lengths(
        deepseek_tokenizer, _chat({"content": "Kyoto: at noon.", "reasoning_content": "Kyoto"})
    )
    turn = _count(deepseek_tokenizer, "Kyoto: at noon.<｜end▁of▁sentence｜>")
    assert length == turn + _count(deepseek_tokenizer, "Kyoto</think>")


def test_the_reasoning_marker_is_the_token_the_template_splits_content_on(
    deepseek_tokenizer, qwen3_tokenizer
):
    assert reasoning_marker(load_tokenizer(deepseek_tokenizer), {}) == "</think>"
    # Qwen3's template renders a last turn's reasoning: no token drops what precedes it.
    assert reasoning_marker(load_tokenizer(qwen3_tokenizer), {}) is None


ANTHROPIC = {
    "system": "Be brief.",
    "messages": QUESTION,
    "response": {
        "type": "message",
        "stop_reason": "end_turn",
        "content": [{"type": "text", "text": "At noon."}],
    },
}
RESPONSES = {
    "input": QUESTION,
    "response": {
        "object": "response",
        "status": "completed",
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "At noon."}]}],
    },
}


@pytest.mark.parametrize("record", [ANTHROPIC, RESPONSES], ids=["anthropic", "responses"])
def test_anthropic_and_responses_turns_count_as_chat_completions_turns(qwen3_tokenizer, record):
    assert _lengths(qwen3_tokenizer, record) == [
        _count(qwen3_tokenizer, "<think>\n\n</think>\n\nAt noon.<|im_end|>")
    ]


@pytest.mark.parametrize(("finish", "extra"), [("stop", 1), ("length", 0), (None, 0)])
def test_a_completion_counts_its_text_and_the_stop_token_it_ended_at(
    qwen3_tokenizer, finish, extra
):
    choice = {"index": 0, "text": " at noon.", "finish_reason": finish}
    record = {"request": {"prompt": "High tide is"}, "response": {"choices": [choice]}}
    assert _lengths(qwen3_tokenizer, record) == [_count(qwen3_tokenizer, " at noon.") + extra]


def test_a_logged_count_always_wins(qwen3_tokenizer):
    record = _chat({"content": None, "tool_calls": [CALL]}, tools=TOOLS)
    record["response"]["usage"] = {"prompt_tokens": 9, "completion_tokens": 7}
    assert _lengths(qwen3_tokenizer, record) == [7]


def _ids(*ids: int) -> bytes:
    return token_bytes(list(ids))


def test_a_conversation_that_extends_the_prompt_counts_and_hashes_its_turn():
    length, generated = generated_length(_ids(1, 2), _ids(7), True, [_ids(1, 2, 5, 6, 9)])
    assert (length, generated) == (3, _ids(5, 6, 9))


def test_a_template_that_rewrites_the_prompt_never_counts_less_than_the_text():
    # The conversation shares one token with the prompt: counted from there, the text hashed.
    length, generated = generated_length(_ids(1, 2, 3), _ids(7, 8), False, [_ids(1, 5, 9)])
    assert (length, generated) == (2, _ids(7, 8))
    short, _ = generated_length(_ids(1, 2, 3), _ids(7, 8, 8, 8), True, [_ids(1, 2, 3, 9)])
    assert short == 5  # the text's 4 and its stop token, over the turn's 1
    dropped, generated = generated_length(_ids(1), _ids(7), True, [_ids(1, 4, 9), _ids(3, 3)])
    assert (dropped, generated) == (4, _ids(7))  # a dropped reasoning counts, is not hashed
    assert len(generated) // TOKEN_DTYPE.itemsize == 1


def test_the_turn_ends_at_its_end_of_turn_token():
    assert through_end_of_turn("p<t>a</s>\n", "</s>", True) == "p<t>a</s>"
    assert through_end_of_turn("p<t>a</s>\n", "</s>", None) == "p<t>a"  # not said: none
    assert through_end_of_turn("p<t>a</s>\n", "</s>", False) == "p<t>a"
    assert through_end_of_turn("p<t>a</s>x", "</s>", True) == "p<t>a</s>x"  # not its end
    assert through_end_of_turn("p<t>a", None, True) == "p<t>a"


@pytest.mark.parametrize(
    ("first", "second", "shared"),
    [("abc", "abcd", 3), ("abc", "abd", 2), ("", "a", 0), ("abc", "xbc", 0), ("ab", "a", 1)],
)
def test_common_prefix(first, second, shared):
    assert common_prefix(first, second) == shared
