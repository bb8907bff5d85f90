"""The agent and cache-simulator forms (transforms/replay/agentic.py), checked against their
readers as read from source: Dynamo 1.6.1 (`lib/mocker` replay loadgen: `AgenticMooncakeHeader`,
`AgenticMooncakeRow`, `AgenticDependency`; its Weka importer `WekaTrace`, `WekaRequest`), aiperf
0.13 (`aiperf/dataset/loader/weka_trace_models.py`: `WekaTrace`, extra fields forbidden, scope
`local` only) and libCacheSim (`reader/oracleGeneral`: 24 packed bytes a request). Their own
code reads the exports in tests/e2e/test_consumers.py where it installs."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from kvtrace.transforms.read.trace_io import read_trace
from kvtrace.transforms.replay.agentic import AGENTIC_SCHEMA, NEVER_AGAIN, ORACLE_GENERAL, next_uses
from kvtrace.transforms.replay.export import export
from kvtrace.transforms.write.replayers import CONSUMERS, replay_commands

CHAT = [  # block size 4: session 7's three turns, a lone request between
    {"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [0, 1], "session": 7},
    {"timestamp": 100, "input_length": 5, "output_length": 1, "hash_ids": [2, 3]},
    {"timestamp": 1_000, "input_length": 16, "output_length": 3, "hash_ids": [0, 1, 4, 5]},
    {"timestamp": 5_000, "input_length": 6, "output_length": 1, "hash_ids": [6, 7]},
]
CHAT[2]["session"] = CHAT[3]["session"] = 7
CHAT[0]["response_ms"], CHAT[3]["response_ms"] = 300, 50

AGENTIC_ROW = {"request_id", "play_id", "session_id", "model", "input_length", "output_length"}
AGENTIC_ROW |= {"hash_ids", "not_before_ms", "dependencies"}
WEKA_TRACE = {"id", "models", "block_size", "hash_id_scope", "requests"}
WEKA_REQUEST = {"t", "type", "model", "in", "out", "hash_ids", "api_time", "think_time"}


def trace_of(tmp_path, rows: list[dict]):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return read_trace([str(path)])


def lines(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines()]


def test_agentic_rows_chain_each_follow_up_to_the_previous_turns_completion(tmp_path):
    exported = export(trace_of(tmp_path, CHAT), CONSUMERS["dynamo-agentic"], 4)
    header, *rows = lines(exported.data)
    assert header["schema"] == AGENTIC_SCHEMA and header["version"] == 2
    assert header["block_size"] == 4 and header["hash_id_scope"] == "local"
    assert all(set(r) <= AGENTIC_ROW for r in rows)
    assert [r["play_id"] for r in rows] == ["s7", "r1", "s7", "s7"]
    assert [r["not_before_ms"] for r in rows] == [0, 100, 1_000, 5_000]
    assert [r.get("dependencies") for r in rows] == [
        None,
        None,
        [{"request_id": "r0", "trigger": "completion", "delay_ms": 700, "relation": "sequence"}],
        [{"request_id": "r2", "trigger": "completion", "delay_ms": 4_000, "relation": "sequence"}],
    ]
    assert (exported.follow_up_turns, exported.without_response_end) == (2, 1)
    # the same trace, the same bytes (the header's digest is the rows')
    assert export(trace_of(tmp_path, CHAT), CONSUMERS["dynamo-agentic"], 4).data == exported.data


def test_weka_holds_one_conversation_per_line_in_seconds_with_known_waits(tmp_path):
    exported = export(trace_of(tmp_path, CHAT), CONSUMERS["weka"], 4)
    conversations = lines(exported.data)
    assert [c["id"] for c in conversations] == ["s7", "r1"]
    assert all(set(c) == WEKA_TRACE and c["hash_id_scope"] == "local" for c in conversations)
    requests = conversations[0]["requests"]
    assert all(set(r) <= WEKA_REQUEST and r["type"] == "n" for r in requests)
    assert [r["t"] for r in requests] == [0.0, 1.0, 5.0]
    assert [r.get("api_time") for r in requests] == [0.3, None, 0.05]
    # a wait is known only after a response whose end was logged
    assert [r.get("think_time") for r in requests] == [None, 0.7, None]
    assert [r["hash_ids"] for r in requests] == [[0, 1], [0, 1, 4, 5], [6, 7]]


def test_oracle_general_is_every_block_in_arrival_order_with_its_next_use(tmp_path):
    exported = export(trace_of(tmp_path, CHAT), CONSUMERS["libcachesim"], 4)
    assert len(exported.data) == 10 * struct.calcsize("<IQIq") == 10 * ORACLE_GENERAL.itemsize
    records = np.frombuffer(exported.data, dtype=ORACLE_GENERAL)
    assert records["id"].tolist() == [0, 1, 2, 3, 0, 1, 4, 5, 6, 7]
    assert records["time"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 5, 5]
    assert set(records["size"].tolist()) == {4}
    assert records["next"].tolist() == [4, 5] + [NEVER_AGAIN] * 8


def test_next_uses_point_at_the_next_request_of_the_same_block():
    ids = np.array([3, 1, 3, 3, 1, 2])
    assert next_uses(ids).tolist() == [2, 4, 3, NEVER_AGAIN, NEVER_AGAIN, NEVER_AGAIN]
    assert next_uses(np.zeros(0, np.int64)).tolist() == []


def test_the_manifest_names_each_structure_export_with_its_file_suffix():
    commands = replay_commands(4, 3, ["trace-00000-of-00001.jsonl"])
    assert "-o ../kvtrace.libcachesim.oracleGeneral.bin" in commands["libcachesim"]
    assert "trace_format='agentic_mooncake'" in commands["dynamo-agentic"]
    assert "trace_format='weka'" in commands["weka"]


def test_oracle_general_counts_seconds_from_the_first_request_whatever_the_clock(tmp_path):
    """A foreign trace's epoch or negative times still fit libCacheSim's unsigned 32 bits."""
    rows = [dict(r, timestamp=r["timestamp"] - 2_000) for r in CHAT]
    rows[0]["timestamp"] = -2_500
    data = export(trace_of(tmp_path, rows), CONSUMERS["libcachesim"], 4).data
    assert np.frombuffer(data, dtype=ORACLE_GENERAL)["time"].tolist() == [0] * 4 + [1] * 4 + [5] * 2
    assert export(trace_of(tmp_path, []), CONSUMERS["libcachesim"], 4).data.nbytes == 0


# parent_row (anonymize --emit-parents): row 1 (no session) continues row 0, and so does row 2
# (a branch); session 3 starts at row 3, spawned by row 1; row 4 is its next turn
LINKED = [
    {"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [0], "response_ms": 100},
    {"timestamp": 300, "input_length": 4, "output_length": 1, "hash_ids": [1], "parent_row": 0},
    {"timestamp": 400, "input_length": 4, "output_length": 1, "hash_ids": [2], "parent_row": 0},
    {"timestamp": 900, "input_length": 4, "output_length": 1, "hash_ids": [3], "session": 3},
    {"timestamp": 950, "input_length": 8, "output_length": 1, "hash_ids": [3, 4], "session": 3},
]
LINKED[3]["parent_row"] = 1


def test_agentic_rows_depend_on_their_parents_branches_and_subagents_included(tmp_path):
    exported = export(trace_of(tmp_path, LINKED), CONSUMERS["dynamo-agentic"], 4)
    _, *rows = lines(exported.data)
    assert [r["play_id"] for r in rows] == ["r0"] * 5  # one play: the agent and its subagent
    assert [r["session_id"] for r in rows] == ["r0", "r0", "r0", "s3", "s3"]
    edges = [
        [(d["request_id"], d["relation"], d["delay_ms"]) for d in r.get("dependencies", [])]
        for r in rows
    ]
    # two branches from r0 (each the gap after its logged end), a spawn, a sequence
    assert edges == [
        [],
        [("r0", "sequence", 200)],
        [("r0", "sequence", 300)],
        [("r1", "spawn", 600)],
        [("r3", "sequence", 50)],
    ]
    assert exported.follow_up_turns == 4


def test_weka_writes_a_spawned_conversation_as_a_subagent_entry_in_its_place(tmp_path):
    (play,) = lines(export(trace_of(tmp_path, LINKED), CONSUMERS["weka"], 4).data)
    assert play["id"] == "r0"
    assert [(r["type"], r["t"]) for r in play["requests"]] == [
        ("n", 0.0),
        ("n", 0.3),
        ("n", 0.4),
        ("subagent", 0.9),
    ]
    entry = play["requests"][-1]
    assert (entry["agent_id"], entry["status"]) == ("s3", "completed")
    assert [(r["t"], r["hash_ids"]) for r in entry["requests"]] == [(0.9, [3]), (0.95, [3, 4])]


def test_a_parent_row_that_does_not_precede_its_row_is_refused_in_one_line(tmp_path):
    rows = [dict(LINKED[0], parent_row=0)]
    with pytest.raises(ValueError, match="^row 0's parent_row 0 does not precede it"):
        export(trace_of(tmp_path, rows), CONSUMERS["dynamo-agentic"], 4)
