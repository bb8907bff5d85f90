"""The log shapes providers keep, through the whole CLI: standard input (`--input -`) gives the
bytes the same log gives as a file; LiteLLM's logs and OpenAI Batch lines come out with the
input lengths the engine's own rendering gives and their times to the ms."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import (
    ROOT,
    anonymize,
    assert_same_output,
    chat,
    published_letters,
    read_jsonl,
    trace,
    write_jsonl,
)

RECORDS = [chat(i, 1_700_000_000_000 + 1000 * i, session=f"s{i % 3}") for i in range(40)]


def stdin_of(monkeypatch, data: bytes) -> None:
    """Standard input as a pipe gives it: bytes under a text wrapper, no terminal."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_standard_input_gives_the_bytes_its_file_gives(
    tiny_tokenizer, tmp_path, monkeypatch, compress
):
    as_file = write_jsonl(tmp_path / "log.jsonl", RECORDS)
    data = as_file.read_bytes()
    if compress:
        data = gzip.compress(data, mtime=0)
        as_file = tmp_path / "log.jsonl.gz"
        as_file.write_bytes(data)
    assert anonymize(tiny_tokenizer, [as_file], tmp_path / "file", "--block-size", "4") == 0
    stdin_of(monkeypatch, data)
    assert anonymize(tiny_tokenizer, ["-"], tmp_path / "stdin", "--block-size", "4") == 0
    assert len(trace(tmp_path / "stdin")) == len(RECORDS)
    assert_same_output(tmp_path / "file", tmp_path / "stdin")


def test_standard_input_letters_name_it_as_given_and_repeat_byte_for_byte(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """A letter of standard input names it `-`, as the user gave it, not the spooled copy's
    random folder: the same input gives the same letters, run after run."""
    data = write_jsonl(tmp_path / "log.jsonl", [*RECORDS[:3], "not json"]).read_bytes()
    letters = []
    for run in ("one", "two"):
        stdin_of(monkeypatch, data)
        assert anonymize(tiny_tokenizer, ["-"], tmp_path / run, "--block-size", "4") == 0
        letters.append(published_letters(tmp_path / f"{run}-rejected").read_bytes())
    assert letters[0] == letters[1]
    assert [letter["source"] for letter in map(json.loads, letters[0].splitlines())] == ["-"]


def test_standard_input_from_a_terminal_is_a_one_line_error(
    tiny_tokenizer, tmp_path, monkeypatch, capsys
):
    leader, follower = os.openpty()
    with open(follower, "rb", closefd=True) as terminal:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(terminal))
        code = anonymize(tiny_tokenizer, ["-"], tmp_path / "out")
    os.close(leader)
    err = capsys.readouterr().err
    assert code != 0 and "standard input, which is a terminal" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


