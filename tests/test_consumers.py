"""The trace replays as is in the tools that read it. Each tool runs in its own environment (each
pins its own dependencies): KVTRACE_AIPERF_PYTHON and KVTRACE_GUIDELLM_PYTHON name those
environments' pythons (`.ci/run` builds them); without them these tests skip."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import write_jsonl
from test_anonymize import anonymize, trace

CONSUMERS = Path(__file__).parent / "consumers"
SYSTEM = {"role": "system", "content": "You are a helpful assistant. " * 40}


def replay_check(variable: str, script: str, trace_file: Path, block_size: int, tokenizer: str):
    # aiperf's offline mode treats every tokenizer name as a hub id, local folders included.
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    return subprocess.run([os.environ[variable], str(CONSUMERS / script), str(trace_file),
                           str(block_size), tokenizer], capture_output=True, text=True,
                          timeout=600, env=env)


def conversation(session: str, turns: int, start_ms: int) -> list[dict]:
    """A multi-turn chat logged as serving engines log it: each request holds the whole history."""
    records, history = [], [SYSTEM]
    for turn in range(turns):
        history = [*history, {"role": "user", "content": f"Question {turn} of {session}: why?"}]
        records.append({"timestamp": start_ms + 1000 * turn, "session_id": session,
                        "messages": history, "output_length": 20})
        history = [*history, {"role": "assistant", "content": f"Because {turn}. " * 30}]
    return records


@pytest.fixture(scope="module")
def chat_trace(deepseek_tokenizer, tmp_path_factory) -> tuple[Path, int]:
    """Two multi-turn conversations anonymized at block size 16: (trace file, rows)."""
    tmp = tmp_path_factory.mktemp("chats")
    logs = conversation("alice", 4, 0) + conversation("bob", 3, 500)
    src = write_jsonl(tmp / "chats.jsonl", logs)
    assert anonymize(deepseek_tokenizer, [src], tmp / "out", "--block-size", "16") == 0
    rows = trace(tmp / "out")
    assert {r["session"] for r in rows} == {0, 1} and all("session_id" not in r for r in rows)
    return tmp / "out" / "trace-00000-of-00001.jsonl", len(logs)


def with_tool(variable: str, script: str):
    """A parameter that skips before the fixtures run when the tool's python is not given."""
    given = bool(os.environ.get(variable)) and Path(os.environ[variable]).exists()
    return pytest.param(variable, script, id=script.split("_")[0], marks=pytest.mark.skipif(
        not given, reason=f"set {variable} to a python with the tool installed (.ci/run does)"))


@pytest.mark.parametrize("variable, script", [
    # aiperf: its MooncakeTrace model, no session grouping, exact token sequences per row
    with_tool("KVTRACE_AIPERF_PYTHON", "aiperf_replay.py"),
    # guidellm: its row validation and the token blocks it assigns per row
    with_tool("KVTRACE_GUIDELLM_PYTHON", "guidellm_replay.py"),
])
def test_replay_tools_rebuild_every_row_exactly_sessions_included(
    deepseek_tokenizer, chat_trace, variable, script
):
    trace_file, rows = chat_trace
    result = replay_check(variable, script, trace_file, 16, deepseek_tokenizer)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["rows"] == rows
