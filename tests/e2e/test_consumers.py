"""The trace replays as is in the tools that read it, and `kvtrace export` files replay right in
theirs. Each tool runs in its own environment (each pins its own dependencies):
KVTRACE_AIPERF_PYTHON, KVTRACE_GUIDELLM_PYTHON and KVTRACE_DYNAMO_PYTHON name those
environments' pythons (`.ci/run` builds them); without them these tests skip."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers import TESTS, agent_log, anonymize, read_jsonl, trace, write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.trace_format import PARENT_FIELD

CONSUMERS = TESTS / "consumers"
SYSTEM = {"role": "system", "content": "You are a helpful assistant. " * 40}


def replay_check(
    variable: str, script: str, trace_file: Path, block_size: int, tokenizer: str, *extra: str
):
    # aiperf's offline mode treats every tokenizer name as a hub id, local folders included.
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    return subprocess.run(
        [
            os.environ[variable],
            str(CONSUMERS / script),
            str(trace_file),
            str(block_size),
            tokenizer,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def conversation(
    session: str, turns: int, start_ms: int, latency_ms: int | None = None
) -> list[dict]:
    """A multi-turn chat logged as serving engines log it: each request holds the whole history
    (and, given latency_ms, how long its response took)."""
    records, history = [], [SYSTEM]
    for turn in range(turns):
        history = [*history, {"role": "user", "content": f"Question {turn} of {session}: why?"}]
        records.append(
            {
                "timestamp": start_ms + 1000 * turn,
                "session_id": session,
                "messages": history,
                "output_length": 20,
            }
        )
        if latency_ms is not None:
            records[-1]["latency_ms"] = latency_ms
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
    return pytest.param(
        variable,
        script,
        id=script.split("_")[0],
        marks=pytest.mark.skipif(
            not given, reason=f"set {variable} to a python with the tool installed (.ci/run does)"
        ),
    )


@pytest.mark.parametrize(
    "variable, script",
    [
        # aiperf: its MooncakeTrace model, no session grouping, exact token sequences per row
        with_tool("KVTRACE_AIPERF_PYTHON", "aiperf_replay.py"),
        # guidellm: its row validation and the token blocks it assigns per row
        with_tool("KVTRACE_GUIDELLM_PYTHON", "guidellm_replay.py"),
    ],
)
def test_replay_tools_rebuild_every_row_exactly_sessions_included(
    deepseek_tokenizer, chat_trace, variable, script
):
    trace_file, rows = chat_trace
    result = replay_check(variable, script, trace_file, 16, deepseek_tokenizer)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["rows"] == rows


@pytest.fixture(scope="module")
def timed_chats(deepseek_tokenizer, tmp_path_factory) -> Path:
    """Conversations whose logs say how long each response took (300 ms), anonymized at block
    size 16, plus a request outside any conversation."""
    tmp = tmp_path_factory.mktemp("timed")
    logs = (
        conversation("alice", 4, 0, latency_ms=300)
        + conversation("bob", 3, 500, 300)
        + [{"timestamp": 200, "prompt": "A lone request. " * 20, "output_length": 5}]
    )
    src = write_jsonl(tmp / "chats.jsonl", logs)
    assert anonymize(deepseek_tokenizer, [src], tmp / "out", "--block-size", "16") == 0
    assert {r.get("response_ms") for r in trace(tmp / "out")} == {300, None}
    return tmp / "out"


def exported(folder: Path, to: str) -> tuple[Path, list[dict]]:
    path = folder.parent / f"{to}.jsonl"
    # the module's tests export the same form more than once: replacing it is asked for
    assert main(["export", str(folder), "--to", to, "-o", str(path), "--overwrite"]) == 0
    return path, [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    "to, trace_format", [("dynamo", "mooncake"), ("dynamo-delta", "mooncake-delta")]
)
@pytest.mark.parametrize(
    "variable, script", [with_tool("KVTRACE_DYNAMO_PYTHON", "dynamo_replay.py")]
)
def test_dynamo_replays_each_turn_whole_after_its_think_time(
    timed_chats, variable, script, to, trace_format, tmp_path
):
    """Dynamo's own reader and simulated engine: every request has its whole prompt (a delta
    turn rebuilt from the previous prompt, the generated answer and the delta) and each follow-up
    turn arrives 1000 - 300 = 700 ms after the previous response ended."""
    path, rows = exported(timed_chats, to)
    _, whole = exported(timed_chats, "dynamo")
    turn_of: dict = {}
    expected = []
    for row, full in zip(rows, whole):
        entry = {"prompt": full["input_length"], "delay": row.get("delay")}
        if "session_id" in row:
            entry["session"], entry["turn"] = row["session_id"], turn_of.get(row["session_id"], 0)
            turn_of[row["session_id"]] = entry["turn"] + 1
        expected.append(entry)
    assert [e["delay"] for e in expected if e["delay"] is not None] == [700] * 5
    expected_file = tmp_path / "expected.json"
    expected_file.write_text(json.dumps({"rows": expected}))
    result = subprocess.run(
        [
            os.environ[variable],
            str(CONSUMERS / script),
            str(path),
            trace_format,
            "16",
            str(expected_file),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"rows": 8, "delays": 5}


@pytest.mark.parametrize(
    "variable, script", [with_tool("KVTRACE_AIPERF_PYTHON", "aiperf_replay.py")]
)
def test_aiperf_reads_exported_sessions_with_their_delays(
    deepseek_tokenizer, timed_chats, variable, script
):
    path, rows = exported(timed_chats, "aiperf-sessions")
    assert sum("delay" in r for r in rows) == 5
    result = replay_check(variable, script, path, 16, deepseek_tokenizer, "sessions")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["rows"] == len(rows)


@pytest.mark.parametrize(
    "variable, script", [with_tool("KVTRACE_GUIDELLM_PYTHON", "guidellm_replay.py")]
)
def test_guidellm_parses_the_printed_data_option_to_our_block_size_and_unit(variable, script):
    """The `--data` value of the command kvtrace prints, through guidellm's own parser."""
    from kvtrace.transforms.write.replayers import CONSUMERS

    command = CONSUMERS["guidellm"].command("trace.jsonl", 64, 10).split()
    data = command[command.index("--data") + 1]
    code = (
        "import json, sys; from guidellm.utils.arg_string import loads; "
        "from guidellm.schemas.data.deserializers import MooncakeTraceFormatArgs; "
        "a = MooncakeTraceFormatArgs.model_validate(loads(sys.argv[1])); "
        "print(json.dumps([a.hash_id_block_size, a.time_scale, str(a.source.path)]))"
    )
    result = subprocess.run(
        [os.environ[variable], "-c", code, data], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == [64, 0.001, "trace.jsonl"]


def expected_chains(folder: Path, trace_format: str) -> list[list[dict]]:
    """The conversations of a trace's rows as Dynamo must replay them (dynamo_agentic.py): per
    turn its prompt, the ms it may start from and the wait after the previous turn's end (the
    gap less the logged response time)."""
    chains: dict = {}
    for row in sorted(trace(folder), key=lambda r: r["timestamp"]):
        chains.setdefault(row.get("session", f"lone{row['timestamp']}"), []).append(row)
    conversations = []
    for rows in chains.values():
        origin = rows[0]["timestamp"] if trace_format == "weka" else 0
        turns = []
        for before, row in zip([None, *rows], rows):
            wait = None
            if before is not None:
                wait = row["timestamp"] - before["timestamp"] - before.get("response_ms", 0)
            turns.append({"prompt": row["input_length"], "not_before": row["timestamp"] - origin})
            turns[-1]["wait"] = wait
        conversations.append(turns)
    return conversations


@pytest.mark.parametrize(
    "to, trace_format", [("dynamo-agentic", "agentic_mooncake"), ("weka", "weka")]
)
@pytest.mark.parametrize(
    "variable, script", [with_tool("KVTRACE_DYNAMO_PYTHON", "dynamo_agentic.py")]
)
def test_dynamo_replays_each_conversation_as_one_chain_with_its_waits(
    timed_chats, variable, script, to, trace_format, tmp_path
):
    """Dynamo's own agentic readers and simulated engine: every conversation one chain, each
    follow-up dispatched at max(its logged start, the previous turn's end + 700 ms)."""
    path = tmp_path / f"{to}.jsonl"  # Dynamo reads a Weka file of several lines by its suffix
    assert main(["export", str(timed_chats), "--to", to, "-o", str(path)]) == 0
    expected_file = tmp_path / "expected.json"
    chains = expected_chains(timed_chats, trace_format)
    assert sorted(t["wait"] for c in chains for t in c if t["wait"] is not None) == [700] * 5
    expected_file.write_text(json.dumps({"conversations": chains}))
    result = subprocess.run(
        [os.environ[variable], str(CONSUMERS / script), str(path), trace_format, "16"]
        + [str(expected_file)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-2000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary | {"first_turns_reused": 0} == {
        "rows": 8,
        "chains": 3,
        "waits": 5,
        "first_turns_reused": 0,
    }
    # Both declare hash_id_scope local. Dynamo's agentic reader keeps one namespace for the
    # file: bob's first turn finds the system prompt alice's left cached. Its Weka importer
    # replays each conversation from 0, so no first turn can find another's blocks.
    assert (summary["first_turns_reused"] > 0) == (trace_format == "agentic_mooncake")


@pytest.mark.parametrize("variable, script", [with_tool("KVTRACE_AIPERF_PYTHON", "aiperf_weka.py")])
def test_aiperf_weka_schema_accepts_every_exported_conversation(timed_chats, variable, script):
    path, conversations = exported(timed_chats, "weka")
    result = subprocess.run(
        [os.environ[variable], str(CONSUMERS / script), str(path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "conversations": 3,
        "requests": sum(len(c["requests"]) for c in conversations),
    }


def test_libcachesim_reads_every_block_request_and_misses_each_block_once(timed_chats, tmp_path):
    """libCacheSim's own reader takes the oracleGeneral file request for request, and its
    unbounded LRU misses exactly the distinct blocks: the trace's infinite-cache block rate."""
    lcs = pytest.importorskip("libcachesim")
    path = tmp_path / "blocks.oracleGeneral.bin"
    assert main(["export", str(timed_chats), "--to", "libcachesim", "-o", str(path)]) == 0
    rows = sorted(trace(timed_chats), key=lambda r: r["timestamp"])
    ids = [i for r in rows for i in r["hash_ids"]]
    reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    assert [(q.obj_id, q.obj_size) for q in reader] == [(i, 16) for i in ids]
    reader.reset()
    miss_ratio, _ = lcs.LRU(cache_size=16 * len(ids)).process_trace(reader)
    assert miss_ratio == pytest.approx(len(set(ids)) / len(ids))


@pytest.mark.parametrize(
    "variable, script", [with_tool("KVTRACE_GUIDELLM_PYTHON", "guidellm_weka.py")]
)
def test_guidellm_reads_every_exported_conversation_as_one_chain_of_turns(
    deepseek_tokenizer, timed_chats, variable, script
):
    path, conversations = exported(timed_chats, "weka")
    result = replay_check(variable, script, path, 16, deepseek_tokenizer)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"conversations": 3, "turns": 8}


def shared_prefix_trace(path: Path, requests: int = 400, seed: int = 1) -> Path:
    """Whole-block requests, each extending an earlier one's prefix or new, 200 ms apart, one
    output token (the mocker caches what it decodes too: one token never fills a block)."""
    import random

    chooser, rows, fresh = random.Random(seed), [], 0
    for index in range(requests):
        ids: list[int] = []
        if rows and chooser.random() < 0.7:
            earlier = chooser.choice(rows)["hash_ids"]
            ids = earlier[: chooser.randint(1, len(earlier))]
        extra = chooser.randint(1, 6)
        ids, fresh = [*ids, *range(fresh, fresh + extra)], fresh + extra
        rows.append(
            {
                "timestamp": 200 * index,
                "input_length": 16 * len(ids),
                "output_length": 1,
                "hash_ids": ids,
            }
        )
    return write_jsonl(path, rows)


@pytest.mark.parametrize("gpu_blocks", [50, 100, 200, 400])
@pytest.mark.parametrize(
    "variable, script", [with_tool("KVTRACE_DYNAMO_PYTHON", "dynamo_cached_tokens.py")]
)
def test_calibration_recovers_the_dynamo_mockers_capacity_and_hit_rate(
    variable, script, gpu_blocks, deepseek_tokenizer, tmp_path
):
    """Logs an engine's cache manager produced: Dynamo's mocker replays a trace with a cache of
    gpu_blocks blocks and logs each request as an OpenAI server's log (token ids, usage with
    its cached tokens); anonymized, the counts go only to the run's private measured file and,
    aggregated, to stats.json, which the gate accepts; calibrated against the trace, the lru
    capacity is within 10% of the mocker's and the simulated hit rate within 1 point."""
    trace_file = shared_prefix_trace(tmp_path / "trace.jsonl")
    logs = tmp_path / "logs.jsonl"
    result = subprocess.run(
        [
            os.environ[variable],
            str(CONSUMERS / script),
            str(trace_file),
            "16",
            str(gpu_blocks),
            str(logs),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    mocker = json.loads(result.stdout.strip().splitlines()[-1])
    out = tmp_path / "out"
    assert anonymize(deepseek_tokenizer, [logs], out, "--block-size", "16") == 0
    assert "cached" not in (out / "trace-00000-of-00001.jsonl").read_text()
    assert json.loads((out / "stats.json").read_text())["measured"]["hit_rate"] == pytest.approx(
        mocker["reused_ratio"]
    )
    assert main(["audit", str(out), "--tokenizer", deepseek_tokenizer]) == 0
    (measured,) = Path(f"{out}-rejected").glob("measured-*.jsonl")
    assert measured.stat().st_mode & 0o077 == 0  # owner-only
    report = tmp_path / "fit.json"
    assert main(["calibrate", str(out), "--measured", str(measured), "--json", str(report)]) == 0
    fitted = json.loads(report.read_text())
    assert fitted["measured"]["hit_rate"] == pytest.approx(mocker["reused_ratio"])
    lru = fitted["policies"]["lru"]
    assert lru["verdict"] is None, lru
    assert abs(lru["capacity_tokens"] - 16 * gpu_blocks) <= 0.1 * 16 * gpu_blocks, lru
    assert abs(lru["hit_rate_difference"]) <= 0.01, lru


@pytest.fixture(scope="module")
def agent_trace(tiny_tokenizer, tmp_path_factory) -> Path:
    """agent_log anonymized with --emit-parents: a subagent, two branches, a tool result."""
    tmp = tmp_path_factory.mktemp("agent")
    src = write_jsonl(tmp / "agent.jsonl", [record for record, _ in agent_log()])
    extra = ("--block-size", "4", "--emit-parents")
    assert anonymize(tiny_tokenizer, [src], tmp / "out", *extra) == 0
    return tmp / "out"


@pytest.fixture(scope="module")
def subagent_trace(agent_trace, tmp_path_factory) -> Path:
    """agent_trace with its rows 1 and 2 a conversation of their own, spawned from row 0: a
    subagent, which no log makes since a fork by `previous_response_id` is a stored_context
    letter (docs/ANONYMIZE.md), kept so the exports' subagent forms stay replayed."""
    rows = trace(agent_trace)
    spawned = 1 + max(row.get("session", -1) for row in rows)
    for index in (1, 2):
        rows[index]["session"] = spawned
    return write_jsonl(tmp_path_factory.mktemp("subagent") / "subagent.jsonl", rows)


SUBAGENT_EXPORT = ("--block-size", "4")  # subagent_trace is a trace file: no manifest beside


def linked_rows(rows: list[dict]) -> list[dict]:
    """Each row as Dynamo must replay it (dynamo_links.py): its predecessor is its parent_row,
    else its session's previous row, and it waits the gap after that one's logged end."""
    expected, last = [], {}
    for index, row in enumerate(rows):
        after = row.get(PARENT_FIELD, last.get(row.get("session")))
        wait = None
        if after is not None:
            before = rows[after]
            wait = row["timestamp"] - before["timestamp"] - before.get("response_ms", 0)
        if "session" in row:
            last[row["session"]] = index
        expected.append(
            {"prompt": row["input_length"], "not_before": row["timestamp"], "after": after}
        )
        expected[-1]["wait"] = wait
    return expected


@pytest.mark.parametrize(
    "variable, script", [with_tool("KVTRACE_DYNAMO_PYTHON", "dynamo_links.py")]
)
def test_dynamo_replays_subagents_branches_and_tool_results_as_linked(
    subagent_trace, variable, script, tmp_path
):
    """Dynamo's own agentic reader and simulated engine: each row waits on the row it
    continues; a subagent's conversation spawns from its parent's, two branches wait on one."""
    path = tmp_path / "agentic.jsonl"
    assert (
        main(
            [
                "export",
                str(subagent_trace),
                "--to",
                "dynamo-agentic",
                "-o",
                str(path),
                *SUBAGENT_EXPORT,
            ]
        )
        == 0
    )
    expected = tmp_path / "expected.json"
    expected.write_text(json.dumps({"rows": linked_rows(read_jsonl(subagent_trace))}))
    result = subprocess.run(
        [os.environ[variable], str(CONSUMERS / script), str(path), "4", str(expected)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-2000:]
    # plays: the agent with its subagent and branches, the tool-calling chat, the lone row;
    # edges: the subagent's two, two branches, the tool result; row 0 has three children
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "rows": 8,
        "plays": 3,
        "dependencies": 5,
        "spawns": 1,
        "branch_points": 1,
    }


@pytest.mark.parametrize(
    "variable, script",
    [
        with_tool("KVTRACE_AIPERF_PYTHON", "aiperf_weka.py"),
        with_tool("KVTRACE_DYNAMO_PYTHON", "dynamo_weka_rows.py"),
    ],
)
def test_weka_readers_take_the_subagent_entries(subagent_trace, variable, script, tmp_path):
    """The subagent's conversation is a `subagent` entry of its parent's play: aiperf's own
    schema accepts it (extra fields forbidden) and Dynamo's Weka importer replays every row."""
    path = tmp_path / "agent.weka.jsonl"
    assert (
        main(["export", str(subagent_trace), "--to", "weka", "-o", str(path), *SUBAGENT_EXPORT])
        == 0
    )
    plays = [json.loads(line) for line in path.read_text().splitlines()]
    (entry,) = [r for play in plays for r in play["requests"] if r["type"] == "subagent"]
    assert [r["t"] for r in entry["requests"]] == [0.5, 0.8]
    result = subprocess.run(
        [os.environ[variable], str(CONSUMERS / script), str(path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-2000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["conversations"] == 3
    assert summary["requests"] == (8 if "dynamo" in script else 7)  # aiperf: outer entries


@pytest.mark.parametrize(
    "variable, script", [with_tool("KVTRACE_GUIDELLM_PYTHON", "guidellm_weka_graph.py")]
)
def test_guidellm_replays_the_subagent_as_a_chain_spawned_from_its_parent(
    subagent_trace, variable, script, deepseek_tokenizer, tmp_path
):
    """guidellm's own WEKA reader builds the subagent's two requests as a chain of their own,
    spawned with a new history from the request they continue; the agent's next turn joins it
    (the WEKA format's rule: a parent's next request follows its subagent)."""
    path = tmp_path / "agent.weka.jsonl"
    assert (
        main(["export", str(subagent_trace), "--to", "weka", "-o", str(path), *SUBAGENT_EXPORT])
        == 0
    )
    result = replay_check(variable, script, path, 4, deepseek_tokenizer)
    assert result.returncode == 0, result.stderr[-2000:]
    turns = json.loads(result.stdout.strip().splitlines()[-1])["turns"]
    rows = read_jsonl(subagent_trace)
    assert len(turns) == len(rows)
    play = [t for t in turns if t["play"] == turns[0]["play"]]
    sub = [t for t in play if t["agent"] != play[0]["agent"]]
    assert [t["prompt"] for t in sub] == [rows[1]["input_length"], rows[2]["input_length"]]
    assert sub[0]["parents"] == [[play[0]["node"], "new"]]
    assert sub[1]["parents"] == [[sub[0]["node"], "full"]]
