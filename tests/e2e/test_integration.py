"""Integration: the real DeepSeek-R1 and Qwen3 tokenizers, real chat templates, real traces."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from helpers import FINLAND, FRANCE, anonymize, read_jsonl, shared_path, trace, write_jsonl
from kvtrace.transforms.encode.tokenize import load_tokenizer, render_chat

pytestmark = pytest.mark.smoke  # in the fast set: one whole run per command (conftest)

# Seed 000's example, with the prompts as written there.
SEED_FRANCE = dict(FRANCE, input=[{"role": "user", "content": "What is the capital of France?"}])
SEED_FINLAND = dict(FINLAND, input=[{"role": "user", "content": "What is the capital of Finland?"}])


def test_seed_example_first_block_shared_rest_not(deepseek_tokenizer, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [SEED_FRANCE, SEED_FINLAND])
    assert anonymize(deepseek_tokenizer, [src], tmp_path / "out", "--block-size", "4") == 0
    france, finland = trace(tmp_path / "out")
    # As in seed 000: 12 tokens each, three blocks, the first shared.
    assert (france["input_length"], finland["input_length"]) == (12, 12)
    assert france["hash_ids"] == [0, 1, 2] and finland["hash_ids"] == [0, 3, 4]


def test_qwen3_template_kwargs_reach_the_template(qwen3_tokenizer, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [SEED_FRANCE])
    assert anonymize(qwen3_tokenizer, [src], tmp_path / "think") == 0
    assert (
        anonymize(
            qwen3_tokenizer,
            [src],
            tmp_path / "nothink",
            "--chat-template-kwargs",
            '{"enable_thinking": false}',
        )
        == 0
    )
    tokenizer = load_tokenizer(qwen3_tokenizer)
    text = render_chat(tokenizer, SEED_FRANCE["input"], None, {"enable_thinking": False})
    assert text.endswith("<think>\n\n</think>\n\n")
    (think,), (nothink,) = trace(tmp_path / "think"), trace(tmp_path / "nothink")
    assert nothink["input_length"] == len(
        tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
    )
    assert nothink["input_length"] > think["input_length"]


@pytest.mark.parametrize(
    "template",
    [
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        "openai-gpt-oss-120b.jinja",
        "Qwen-Qwen3-0.6B.jinja",
    ],
)
def test_real_templates_render_tools_and_dates_through_transformers(deepseek_tokenizer, template):
    source = shared_path("templates", template).read_text()
    tokenizer = load_tokenizer(deepseek_tokenizer)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "d",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    kwargs = {"chat_template": source, "date_string": "21 Nov 2026"}
    text = render_chat(tokenizer, messages, tools, kwargs)
    assert "Weather?" in text and "get_weather" in text
    assert text == render_chat(tokenizer, messages, tools, kwargs)  # no hidden clock


# Single-token words, spelled out so the test does not depend on how it picks them.
def _single_token_words(tokenizer, count: int) -> list[str]:
    words = []
    backend = tokenizer.backend_tokenizer
    for token in sorted(backend.get_vocab()):
        if token.startswith("Ġ") and token[1:].isalpha() and token[1:].islower():
            word = " " + token[1:]
            if len(backend.encode(word, add_special_tokens=False).ids) == 1:
                words.append(word)
                if len(words) == count:
                    return words
    raise AssertionError("not enough single-token words")


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_round_trip_of_a_real_trace_is_exact_up_to_renumbering(deepseek_tokenizer, tmp_path):
    """Render each hash id of synthetic_trace.jsonl as a fixed run of single-token words (16 per
    512-token block, the partial last block scaled), anonymize, and get the trace back."""
    original = read_jsonl(shared_path("traces", "synthetic_trace.jsonl"))
    block = 16
    words = _single_token_words(load_tokenizer(deepseek_tokenizer), 4000)
    n_words = len(words)

    def block_text(hash_id: int, tokens: int) -> str:
        # Two words name the id; the rest repeat them. Siblings differ in their first word.
        head = [words[hash_id % n_words], words[hash_id // n_words]]
        return "".join((head * block)[:tokens])

    expected_lengths, records = [], []
    for row in original:
        ids, last = row["hash_ids"], row["input_length"] - 512 * (len(row["hash_ids"]) - 1)
        last_tokens = max(2, math.ceil(last * block / 512))  # two words name an id
        sizes = [block] * (len(ids) - 1) + [last_tokens]
        records.append(
            {
                "timestamp": row["timestamp"],
                "output_length": row["output_length"],
                "prompt": "".join(block_text(i, s) for i, s in zip(ids, sizes)),
            }
        )
        expected_lengths.append(sum(sizes))
    src = write_jsonl(tmp_path / "prompts.jsonl", records)
    assert anonymize(deepseek_tokenizer, [src], tmp_path / "out", "--block-size", str(block)) == 0
    produced = trace(tmp_path / "out")
    assert len(produced) == len(original)

    # Rows with equal timestamps may come in another order; (ts, output_length) tells them apart.
    def key(row):
        return row["timestamp"], row["output_length"]

    ours = {key(r): r for r in produced}
    renumbering: dict[int, int] = {}
    for row, length in zip(original, expected_lengths):
        mine = ours[key(row)]
        assert mine["input_length"] == length
        assert len(mine["hash_ids"]) == len(row["hash_ids"])
        for theirs, new in zip(row["hash_ids"], mine["hash_ids"]):
            assert renumbering.setdefault(theirs, new) == new
    assert len(set(renumbering.values())) == len(renumbering)  # a bijection
    stats = json.loads(Path(tmp_path / "out" / "stats.json").read_text())
    assert (
        stats["unique_blocks"]
        == len(renumbering)
        == len({i for r in original for i in r["hash_ids"]})
    )
