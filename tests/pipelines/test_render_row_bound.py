"""pipelines/render.py: a row costs what render builds from its ids; verifying runs in a process
of its own."""

from __future__ import annotations

import os

import pytest

from helpers import write_jsonl
from kvtrace.pipelines.render import MAX_ROW_TOKENS, _row_tokens, _within_row_bound
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.read.trace_io import read_trace


def test_a_row_costs_the_tokens_its_ids_spell_not_only_the_length_it_claims(tmp_path):
    """render_blocks spells block_size tokens for every block but a row's last: a row claiming
    1 token with 6,000 ids builds ~3 M tokens at 512, and is left out before it is built."""
    block = 512
    rows = [
        {"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": list(range(6000))},
        {"timestamp": 1, "input_length": 1000, "output_length": 1, "hash_ids": [0, 1]},
        {
            "timestamp": 2,
            "input_length": MAX_ROW_TOKENS,
            "output_length": 1,
            "hash_ids": list(range(MAX_ROW_TOKENS // block)),
        },
    ]
    trace = read_trace([str(write_jsonl(tmp_path / "t.jsonl", rows))])
    assert _row_tokens(trace, block).tolist() == [5999 * block + 1, 1000, MAX_ROW_TOKENS]
    kept, too_long = _within_row_bound(trace, block)
    assert kept.input_length.tolist() == [1000, MAX_ROW_TOKENS]
    assert too_long["count"] == 1 and too_long["examples"][0]["line"] == 1


def _abort(texts: list[str]) -> None:
    os.abort()  # what a native panic in the tokenizer does to its process


def test_a_native_abort_while_verifying_is_one_line_not_the_cli_s_death(
    tmp_path, monkeypatch, tiny_tokenizer
):
    """render's verify step tokenizes in a process of its own (as the local engine's workers
    do): its abort is a JobStopped saying how it died, and this process lives on."""
    from kvtrace.pipelines import render

    rows = [{"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [0, 1]}]
    source = write_jsonl(tmp_path / "t.jsonl", rows)
    monkeypatch.setattr(render, "_verified_batch", _abort)
    config = render.RenderConfig(
        (str(source),), str(tmp_path / "r.jsonl"), tiny_tokenizer, block_size=4
    )
    with pytest.raises(JobStopped, match="the verifying process died by SIGABRT"):
        render.run_render(config)
    assert not (tmp_path / "r.jsonl").exists()  # nothing published
