"""kvtrace synthesize: every knob does what it says, and every output row stays valid."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import shared_path, write_jsonl
from kvtrace.transforms.read.trace_io import read_trace
from kvtrace.transforms.stats.trace_blocks import prefix_ids
from kvtrace.transforms.stats.trace_stats import analyze
from kvtrace.transforms.synth.parts import RowParts, content_order
from kvtrace.transforms.synth.reshape import Knobs
from kvtrace.transforms.synth.shards import take_rows
from kvtrace.transforms.synth.synthesize import (
    SynthConfig,
    content_fingerprints,
    dense_by_first_appearance,
    output_order,
    synthesize,
)

BLOCK = 16


def problems(trace, block_size=BLOCK) -> dict:
    return {
        name: found["count"]
        for name, found in analyze(trace, block_size)["problems"].items()
        if found["count"]
    }


def row_ids(trace) -> list[list[int]]:
    return [trace.ids[a:b].tolist() for a, b in zip(trace.offsets[:-1], trace.offsets[1:])]


def in_output_order(trace):
    """The trace's rows as synthesize orders them (time, then content: output_order), ids
    renumbered first-seen: what the default knobs give back."""
    rows = content_order(trace, prefix_ids(trace))
    rows = rows[
        output_order(
            np.floor(trace.timestamp[rows]).astype(np.int64),
            trace.timestamp[rows],
            trace.input_length[rows],
            trace.output_length[rows],
            content_fingerprints(trace)[rows],
        )
    ]
    ordered = take_rows(trace, rows)
    ordered.ids = dense_by_first_appearance(prefix_ids(ordered))
    return ordered


def chat_trace(tmp_path, sessions: int = 6, turns: int = 4, seed: int = 0):
    """Bailian-style conversations: a system prompt shared by all (3 blocks), then each turn the
    previous turn's whole input plus new blocks; a partial last block only on the last turn."""
    rng = np.random.default_rng(seed)
    rows, next_id = [], 100
    for s in range(sessions):
        ids = [0, 1, 2]
        for t in range(turns):
            new = list(range(next_id, next_id + int(rng.integers(1, 4))))
            next_id += len(new)
            ids = ids + new
            partial = t == turns - 1
            rows.append(
                {
                    "timestamp": 1000 * s + 5000 * t,
                    "input_length": len(ids) * BLOCK - (5 if partial else 0),
                    "output_length": int(rng.integers(1, 50)),
                    "hash_ids": ids,
                    "session_id": f"conv-{s}",
                }
            )
    rows.sort(key=lambda r: r["timestamp"])
    return read_trace([str(write_jsonl(tmp_path / "chats.jsonl", rows))])


def test_default_knobs_give_the_trace_back(tmp_path):
    trace = read_trace([str(shared_path("traces", "synthetic_trace.jsonl"))])
    out, given = synthesize(trace, 512, SynthConfig()), in_output_order(trace)
    assert row_ids(out) == row_ids(given)
    assert out.input_length.tolist() == given.input_length.tolist()
    assert out.output_length.tolist() == given.output_length.tolist()
    assert out.timestamp.tolist() == trace.timestamp.tolist()  # rows of one time reordered only


def test_speedup_divides_timestamps_and_isl_bounds_keep_exactly_the_rows_inside(tmp_path):
    trace = read_trace([str(shared_path("traces", "synthetic_trace.jsonl"))])
    faster = synthesize(trace, 512, SynthConfig(speedup_ratio=3))
    assert faster.timestamp.tolist() == [math.floor(t / 3) for t in trace.timestamp.tolist()]
    bounded = synthesize(trace, 512, SynthConfig(min_isl=1000, max_isl=20000))
    given = in_output_order(trace)
    inside = (given.input_length >= 1000) & (given.input_length <= 20000)
    assert bounded.input_length.tolist() == given.input_length[inside].tolist()
    assert not problems(bounded, 512)


def test_output_lengths_are_scaled_then_clamped(tmp_path):
    trace = read_trace([str(shared_path("traces", "synthetic_trace.jsonl"))])
    out = synthesize(trace, 512, SynthConfig(osl_multiplier=2, min_osl=10, max_osl=300))
    expected = np.clip(in_output_order(trace).output_length * 2, 10, 300)
    assert out.output_length.tolist() == expected.tolist()


def test_root_multiplier_lowers_the_hit_rate_and_keeps_conversations_in_one_tree(tmp_path):
    trace = chat_trace(tmp_path, sessions=12)
    base = analyze(trace, BLOCK)["hit_rates"]["token_weighted"]
    out = synthesize(trace, BLOCK, SynthConfig(knobs=Knobs(prefix_root_multiplier=4), seed=2))
    assert analyze(out, BLOCK)["hit_rates"]["token_weighted"] < base
    assert not problems(out)
    assert_turns_extend_previous(out)
    roots = {}
    for session, ids in zip(out.session.tolist(), row_ids(out)):
        roots.setdefault(session, set()).add(ids[0])
    assert all(len(r) == 1 for r in roots.values())  # each conversation in one tree
    assert len({next(iter(r)) for r in roots.values()}) > 1  # and several trees in use


