"""Output blocks: --emit-output-hashes numbers the blocks an engine caches after decoding, and
simulate --decode-cache lets later turns hit them.

The whole CLI runs; the unit tests are in tests/transforms/cache/test_decode_cache.py."""

from __future__ import annotations

import pytest

from helpers import anonymize, read_jsonl, trace, write_jsonl

CONVERSATION = [
    {
        "timestamp": 0,
        "session_id": "c",
        "output": "Paris is the capital of France .",
        "messages": [{"role": "user", "content": "What is the capital of France ?"}],
    },
    {
        "timestamp": 1000,
        "session_id": "c",
        "output": "Helsinki .",
        "messages": [
            {"role": "user", "content": "What is the capital of France ?"},
            {"role": "assistant", "content": "Paris is the capital of France ."},
            {"role": "user", "content": "And of Finland ?"},
        ],
    },
]


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_a_later_turn_carries_the_ids_of_what_the_earlier_one_generated(tiny_tokenizer, tmp_path):
    src = write_jsonl(tmp_path / "chat.jsonl", CONVERSATION)
    outs = {}
    for engine in ("local", "beam"):
        outs[engine] = tmp_path / engine
        assert (
            anonymize(
                tiny_tokenizer,
                [src],
                outs[engine],
                "--block-size",
                "4",
                "--emit-output-hashes",
                "--engine",
                engine,
            )
            == 0
        )
    first, second = trace(outs["local"])
    # The tiny template renders history verbatim: turn 2 repeats turn 1's generated blocks.
    assert first["output_hash_ids"] and set(first["output_hash_ids"]) <= set(second["hash_ids"])
    assert read_jsonl(next(outs["local"].glob("trace-*.jsonl"))) == read_jsonl(
        next(outs["beam"].glob("trace-*.jsonl"))
    )
    plain = tmp_path / "plain"
    assert anonymize(tiny_tokenizer, [src], plain, "--block-size", "4") == 0
    # Here no answer-only block comes before a prompt block: prompt ids and statistics are
    # what they are without outputs (in general only the statistics are).
    assert [
        {k: v for k, v in r.items() if k != "output_hash_ids"} for r in trace(outs["local"])
    ] == trace(plain)
    assert (outs["local"] / "stats.json").read_text() == (plain / "stats.json").read_text()
