"""--num-requests draws from the rows' content, never from where they sit in the input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import write_jsonl
from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.read.trace_io import Trace, read_trace
from kvtrace.transforms.synth import sample
from kvtrace.transforms.synth.parts import RowParts
from kvtrace.transforms.synth.sample import content_order, sample_requests

BLOCK = 4


def drawn(trace: Trace, requests: int = 30, seed: int = 7) -> list[tuple]:
    out = sample_requests(
        trace, RowParts.of(trace, BLOCK), requests, BLOCK, np.random.default_rng(seed)
    )
    ids = [out.ids[a:b].tolist() for a, b in zip(out.offsets[:-1], out.offsets[1:])]
    sessions = out.session.tolist() if out.session is not None else [None] * len(out)
    return list(
        zip(
            out.timestamp.tolist(),
            out.input_length.tolist(),
            out.output_length.tolist(),
            ids,
            sessions,
        )
    )


ROWS = st.lists(
    st.tuples(
        st.integers(0, 5),  # timestamp: rows of one time are common
        st.lists(st.integers(0, 6), min_size=1, max_size=5),
        st.integers(0, 9),
        st.sampled_from([None, "a", "b", 3]),
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=60, deadline=None)
@given(rows=ROWS, data=st.data())
def test_the_same_rows_in_any_order_and_split_draw_the_same_requests(tmp_path_factory, rows, data):
    # One time per session turn: the turns' order is their times' (ties there are file order
    # to RowParts, as to every engine's causal order).
    seen: set = set()
    records = []
    for t, ids, osl, session in rows:
        if session is not None and (session, t) in seen:
            continue
        seen.add((session, t))
        record = {"timestamp": t, "input_length": len(ids) * BLOCK, "output_length": osl}
        records.append({**record, "hash_ids": ids, **({"session_id": session} if session else {})})
    shuffled = data.draw(st.permutations(records))
    cut = data.draw(st.integers(0, len(shuffled)))
    folder = tmp_path_factory.mktemp("sample")
    whole = read_trace([str(write_jsonl(folder / "whole.jsonl", records))])
    split = read_trace(
        [
            str(write_jsonl(folder / "tail.jsonl", shuffled[cut:])),
            str(write_jsonl(folder / "head.jsonl", shuffled[:cut])),
        ]
    )
    assert drawn(whole) == drawn(split)


def test_content_order_puts_rows_of_one_time_in_the_order_of_what_they_hold(tmp_path):
    rows = [
        {"timestamp": 5, "input_length": 8, "output_length": 2, "hash_ids": [3, 4]},
        {"timestamp": 5, "input_length": 8, "output_length": 2, "hash_ids": [3, 1]},
        {"timestamp": 5, "input_length": 8, "output_length": 1, "hash_ids": [9, 9]},
        {"timestamp": 1, "input_length": 9, "output_length": 7, "hash_ids": [5, 5, 5]},
    ]
    trace = read_trace([str(write_jsonl(tmp_path / "t.jsonl", rows))])
    order = content_order(trace, RowParts.of(trace, BLOCK).prefix).tolist()
    assert order[:2] == [3, 2]  # time first, then the lengths
    assert sorted(order[2:]) == [0, 1]
    reversed_trace = read_trace([str(write_jsonl(tmp_path / "r.jsonl", rows[::-1]))])
    again = content_order(reversed_trace, RowParts.of(reversed_trace, BLOCK).prefix).tolist()
    assert [rows[::-1][i] for i in again] == [rows[i] for i in order]


def _growing_trace(tmp_path) -> Trace:
    """A conversation of six turns, each continuing the whole previous one, beside a request
    of six own blocks: a drawn turn's own part may be six blocks, so drawn turns outgrow the
    source's longest row."""
    ids = [list(range(k)) for k in range(1, 7)] + [list(range(10, 16))]
    rows = [
        {"timestamp": t, "input_length": len(row) * BLOCK, "output_length": 1, "hash_ids": row}
        for t, row in enumerate(ids)
    ]
    for row in rows[:6]:
        row["session_id"] = "a"
    return read_trace([str(write_jsonl(tmp_path / "t.jsonl", rows))])


def test_requests_past_the_drawn_ids_bound_are_refused_before_drawing(tmp_path, monkeypatch):
    """Round 11: --num-requests had no bound, each drawn request held as a Python list; now
    requests x the longest row over the bound is refused before the first draw."""
    trace = _growing_trace(tmp_path)
    monkeypatch.setattr(sample, "MAX_DRAWN_IDS", 12 * 6)
    rng = np.random.default_rng(1)
    with pytest.raises(ConfigError, match=r"--num-requests.*13 x the trace's longest row, 6"):
        sample_requests(trace, RowParts.of(trace, BLOCK), 13, BLOCK, rng)
    assert rng.integers(1 << 30) == np.random.default_rng(1).integers(1 << 30)  # none drawn


def test_drawn_turns_outgrowing_their_source_are_refused_at_the_bound(tmp_path, monkeypatch):
    """Within requests x the longest row, drawn conversations may still grow past it (here 93
    ids for 12 requests of a trace whose longest row holds 6): refused as they reach it."""
    trace = _growing_trace(tmp_path)
    assert sum(len(row[3]) for row in drawn(trace, 12, seed=1)) == 93
    monkeypatch.setattr(sample, "MAX_DRAWN_IDS", 12 * 6)
    with pytest.raises(
        ConfigError, match=r"--num-requests would draw 7\d block ids .* drawn so far"
    ):
        drawn(trace, 12, seed=1)
    monkeypatch.setattr(sample, "MAX_DRAWN_IDS", 93)
    assert len(drawn(trace, 12, seed=1)) == 12
