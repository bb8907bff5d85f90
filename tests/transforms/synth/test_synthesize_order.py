"""kvtrace synthesize reads rows by what they hold, never by where they sit: the same rows in
any order, split over any files, give the same bytes (tree copies, and output rows of one time
in synthesize.output_order), and a session's turns of one time chain in the same order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import write_jsonl
from kvtrace.transforms.read.trace_io import read_trace
from kvtrace.transforms.synth.output import jsonl_bytes
from kvtrace.transforms.synth.parts import RowParts
from kvtrace.transforms.synth.reshape import Knobs
from kvtrace.transforms.synth.synthesize import SynthConfig, synthesize, tree_copies

BLOCK = 4

ROWS = st.lists(
    st.tuples(
        st.integers(0, 6),  # few times: rows of one time, and rows alike in everything
        st.lists(st.integers(0, 6), min_size=1, max_size=5),
        st.integers(0, 9),
        st.sampled_from([None, None, "a", "b", 3]),
    ),
    min_size=1,
    max_size=16,
)


@settings(max_examples=80, deadline=None)
@given(
    rows=ROWS,
    roots=st.integers(1, 4),
    seed=st.integers(0, 3),
    speedup=st.sampled_from([1.0, 3.0]),
    data=st.data(),
)
def test_the_same_rows_in_any_order_and_split_give_the_same_bytes(
    tmp_path_factory, rows, roots, seed, speedup, data
):
    records = [
        {
            "timestamp": t,
            "input_length": len(ids) * BLOCK,
            "output_length": osl,
            "hash_ids": ids,
            **({"session_id": session} if session is not None else {}),
        }
        for t, ids, osl, session in rows
    ]
    shuffled = data.draw(st.permutations(records))
    cut = data.draw(st.integers(0, len(shuffled)))
    folder = tmp_path_factory.mktemp("synth-order")
    whole = read_trace([str(write_jsonl(folder / "whole.jsonl", records))])
    split = read_trace(
        [
            str(write_jsonl(folder / "tail.jsonl", shuffled[cut:])),
            str(write_jsonl(folder / "head.jsonl", shuffled[:cut])),
        ]
    )
    config = SynthConfig(Knobs(1.5, 0.5, roots), speedup_ratio=speedup, seed=seed)
    assert jsonl_bytes(synthesize(whole, BLOCK, config)) == jsonl_bytes(
        synthesize(split, BLOCK, config)
    )


def test_a_request_without_a_session_draws_its_tree_from_its_content(tmp_path):
    row = {"timestamp": 5, "input_length": 8, "output_length": 2, "hash_ids": [3, 4]}
    other = {**row, "hash_ids": [3, 5]}
    first = read_trace([str(write_jsonl(tmp_path / "a.jsonl", [row, other] * 20))])
    copies = tree_copies(first, 4, seed=1).tolist()
    assert set(copies[0::2]) == {copies[0]} and set(copies[1::2]) == {copies[1]}
    moved = read_trace([str(write_jsonl(tmp_path / "b.jsonl", [other, row]))])
    assert tree_copies(moved, 4, seed=1).tolist() == copies[1::-1]
    assert len({tuple(tree_copies(first, 4, seed=s)[:2].tolist()) for s in range(8)}) > 1


def test_turns_of_one_session_at_one_time_chain_by_what_they_hold(tmp_path):
    turns = [
        {
            "timestamp": 7,
            "input_length": 8,
            "output_length": 2,
            "hash_ids": [1, 2],
            "session_id": "s",
        },
        {
            "timestamp": 7,
            "input_length": 8,
            "output_length": 1,
            "hash_ids": [1, 3],
            "session_id": "s",
        },
        {
            "timestamp": 7,
            "input_length": 8,
            "output_length": 1,
            "hash_ids": [1, 4],
            "session_id": "s",
        },
        {
            "timestamp": 9,
            "input_length": 12,
            "output_length": 1,
            "hash_ids": [1, 3, 5],
            "session_id": "s",
        },
    ]

    def chain(rows: list[dict]) -> list[tuple]:
        trace = read_trace([str(write_jsonl(tmp_path / "t.jsonl", rows))])
        parts = RowParts.of(trace, BLOCK)
        held = [tuple(trace.ids[a:b].tolist()) for a, b in zip(trace.offsets, trace.offsets[1:])]
        return [held[row] for row in parts.order.tolist()] + sorted(
            (held[row], held[int(before)] if before >= 0 else ())
            for row, before in enumerate(parts.previous_turn.tolist())
        )

    assert chain(turns) == chain(turns[::-1]) == chain(turns[1:3] + turns[3:] + turns[:1])
    assert chain(turns)[:4] == [(1, 3), (1, 4), (1, 2), (1, 3, 5)]  # output length, then ids
