"""anonymize --emit-parents: each row's parent_row is the row its request continues, the same
bytes whatever the input's split, order or worker count, and the gate passes it."""

from __future__ import annotations

import json
import random

import pytest

from helpers import SALT, agent_log, anonymize, assert_same_output, trace, write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.trace_format import PARENT_FIELD


@pytest.fixture(scope="module")
def agent_trace(tiny_tokenizer, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agent")
    src = write_jsonl(tmp / "agent.jsonl", [record for record, _ in agent_log()])
    out = tmp / "out"
    assert anonymize(tiny_tokenizer, [src], out, "--block-size", "4", "--emit-parents") == 0
    return out


def test_each_row_names_the_row_it_continues(agent_trace):
    rows = trace(agent_trace)
    expected = [parent for _, parent in agent_log()]
    assert [row.get(PARENT_FIELD) for row in rows] == expected
    assert all(not isinstance(v, str) for row in rows for v in row.values())


def test_the_gate_passes_the_parents(agent_trace, tiny_tokenizer, capsys):
    report = agent_trace.parent / "audit.json"
    code = main(["audit", str(agent_trace), "--json", str(report), "--tokenizer", tiny_tokenizer])
    capsys.readouterr()
    audit = json.loads(report.read_text())
    assert code == 0 and audit["publishable"], audit["flags"]
    assert audit["fields"][PARENT_FIELD] == sum(p is not None for _, p in agent_log())


def test_the_same_bytes_whatever_the_split_order_and_workers(agent_trace, tiny_tokenizer, tmp_path):
    records = [record for record, _ in agent_log()]
    random.Random(7).shuffle(records)
    parts = [
        write_jsonl(tmp_path / "a.jsonl", records[:3]),
        write_jsonl(tmp_path / "b.jsonl", records[3:]),
    ]
    out = tmp_path / "out"
    extra = ("--block-size", "4", "--emit-parents", "--processes", "2")
    assert anonymize(tiny_tokenizer, parts[::-1], out, *extra) == 0
    assert_same_output(agent_trace, out)


def test_without_the_flag_no_row_has_a_parent(tiny_tokenizer, tmp_path):
    src = write_jsonl(tmp_path / "agent.jsonl", [record for record, _ in agent_log()])
    assert anonymize(tiny_tokenizer, [src], tmp_path / "out", "--block-size", "4") == 0
    assert not any(PARENT_FIELD in row for row in trace(tmp_path / "out"))


def test_a_recorded_nights_rerun_with_the_flag_the_other_way_is_told_why(
    tiny_tokenizer, tmp_path, capsys
):
    """parent_row is part of a night's rows, so the same night with --emit-parents given the
    other way is another night over the map's: refused as that, not as a cut to move."""
    src = write_jsonl(tmp_path / "agent.jsonl", [record for record, _ in agent_log()])
    (tmp_path / "salt").write_text(SALT)
    keyed = ("--block-size", "4", "--salt-file", str(tmp_path / "salt"))
    keyed += ("--id-map", str(tmp_path / "map"))
    assert anonymize(tiny_tokenizer, [src], tmp_path / "n1", *keyed, "--emit-parents") == 0
    capsys.readouterr()
    assert anonymize(tiny_tokenizer, [src], tmp_path / "n1-again", *keyed) != 0
    err = capsys.readouterr().err
    assert "parent_row too" in err and "Cut nights" not in err
    assert not (tmp_path / "n1-again").exists()


@pytest.mark.beam
def test_the_beam_engine_writes_the_same_bytes(agent_trace, tiny_tokenizer, tmp_path):
    """Beam ranks each shard's rows from the shards' counts and resolves each link where its
    key goes: the parents are the local engine's, byte for byte."""
    src = write_jsonl(tmp_path / "agent.jsonl", [record for record, _ in agent_log()][::-1])
    out = tmp_path / "out"
    extra = ("--block-size", "4", "--emit-parents", "--engine", "beam")
    assert anonymize(tiny_tokenizer, [src], out, *extra) == 0
    assert_same_output(agent_trace, out)


def test_a_call_id_links_only_within_a_session(tiny_tokenizer, tmp_path):
    """Clients number calls per conversation (`call_0`): a sessionless request's tool result
    continues nothing, not another conversation's call, while one in a session continues its
    own conversation's call only."""

    def chat(ts: int, session: str | None, answered: bool) -> dict:
        call = {"id": "call_0", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        ask = [{"role": "user", "content": f"List the files of {session} ."}]
        if answered:
            ask += [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_0", "content": "a.txt"},
            ]
        response = {"choices": [{"message": {"role": "assistant", "tool_calls": [call]}}]}
        record = {"timestamp": ts, "messages": ask, "output_length": 2}
        record |= {} if answered else {"response": response}
        return record | ({} if session is None else {"session_id": session})

    records = [chat(0, None, False), chat(100, "s", False), chat(200, None, True)]
    records += [chat(300, "t", True), chat(400, "s", True)]
    src = write_jsonl(tmp_path / "calls.jsonl", records)
    assert (
        anonymize(tiny_tokenizer, [src], tmp_path / "out", "--block-size", "4", "--emit-parents")
        == 0
    )
    assert [row.get(PARENT_FIELD) for row in trace(tmp_path / "out")] == [None] * 4 + [1]
