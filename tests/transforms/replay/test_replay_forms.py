"""The forms replayers read (transforms/replay/forms.py, export.py) and `kvtrace export`.

vLLM (0.33.0, `vllm/benchmarks/datasets/datasets.py`, class TimedTrace) and SGLang (0.5.23,
`sglang/benchmark/datasets/mooncake.py`) do not install on these CPU-only machines: their
readers are described here as their source reads, and the exported files checked against that.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.read.trace_io import read_trace
from kvtrace.transforms.replay.export import export
from kvtrace.transforms.replay.forms import NO_TURN, deltas, recut_blocks, turns
from kvtrace.transforms.write.replayers import CONSUMERS, SGLANG_TOKENS_PER_ID, replay_commands


def trace_of(tmp_path: Path, rows: list[dict]):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return read_trace([str(path)])


def row(ts, isl, osl, ids, session=None, response=None) -> dict:
    out = {"timestamp": ts, "input_length": isl, "output_length": osl, "hash_ids": ids}
    if session is not None:
        out["session"] = session
    if response is not None:
        out["response_ms"] = response
    return out


CHAT = [  # block size 4: turn 2 extends turn 1 by its answer (2 tokens) and 6 new tokens
    row(0, 8, 2, [0, 1], session=7, response=300),
    row(100, 5, 1, [2, 3]),
    row(1_000, 16, 3, [0, 1, 4, 5], session=7),
    row(5_000, 6, 1, [6, 7], session=7, response=50),  # shorter than before: cannot be a delta
]


def test_turns_wait_from_the_previous_response_end_or_else_from_its_arrival(tmp_path):
    chain = turns(trace_of(tmp_path, CHAT))
    assert chain.previous.tolist() == [NO_TURN, NO_TURN, 0, 2]
    assert chain.delay_ms.tolist() == [NO_TURN, NO_TURN, 700, 4_000]


def test_deltas_hold_what_a_turn_adds_and_restart_a_turn_that_adds_nothing(tmp_path):
    trace = trace_of(tmp_path, CHAT)
    cut = deltas(trace, turns(trace), 4)
    assert cut.input_length.tolist() == [8, 5, 6, 6]
    ids = [cut.ids[a:b].tolist() for a, b in zip(cut.offsets[:-1], cut.offsets[1:])]
    assert ids == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert cut.starts_conversation.tolist() == [True, True, False, True]
    assert cut.restarted == 1


def test_the_delta_export_names_a_restarted_conversation_apart(tmp_path):
    exported = export(trace_of(tmp_path, CHAT), CONSUMERS["dynamo-delta"], 4)
    rows = [json.loads(line) for line in exported.data.decode().splitlines()]
    assert [(r.get("session_id"), r.get("delay")) for r in rows] == [
        ("7", None),
        (None, None),
        ("7", 700),
        ("7~1", None),
    ]
    assert (exported.follow_up_turns, exported.without_response_end, exported.restarted) == (
        1,
        0,
        1,
    )


def test_the_turns_export_keeps_whole_prompts_and_counts_unknown_ends(tmp_path):
    exported = export(trace_of(tmp_path, CHAT), CONSUMERS["dynamo"], 4)
    rows = [json.loads(line) for line in exported.data.decode().splitlines()]
    assert [r["input_length"] for r in rows] == [8, 5, 16, 6]
    assert [r.get("delay") for r in rows] == [None, None, 700, 4_000]
    assert exported.without_response_end == 1  # turn 3's previous turn logged no end


@pytest.mark.parametrize(
    "block_size, new_size, expected",
    [
        (
            16,
            128,
            [[0], [0, 1], [2, 3]],
        ),  # 8 blocks to an id; the 150-token row shares the first 128
        (512, 128, [[0, 1, 2, 3], [0, 1, 2, 3, 4], [5, 6]]),  # a block to 4 ids
    ],
)
def test_blocks_recut_keep_shared_prefixes(tmp_path, block_size, new_size, expected):
    tokens = [128, 150, 200] if block_size == 16 else [512, 600, 200]

    def ids(n, first):
        return list(range(first, first + math.ceil(n / block_size)))

    shared = ids(tokens[1], 0)
    rows = [
        row(0, tokens[0], 1, shared[: math.ceil(tokens[0] / block_size)]),
        row(1, tokens[1], 1, shared),
        row(2, tokens[2], 1, ids(tokens[2], 100)),
    ]
    offsets, new = recut_blocks(trace_of(tmp_path, rows), block_size, new_size)
    assert [new[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == expected


def test_recutting_refuses_sizes_that_do_not_nest_and_rows_that_are_not_kvtrace_rows(tmp_path):
    with pytest.raises(ValueError, match="neither a multiple nor a divisor"):
        recut_blocks(trace_of(tmp_path, CHAT), 100, 128)
    with pytest.raises(ValueError, match="row 1 has 1 hash ids for 9 tokens"):
        recut_blocks(trace_of(tmp_path, [row(0, 9, 1, [0])]), 4, 8)


PATHS = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=6), min_size=1, max_size=8)


@settings(max_examples=100, deadline=None)
@given(PATHS, st.sampled_from([(16, 128), (32, 64), (512, 128), (64, 64)]), st.data())
def test_recut_ids_are_equal_exactly_where_the_prompts_are(tmp_path_factory, paths, sizes, data):
    """Rows as paths in a prefix tree of blocks (equal leading choices, equal leading blocks;
    blocks that differ differ in every token), each with a partial last block: two rows share
    their first k new ids exactly when their first k new blocks are the same tokens."""
    block_size, new_size = sizes
    ids_of, rows, tokens = {}, [], []
    for path in paths:
        chain = [ids_of.setdefault(tuple(path[: i + 1]), len(ids_of)) for i in range(len(path))]
        length = (len(path) - 1) * block_size + data.draw(st.integers(1, block_size))
        # a partial last block is its own content: key it by its length too
        chain[-1] = ids_of.setdefault((tuple(path), length % block_size), len(ids_of))
        rows.append(row(0, length, 1, chain))
        tokens.append(
            [
                (
                    tuple(path[: t // block_size + 1]),
                    length if t // block_size == len(path) - 1 else None,
                    t % block_size,
                )
                for t in range(length)
            ]
        )
    trace = trace_of(tmp_path_factory.mktemp("t"), rows)
    offsets, new = recut_blocks(trace, block_size, new_size)
    cut = [new[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
    for i in range(len(rows)):
        for j in range(len(rows)):
            for k in range(min(len(cut[i]), len(cut[j]))):
                same = tokens[i][: (k + 1) * new_size] == tokens[j][: (k + 1) * new_size]
                assert (cut[i][: k + 1] == cut[j][: k + 1]) == same


def test_vllm_reads_the_rows_at_the_block_size_in_seconds(tmp_path):
    """TimedTrace expands each id into chunk-size tokens until input_length is reached and
    multiplies timestamps by the sec multiplier; it reads --num-prompts rows (1,000 by default)
    of one file, in order."""
    exported = export(trace_of(tmp_path, CHAT), CONSUMERS["vllm"], 4)
    rows = [json.loads(line) for line in exported.data.decode().splitlines()]
    for r in rows:  # the prompt TimedTrace builds is min(chunk, what is left) per id
        built, left = 0, r["input_length"]
        for _ in r["hash_ids"]:
            built, left = built + min(4, left), left - min(4, left)
        assert built == r["input_length"]
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
    command = CONSUMERS["vllm"].command("f.jsonl", 4, exported.rows).split()
    assert command[command.index("--num-prompts") + 1] == "4"
    assert command[command.index("--timed-trace-chunk-hash-size") + 1] == "4"
    assert command[command.index("--timed-trace-sec-multiplier") + 1] == "0.001"


def test_sglang_gets_an_id_per_128_tokens(tmp_path):
    """bench_serving's mooncake dataset writes each id's digits and 128 words and ignores
    input_length: a row's prompt is ~128 tokens per id, so ids are re-cut to 128 tokens."""
    rows = [row(0, 1000, 5, list(range(63))), row(1, 300, 5, list(range(19)))]
    exported = export(trace_of(tmp_path, rows), CONSUMERS["sglang"], 16)
    out = [json.loads(line) for line in exported.data.decode().splitlines()]
    assert [len(r["hash_ids"]) for r in out] == [
        math.ceil(1000 / SGLANG_TOKENS_PER_ID),
        math.ceil(300 / SGLANG_TOKENS_PER_ID),
    ]
    assert out[0]["hash_ids"][:2] == out[1]["hash_ids"][:2]  # the first 256 tokens are shared


