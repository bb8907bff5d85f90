"""A request's own template settings render its prompt, merged over the run's kwargs as the
serving engine merges them; the segment cache and the render probe never mix two settings."""

from __future__ import annotations

from typing import Any

import pytest

from kvtrace.transforms.encode import tokenize
from kvtrace.transforms.encode.encode_requests import EncodeOptions, RequestEncoder
from kvtrace.transforms.encode.fast_tokenizer import FastTokenizer
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.tokenize import load_tokenizer
from kvtrace.transforms.errors import Rejected
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
    assert [prompt for _, prompt, _ in rendered] == [
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


# Writes the end-of-turn token after each message, as many chat templates do.
EOS_PER_TURN = "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"


def test_a_render_past_the_record_bound_is_too_large_before_it_is_tokenized(tiny_tokenizer):
    """A request's own eos_token, merged over the tokenizer's as transformers merges it,
    repeated by the template after each turn: the render is held to the record bound
    (tokenize.check_rendered), whatever the template repeats."""
    loaded = load_tokenizer(tiny_tokenizer)
    tokenizer = FastTokenizer(loaded.backend_tokenizer, EOS_PER_TURN, {"eos_token": "</s>"})
    bound = 1024
    options = EncodeOptions("t", SaltSource("random"), 4, max_record_bytes=bound)
    encoder = RequestEncoder(tokenizer, b"s" * 16, options)
    turns = [{"role": "user", "content": "q"}] * 100
    line = b"r" * bound  # a record at the bound
    limit = tokenize.rendered_limit(len(line), bound)
    eos = "w" * (limit // len(turns) - 1)  # the longest that renders within the bound
    requests = [
        Request("t", line, 0, "chat", messages=turns, template_kwargs=own)
        for own in (None, {"eos_token": eos}, {"eos_token": eos + "w"})
    ]
    rendered, rejected = encoder.render(requests)
    assert [prompt for _, prompt, _ in rendered] == ["q</s>" * 100, ("q" + eos) * 100]
    assert [letter.reason for letter in rejected] == ["too_large"]
    assert f"over {limit} bytes" in rejected[0].message


def test_a_record_of_tiny_items_at_the_bound_renders_within_it(qwen3_tokenizer, deepseek_tokenizer):
    """The shipped templates on the records they expand most: the tiniest messages and tools
    filling a record at the bound render within RENDERED_PER_RECORD_BYTE x its bytes."""
    bound = 1 << 16
    message = {"role": "assistant", "content": ""}
    tool = {"type": "function", "function": {"name": "f"}}
    for name in (qwen3_tokenizer, deepseek_tokenizer):
        tokenizer = load_tokenizer(name)
        for messages, tools in (
            ([message] * (bound // 34), None),
            (MESSAGES, [tool] * (bound // 44)),
        ):
            prompt = tokenize.render_chat(tokenizer, messages, tools, {})
            assert 0 < len(prompt) <= tokenize.RENDERED_PER_RECORD_BYTE * bound
            assert tokenize.check_rendered(prompt, bound, bound) == prompt


def test_a_render_is_held_to_its_own_records_bytes_in_utf8():
    """Round 20: the limit is the record's own (4 x its bytes + the overhead), not the bound's,
    and counted in UTF-8 bytes, what a byte-level tokenizer pays for: 3-byte characters count
    3 times."""
    bound = 1 << 20
    limit = tokenize.rendered_limit(100, bound)
    assert limit == tokenize.rendered_limit(100, 100) < tokenize.rendered_limit(bound, bound)
    fits = "\ue000" * (limit // 3)
    assert tokenize.check_rendered(fits, 100, bound) == fits
    assert tokenize.check_rendered("w" * limit, 100, bound) == "w" * limit
    for over in (fits + "\ue000", "w" * (limit + 1), "\U0001f600" * (limit // 4 + 1)):
        with pytest.raises(Rejected) as refused:
            tokenize.check_rendered(over, 100, bound)
        assert refused.value.reason == "too_large"
