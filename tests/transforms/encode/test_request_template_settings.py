"""A request's own template settings render its prompt, merged over the run's kwargs as the
serving engine merges them; the segment cache and the render probe never mix two settings."""

from __future__ import annotations

from typing import Any

from kvtrace.transforms.encode import tokenize
from kvtrace.transforms.encode.encode_requests import EncodeOptions, RequestEncoder
from kvtrace.transforms.encode.fast_tokenizer import FastTokenizer
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.tokenize import load_tokenizer
from kvtrace.transforms.read.records import Request

# Prints what the engine's template reads of each setting.
SHOWS = (
    "{{ messages[-1].content }}|{{ add_generation_prompt }}|{{ continue_final_message }}|"
    "{{ documents | tojson }}|{{ reasoning_effort }}|{{ enable_thinking }}"
)
MESSAGES = [{"role": "user", "content": "hi"}]


def _encoder(tokenizer: Any, run: dict[str, Any]) -> RequestEncoder:
    options = EncodeOptions("t", SaltSource("random"), 4, chat_template_kwargs=run)
    return RequestEncoder(tokenizer, b"s" * 16, options)


def _request(own: dict[str, Any] | None) -> Request:
    return Request("t", b"", 0, "chat", messages=MESSAGES, template_kwargs=own)


def _shows(tiny_tokenizer: str) -> FastTokenizer:
    tokenizer = load_tokenizer(tiny_tokenizer)
    return FastTokenizer(tokenizer.backend_tokenizer, SHOWS, tokenizer.special_tokens_map)


def test_each_setting_renders_and_merges_over_the_runs(tiny_tokenizer):
    encoder = _encoder(_shows(tiny_tokenizer), {"enable_thinking": True, "reasoning_effort": "x"})
    own = [
        None,
        {"enable_thinking": False},
        {"add_generation_prompt": False},
        {"documents": [{"text": "d"}], "reasoning_effort": "low"},
    ]
    rendered, rejected = encoder.render([_request(o) for o in own])
    assert not rejected
    assert [prompt for _, prompt in rendered] == [
        "hi|True||null|x|True",
        "hi|True||null|x|False",
        "hi|False||null|x|True",
        'hi|True||[{"text": "d"}]|low|True',
    ]


def test_two_settings_in_one_batch_never_share_a_render(qwen3_tokenizer):
    """Qwen3's thinking switch per request: one batch, one segment cache, two lengths, each the
    length of the run that set it for every request."""
    tokenizer = load_tokenizer(qwen3_tokenizer)
    off = {"enable_thinking": False}
    mixed = _encoder(tokenizer, {})
    both = [_request(None), _request(off), _request(None), _request(off)]
    rendered, _ = mixed.render(both)
    lengths = [len(data) for data in mixed.tokenize(rendered)[0]]
    alone = [_encoder(tokenizer, run) for run in ({}, off)]
    expected = [len(e.tokenize(e.render([_request(None)])[0])[0][0]) for e in alone]
    assert expected[0] != expected[1] and lengths == expected * 2


def test_a_requests_settings_are_never_probed(tiny_tokenizer):
    """The probe renders with the run's kwargs alone: a request's variables neither stop the
    job nor grow the probed set, however many distinct ones a log holds."""
    shows = _shows(tiny_tokenizer)
    encoder = _encoder(shows, {})
    encoder.render([_request(None)])
    probed = set(tokenize._PROBED[shows])
    encoder.render([_request({"k": i}) for i in range(5)])
    assert tokenize._PROBED[shows] == probed