def test_the_manifest_commands_run_inside_the_folder_and_export_beside_it():
    commands = replay_commands(16, 10, ["trace-00000-of-00001.jsonl", "stats.json"])
    assert "--input-file trace-00000-of-00001.jsonl" in commands["aiperf"]
    assert commands["sglang"].startswith("kvtrace export . --to sglang -o ../kvtrace.sglang.jsonl")
    two = replay_commands(16, 10, ["trace-00000-of-00002.jsonl", "trace-00001-of-00002.jsonl"])
    assert two["vllm"].startswith("kvtrace export . --to vllm")  # vLLM reads one file


def test_aiperf_follow_ups_carry_no_timestamp_so_it_waits_their_delay(tmp_path):
    """aiperf 0.13's fixed schedule sends a follow-up at its timestamp when it has one."""
    exported = export(trace_of(tmp_path, CHAT), CONSUMERS["aiperf-sessions"], 4)
    rows = [json.loads(line) for line in exported.data.decode().splitlines()]
    assert [("timestamp" in r, r.get("delay")) for r in rows] == [
        (True, None),
        (True, None),
        (False, 700),
        (True, None),
    ]


@pytest.mark.parametrize("to", ["dynamo", "dynamo-delta", "aiperf-sessions"])
def test_a_trace_without_conversations_exports_its_rows_as_they_are(tmp_path, to):
    rows = [row(0, 8, 2, [0, 1]), row(5, 12, 2, [0, 1, 2])]
    exported = export(trace_of(tmp_path, rows), CONSUMERS[to], 4)
    assert [json.loads(line) for line in exported.data.decode().splitlines()] == rows
