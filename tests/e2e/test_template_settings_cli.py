"""A request's own template settings through the CLI: the same trace and letters on both
engines (one encoder renders them), its own template and a wrong type lettered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import SALT, anonymize, assert_same_output, chat, published_letters, trace, write_jsonl

QUESTION = [{"role": "user", "content": "what is a prefix cache"}]


def _record(ts: int, **settings: object) -> dict:
    return {"timestamp": ts, "messages": QUESTION, "output_length": 3, **settings}


@pytest.mark.slow  # two whole runs, one on Beam
@pytest.mark.beam
def test_settings_render_alike_on_both_engines(qwen3_tokenizer, tmp_path):
    (tmp_path / "salt").write_text(SALT)
    records = [
        _record(0),
        _record(1, chat_template_kwargs={"enable_thinking": False}),
        _record(2, add_generation_prompt=False),
        _record(3, reasoning_effort="low", documents=[{"text": "d"}]),
        _record(4, chat_template="{{ messages }}"),
        _record(5, chat_template_kwargs={"enable_thinking": False, "tokenize": True}),
        _record(6, add_generation_prompt="no"),
        chat(7, 60_000),
    ]
    log = write_jsonl(tmp_path / "in.jsonl", records)
    flags = ("--block-size", "4", "--salt-file", str(tmp_path / "salt"))
    flags += ("--max-rejected-fraction", "1")
    for engine in ("local", "beam"):
        out = tmp_path / engine
        assert anonymize(qwen3_tokenizer, [log], out, *flags, "--engine", engine) == 0
    assert_same_output(tmp_path / "local", tmp_path / "beam")
    lengths = [row["input_length"] for row in trace(tmp_path / "local")]
    # Thinking off adds the empty think block to the prompt; no generation prompt drops it.
    assert len(lengths) == 5 and lengths[1] > lengths[0] > lengths[2]
    letters = published_letters(Path(f"{tmp_path / 'local'}-rejected")).read_text().splitlines()
    reasons = sorted(json.loads(line)["error"] for line in letters)
    assert reasons == ["invalid_request", "untrusted_template", "wrong_type"]
