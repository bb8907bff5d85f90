"""kvtrace render: requests whose tokenization reproduces the trace; the round trip
anonymize(render(trace)) == trace up to renumbering.

The unit tests; the whole CLI runs are in tests/e2e/test_render_cli.py."""

from __future__ import annotations

import pytest

from helpers import write_jsonl
from kvtrace.transforms.encode.tokenize import load_tokenizer
from kvtrace.transforms.read.trace_io import read_trace
from kvtrace.transforms.replay.render import render_blocks, vocabulary


def test_ranks_are_spelled_in_as_many_words_as_they_need(tiny_tokenizer, tmp_path):
    words = vocabulary(load_tokenizer(tiny_tokenizer))
    many = len(words) + 1  # more first blocks than there are words

    def trace_of(name, isl, ids):
        rows = [
            {"timestamp": i, "input_length": isl, "output_length": 1, "hash_ids": ids(i)}
            for i in range(many)
        ]
        return read_trace([str(write_jsonl(tmp_path / name, rows))])

    with pytest.raises(ValueError, match="different next blocks"):
        render_blocks(trace_of("a.jsonl", 2, lambda i: [i, 1000 + i]), 1, words)
    rendered = render_blocks(trace_of("b.jsonl", 2, lambda i: [i]), 2, words)
    assert (
        len({rendered.row(r) for r in range(len(rendered.offsets) - 1)}) == many
        and rendered.merged == 0
    )
    # One-token partial blocks cannot spell two digits: one pair of them reads alike.
    assert render_blocks(trace_of("c.jsonl", 1, lambda i: [i]), 2, words).merged == 1
