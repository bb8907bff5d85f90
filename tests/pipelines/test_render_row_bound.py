"""pipelines/render.py's row bound: what a row costs is what render builds from its ids."""

from __future__ import annotations

from helpers import write_jsonl

from kvtrace.pipelines.render import MAX_ROW_TOKENS, _row_tokens, _within_row_bound
from kvtrace.transforms.read.trace_io import read_trace


def test_a_row_costs_the_tokens_its_ids_spell_not_only_the_length_it_claims(tmp_path):
    """render_blocks spells block_size tokens for every block but a row's last: a row claiming
    1 token with 6,000 ids builds ~3 M tokens at 512, and is left out before it is built."""
    block = 512
    rows = [{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": list(range(6000))},
            {"timestamp": 1, "input_length": 1000, "output_length": 1, "hash_ids": [0, 1]},
            {"timestamp": 2, "input_length": MAX_ROW_TOKENS, "output_length": 1,
             "hash_ids": list(range(MAX_ROW_TOKENS // block))}]
    trace = read_trace([str(write_jsonl(tmp_path / "t.jsonl", rows))])
    assert _row_tokens(trace, block).tolist() == [5999 * block + 1, 1000, MAX_ROW_TOKENS]
    kept, too_long = _within_row_bound(trace, block)
    assert kept.input_length.tolist() == [1000, MAX_ROW_TOKENS]
    assert too_long["count"] == 1 and too_long["examples"][0]["line"] == 1