def assert_turns_extend_previous(trace) -> None:
    """Each turn of a conversation starts with the previous turn's whole input."""
    last: dict = {}
    for session, ids, length in zip(
        trace.session.tolist(), row_ids(trace), trace.input_length.tolist()
    ):
        if session in last:
            previous, previous_length = last[session]
            if previous_length % BLOCK == 0:  # a partial block cannot be continued
                assert ids[: len(previous)] == previous
        last[session] = (ids, length)


@pytest.mark.parametrize("p", [0.5, 2.0, 3.0])
def test_prefix_multiplier_scales_shared_prefixes(tmp_path, p):
    trace = chat_trace(tmp_path)
    out = synthesize(trace, BLOCK, SynthConfig(knobs=Knobs(prefix_len_multiplier=p)))
    before = RowParts.of(trace, BLOCK).shared
    after = RowParts.of(out, BLOCK).shared
    # Rows keep their causal order; the shared run of 3 blocks becomes round(3 p).
    assert after.tolist() == [math.floor(s * p + 0.5) for s in before.tolist()]
    assert not problems(out)
    assert_turns_extend_previous(out)


@pytest.mark.parametrize("q", [0.5, 2.0])
def test_prompt_multiplier_scales_the_unique_parts(tmp_path, q):
    rows = [
        {
            "timestamp": i,
            "input_length": 3 * BLOCK + 40 + i,
            "output_length": 1,
            "hash_ids": [0, 1, 2, 10 + 10 * i, 11 + 10 * i, 12 + 10 * i],
        }
        for i in range(8)
    ]
    trace = read_trace([str(write_jsonl(tmp_path / "t.jsonl", rows))])
    out = synthesize(trace, BLOCK, SynthConfig(knobs=Knobs(prompt_len_multiplier=q)))
    own_before = trace.input_length - 3 * BLOCK
    own_after = out.input_length - 3 * BLOCK
    assert own_after.tolist() == [math.floor(x * q + 0.5) for x in own_before.tolist()]
    assert not problems(out)


def test_rows_sharing_a_partial_last_block_work_with_every_option(tmp_path):
    # FAST'25 traces: exact repeats share their partial last block (aiperf crashes on them).
    rows = [
        {"timestamp": t, "input_length": 2 * BLOCK + 7, "output_length": 3, "hash_ids": [0, 1, 2]}
        for t in range(0, 50, 10)
    ]
    rows += [
        {"timestamp": 60, "input_length": 4 * BLOCK, "output_length": 3, "hash_ids": [0, 1, 5, 6]}
    ]
    trace = read_trace([str(write_jsonl(tmp_path / "t.jsonl", rows))])
    for knobs in (Knobs(2.5, 0.3, 3), Knobs(0.4, 3.0, 1), Knobs()):
        out = synthesize(
            trace,
            BLOCK,
            SynthConfig(knobs=knobs, num_requests=40, seed=1, max_isl=10 * BLOCK, speedup_ratio=2),
        )
        assert len(out.input_length) <= 40 and not problems(out)


def test_drawn_requests_keep_the_sources_statistics(tmp_path):
    trace = read_trace([str(shared_path("traces", "synthetic_trace.jsonl"))])
    out = synthesize(trace, 512, SynthConfig(num_requests=8000, seed=5))
    assert len(out.input_length) == 8000 and not problems(out, 512)
    before, after = analyze(trace, 512), analyze(out, 512)
    for key in ("avg_isl", "avg_osl"):
        assert after[key] == pytest.approx(before[key], rel=0.1), key
    rate = before["request_rate"]["mean_per_minute"]
    assert after["request_rate"]["mean_per_minute"] == pytest.approx(rate, rel=0.1)


def test_conversations_drawn_keep_their_turns_chained(tmp_path):
    trace = chat_trace(tmp_path)
    out = synthesize(trace, BLOCK, SynthConfig(num_requests=60, seed=4, knobs=Knobs(2.0, 1.5, 2)))
    assert len(out.input_length) == 60 and not problems(out)
    assert_turns_extend_previous(out)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 100),
            st.lists(st.integers(0, 5), max_size=6),
            st.integers(0, BLOCK - 1),
            st.sampled_from([None, "a", "b"]),
        ),
        min_size=1,
        max_size=25,
    ),
    p=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    q=st.sampled_from([0.0, 0.4, 1.0, 2.5]),
    k=st.integers(1, 3),
    n=st.one_of(st.none(), st.integers(1, 30)),
)
def test_every_output_is_a_valid_trace(tmp_path_factory, rows, p, q, k, n):
    records = [
        {
            "timestamp": t,
            "input_length": max(0, len(ids) * BLOCK - cut) if ids else 0,
            "output_length": 1,
            "hash_ids": ids,
            **({"session_id": s} if s else {}),
        }
        for t, ids, cut, s in rows
    ]
    path = write_jsonl(tmp_path_factory.mktemp("synth") / "t.jsonl", records)
    out = synthesize(
        read_trace([str(path)]), BLOCK, SynthConfig(knobs=Knobs(p, q, k), num_requests=n, seed=3)
    )
    assert not problems(out)
    assert (out.lengths == -(-out.input_length // BLOCK)).all()