class Untouchable(io.RawIOBase):
    """A pipe that stays open: any read of it is a failure of the test, never a wait."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        raise AssertionError("standard input was read before the run's checks passed")


def refused_without_reading_standard_input(
    tiny_tokenizer, out: Path, monkeypatch, capsys, *bad: str
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(Untouchable())))
    code = anonymize(tiny_tokenizer, ["-"], out, "--block-size", "4", *bad)
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err and "before the run's checks" not in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "bad",
    [
        ["--block-size", "0"],
        ["--tokenizer", "/nonexistent/tok"],
        ["--emit-block-hashes"],  # checked once the tokenizer is loaded
        ["--config", "/nonexistent.yaml"],
    ],
    ids=["option", "tokenizer", "late-check", "config"],
)
def test_a_run_that_cannot_start_refuses_before_reading_standard_input(
    tiny_tokenizer, tmp_path, monkeypatch, capsys, bad
):
    """Options, config files and the tokenizer are all checked before stdin is spooled: a
    refused run never waits for, nor copies, a pipe."""
    refused_without_reading_standard_input(
        tiny_tokenizer, tmp_path / "out", monkeypatch, capsys, *bad
    )


def test_an_output_another_run_holds_is_refused_before_reading_standard_input(
    tiny_tokenizer, tmp_path, monkeypatch, capsys
):
    from kvtrace.transforms.write.publish import output_lock

    with output_lock(str(tmp_path / "out")):  # another run of the same output
        refused_without_reading_standard_input(
            tiny_tokenizer, tmp_path / "out", monkeypatch, capsys
        )


@pytest.mark.beam
@pytest.mark.parametrize("runner", ["FlinkRunner", "DataflowRunner", "PortableRunner"])
def test_standard_input_on_a_remote_runner_is_refused_before_reading_it(
    tiny_tokenizer, tmp_path, monkeypatch, capsys, runner
):
    """Standard input is spooled to a file of this process's (/proc/PID/fd/N), which a remote
    runner's workers cannot open: refused up front, never a job whose every read fails."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(Untouchable())))
    code = anonymize(
        tiny_tokenizer, ["-"], tmp_path / "out", "--engine", "beam", "--runner", runner
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [
        "error: --input - is spooled on this machine, where a remote runner's workers cannot "
        "read it: give the log as a file they can reach (gs://, s3://, a shared path)"
    ]
    assert not (tmp_path / "out").exists()


def test_a_closed_standard_input_is_refused_in_one_line(
    tiny_tokenizer, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(sys, "stdin", None)  # `<&-`: Python has no stdin at all
    assert anonymize(tiny_tokenizer, ["-"], tmp_path / "out", "--block-size", "4") != 0
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "error: --input - reads standard input, which is closed: pipe a log in"
    ]
    assert not (tmp_path / "out").exists()


def test_standard_input_beside_files_and_in_a_config_file_is_read_once(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """`-` among file inputs adds stdin's records to theirs, the same whether the input list
    comes from flags or a --config file, and named twice it is still read once."""
    first = write_jsonl(tmp_path / "a.jsonl", RECORDS[:20])
    rest = write_jsonl(tmp_path / "b.jsonl", RECORDS[20:])
    assert anonymize(tiny_tokenizer, [first, rest], tmp_path / "files", "--block-size", "4") == 0
    stdin_of(monkeypatch, rest.read_bytes())
    assert (
        anonymize(tiny_tokenizer, [first, "-", "-"], tmp_path / "flags", "--block-size", "4") == 0
    )
    config = tmp_path / "run.yaml"
    config.write_text(f'input: ["{first}", "-"]\nblock_size: 4\n')
    stdin_of(monkeypatch, rest.read_bytes())
    assert anonymize(tiny_tokenizer, [], tmp_path / "config", "--config", str(config)) == 0
    assert_same_output(tmp_path / "files", tmp_path / "flags")
    assert_same_output(tmp_path / "files", tmp_path / "config")


def test_standard_input_piped_into_the_command(tiny_tokenizer, tmp_path):
    log = write_jsonl(tmp_path / "log.jsonl", RECORDS)
    assert anonymize(tiny_tokenizer, [log], tmp_path / "file", "--block-size", "4") == 0
    command = [sys.executable, "-m", "kvtrace.cli", "anonymize", "--input", "-"]
    command += ["--output", str(tmp_path / "stdin"), "--tokenizer", tiny_tokenizer]
    spool_folder = tmp_path / "tmp"
    spool_folder.mkdir()
    proc = subprocess.run(
        [*command, "--block-size", "4"],
        cwd=ROOT,
        input=gzip.compress(log.read_bytes()),
        capture_output=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(spool_folder)},
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert_same_output(tmp_path / "file", tmp_path / "stdin")
    assert not any(spool_folder.iterdir())  # the spooled copy is gone with the run


# ---- Providers' shapes, whole runs on a shipped tokenizer ------------------------------------

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}
CHAT = [{"role": "user", "content": "Weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
RESPONSE = {"created": 1_732_700_009, "choices": [{"message": {"content": "Sunny."}}]}


def provider_records() -> list[dict]:
    litellm_payload = {
        "startTime": 1_732_700_000.25,
        "endTime": 1_732_700_001.5,
        "messages": CHAT,
        "model_parameters": {"tools": TOOLS},
        "response": {**RESPONSE, "usage": {"completion_tokens": 3}},
        "completion_tokens": 3,
    }
    spend_log = {
        "startTime": "2024-11-27T09:33:20.75Z",
        "endTime": "2024-11-27T09:33:22Z",
        "messages": {},
        "response": {},
        "completion_tokens": 4,
        "proxy_server_request": {"messages": CHAT, "tools": TOOLS},
    }
    batch_line = {
        "custom_id": "r1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": CHAT, "tools": TOOLS},
        "response": {
            "status_code": 200,
            "request_id": "q",
            "body": {**RESPONSE, "usage": {"completion_tokens": 5}},
        },
        "error": None,
    }
    anthropic = {
        "timestamp": 1_732_700_003_000,
        "max_tokens": 64,
        "tools": [{"name": "get_weather", "input_schema": {"properties": WEATHER["properties"]}}],
        "messages": CHAT,
        "output_length": 6,
    }
    return [litellm_payload, spend_log, batch_line, anthropic]


def test_provider_shapes_come_out_as_the_engine_renders_them(qwen3_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    log = write_jsonl(tmp_path / "log.jsonl", provider_records())
    out = tmp_path / "out"
    assert anonymize(qwen3_tokenizer, [log], out, "--block-size", "16") == 0
    rows = sorted(trace(out), key=lambda row: row["timestamp"])
    auto = AutoTokenizer.from_pretrained(qwen3_tokenizer)
    served = [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": None, "parameters": WEATHER},
        }
    ]
    expected = len(
        auto.encode(
            auto.apply_chat_template(
                CHAT, tools=served, tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        )
    )
    # Arrivals to the ms: LiteLLM's start times, the Anthropic record's timestamp, the Batch
    # response's whole second; each with the engine's input length (the Anthropic schema without
    # a type gets it last: other bytes, the same tokens' count here is not assumed).
    assert [row["timestamp"] for row in rows] == [0, 500, 2750, 8750]
    assert [row["output_length"] for row in rows] == [3, 4, 6, 5]
    assert [row["input_length"] for row in rows if row["output_length"] != 6] == [expected] * 3
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["records"] == {"exported": 4}


# ---- The examples, the Batch files joined by the run ----------------------------------------

PROVIDERS = ROOT / "examples" / "providers"
BATCH_FILES = [PROVIDERS / "batch_input.jsonl", PROVIDERS / "batch_output.jsonl"]


def test_every_provider_example_is_exported_the_batch_files_as_the_api_leaves_them(
    tiny_tokenizer, tmp_path
):
    inputs = [
        *(PROVIDERS / f"{name}.jsonl" for name in ("litellm_payload", "litellm_spend_logs")),
        PROVIDERS / "anthropic_tools.jsonl",
        *BATCH_FILES,
    ]
    assert anonymize(tiny_tokenizer, inputs, tmp_path / "out", "--block-size", "4") == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["records"] == {"exported": 8}  # the 4 Batch lines are 2 requests
    assert not (tmp_path / "out-rejected").exists()


@pytest.mark.parametrize("alone", BATCH_FILES, ids=["input", "output"])
def test_a_batch_file_without_its_other_half_is_letters_naming_the_file_to_give(
    tiny_tokenizer, tmp_path, alone
):
    inputs = [PROVIDERS / f"{name}.jsonl" for name in ("litellm_payload", "anthropic_tools")]
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [*inputs, alone], out, "--max-rejected-fraction", "0.5") == 0
    letters = read_jsonl(published_letters(Path(f"{out}-rejected")))
    assert [letter["error"] for letter in letters] == ["unjoined_batch"] * 2
    other = "output" if "input" in alone.name else "input"
    assert all(f"give its {other} file to the same run" in x["message"] for x in letters)


# ---- Bodies kept as their text ---------------------------------------------------------------


def _as_text(record: dict) -> dict:
    """A record as a log keeping its bodies as text has it: each request or response object as
    its JSON text (a spend-log table's JSON columns), a streamed response as its raw events."""
    text = dict(record)
    for name in ("request", "proxy_server_request"):
        if isinstance(record.get(name), dict):
            text[name] = json.dumps(record[name])
    response = record.get("response")
    if isinstance(response, list):
        events = "".join(f"event: chunk\ndata: {json.dumps(chunk)}\n\n" for chunk in response)
        text["response"] = events + "data: [DONE]\n\n"
    elif isinstance(response, dict):
        text["response"] = json.dumps(response)
    return text


@pytest.mark.parametrize("kept", ["jsonl", "parquet"])
def test_bodies_kept_as_text_give_the_bytes_their_json_twin_gives(tiny_tokenizer, tmp_path, kept):
    """A spend-log table's JSON columns as text, in JSONL or Parquet, and a raw event stream."""
    chunks = [
        {"created": 1_732_700_010, "choices": [{"index": 0, "delta": {"content": "Sun"}}]},
        {"created": 1_732_700_010, "choices": [{"index": 0, "delta": {"content": "ny."}}]},
        {"created": 1_732_700_010, "choices": [], "usage": {"completion_tokens": 2}},
    ]
    streamed = {
        "startTime": "2024-11-27T09:33:24.5Z",
        "proxy_server_request": {"messages": CHAT, "stream": True},
        "response": chunks,
    }
    spend_log = {k: v for k, v in provider_records()[1].items() if k != "messages"}
    records = [spend_log, streamed]
    source = write_jsonl(tmp_path / "json.jsonl", records)
    assert anonymize(tiny_tokenizer, [source], tmp_path / "json", "--block-size", "4") == 0
    text = [_as_text(record) for record in records]
    if kept == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        source = tmp_path / "text.parquet"
        pq.write_table(pa.Table.from_pylist(text), source)
    else:
        source = write_jsonl(tmp_path / "text.jsonl", text)
    assert anonymize(tiny_tokenizer, [source], tmp_path / "text", "--block-size", "4") == 0
    assert_same_output(tmp_path / "json", tmp_path / "text")
    assert [row["output_length"] for row in trace(tmp_path / "text")] == [4, 2]
