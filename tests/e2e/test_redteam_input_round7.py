"""Red-team round 7: hostile input to `kvtrace anonymize` and the reading commands, past the
round-1..6 fixes (test_redteam_input*.py): the log shapes added for LiteLLM, standard input, the
trace reader's screened blocks. Each test asserts a promise the tool makes and fails today
(2026-11-27)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from helpers import ROOT

pytestmark = [pytest.mark.slow]
ROUND7 = "red team round 7"


def _kvtrace(args: list[str], timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvtrace.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **kwargs.pop("env", {})},
        **kwargs,
    )


def _trace_rows(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "trace-00000-of-00001.jsonl").open()]


# ---- standard input: a bad option waits for (and copies) the whole of stdin first -------------


@pytest.mark.xfail(strict=True, reason=ROUND7)
@pytest.mark.parametrize("bad", [["--block-size", "0"], ["--tokenizer", "/nonexistent/tok"]])
def test_a_bad_option_is_refused_before_standard_input_is_read(tiny_tokenizer, tmp_path, bad):
    """`--input -` is spooled in anonymize.run before _run checks a single option: a typo in
    the tokenizer or block size is reported only once stdin ends, after copying all of it to
    $TMPDIR (a `tail -f log |` never ends: the run hangs; `yes |` wrote 1.9 GB in 8 s with a
    tokenizer that does not exist). A file input is refused at once."""
    spool = tmp_path / "tmp"
    spool.mkdir()
    args = ["anonymize", "--input", "-", "--output", str(tmp_path / "out"),
            "--tokenizer", tiny_tokenizer, "--block-size", "4", *bad]  # fmt: skip
    line = b'{"prompt": "hello world", "timestamp": 1735689600}\n'
    child = subprocess.Popen(
        [sys.executable, "-m", "kvtrace.cli", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(spool)},
    )
    try:
        child.stdin.write(line)  # a log still being written: the writer keeps the pipe open
        child.stdin.flush()
        try:
            code = child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        assert code is not None and code != 0, "still waiting for stdin to end"
        said = child.stderr.read().decode()
        assert "Traceback" not in said
    finally:
        child.kill()
        child.wait()
        child.stdin.close()
        child.stdout.close()
        child.stderr.close()


# ---- one request, two log shapes, two prompts ------------------------------------------------


def _tool_rendering_tokenizer(tiny_tokenizer, tmp_path) -> str:
    """The tiny tokenizer with a template that renders the tools it is given, as every tool
    calling model's (Qwen3, DeepSeek-R1) does."""
    folder = tmp_path / "tok-tools"
    shutil.copytree(tiny_tokenizer, folder)
    template = (
        "{% if tools %}{{ tools | tojson }}\n{% endif %}"
        "{% for message in messages %}<|im_start|>{{ message.role }}\n"
        "{{ message.content }}<|im_end|>\n{% endfor %}"
    )
    for name in ("chat_template.jinja",):
        if (folder / name).exists():
            (folder / name).write_text(template)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    if "chat_template" in config:
        config["chat_template"] = template
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.xfail(strict=True, reason=ROUND7)
def test_an_anthropic_request_logged_by_litellm_renders_as_in_its_request_envelope(
    tiny_tokenizer, tmp_path
):
    """records._chat tells Anthropic Messages by chat.is_anthropic(body), which looks for
    `input_schema` tools in the body; a LiteLLM standard logging payload keeps the tools in
    `model_parameters` (records._tools), so the same request is read as Chat Completions and its
    Anthropic tools reach the template raw (name, input_schema: no type, function, parameters),
    not normalized as chat.anthropic_tools does for the same request in {"request": ...}.
    Measured with Qwen3's tokenizer: 142 tokens in the envelope, 127 from LiteLLM's payload."""
    tokenizer = _tool_rendering_tokenizer(tiny_tokenizer, tmp_path)
    tools = [
        {
            "name": "get_weather",
            "description": "weather",
            "input_schema": {"properties": {"city": {"type": "string"}}},
        }
    ]
    messages = [{"role": "user", "content": "What is the capital of France ?"}]
    shapes = {
        "envelope": {"timestamp": 1764000000, "request": {"messages": messages, "tools": tools},
                     "output_length": 5},
        "litellm": {"startTime": 1764000000, "messages": messages,
                    "model_parameters": {"tools": tools}, "completion_tokens": 5},
    }  # fmt: skip
    rows = {}
    for name, record in shapes.items():
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(record) + "\n")
        out = tmp_path / f"out-{name}"
        done = _kvtrace(
            ["anonymize", "--input", str(tmp_path / f"{name}.jsonl"), "--output", str(out),
             "--tokenizer", tokenizer, "--block-size", "4"]  # fmt: skip
        )
        assert done.returncode == 0, done.stderr[-2000:]
        rows[name] = _trace_rows(out)
    assert rows["envelope"][0]["input_length"] == rows["litellm"][0]["input_length"]
    assert rows["envelope"] == rows["litellm"]


# ---- the trace reader: a row's fate decided by another row ---------------------------------


@pytest.mark.xfail(strict=True, reason=ROUND7)
def test_a_trace_row_reads_alike_whatever_the_other_lines_of_its_file(tmp_path):
    """trace_io reads a file as pyarrow blocks (_streamed_columns) and falls back to the line
    reader (_row, json.loads) when any line is not clean. pyarrow never checks the UTF-8 of a
    field it was told to skip (unexpected_field_behavior="ignore"); json.loads refuses the line.
    So a row with an invalid byte in an extra field is a row while every other line is clean,
    and malformed once any unrelated line is: the rows a command reads from a line depend on
    the other lines of the file."""
    good = b'{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n'
    odd = b'{"timestamp": 1, "input_length": 4, "output_length": 1, "hash_ids": [1], "x": "\xff"}\n'
    bad = b"not json\n"
    (tmp_path / "clean.jsonl").write_bytes(good + odd)
    (tmp_path / "dirty.jsonl").write_bytes(good + odd + bad)
    sys.path.insert(0, str(ROOT))
    from kvtrace.transforms.read.trace_io import read_trace

    clean, dirty = read_trace([str(tmp_path / "clean.jsonl")]), read_trace(
        [str(tmp_path / "dirty.jsonl")]
    )
    # The odd line is one thing, whatever the line after it: a row in both files, or malformed
    # in both (the dirty file's extra malformed line is its own).
    assert len(clean.input_length) == len(dirty.input_length)
    assert clean.malformed_count + 1 == dirty.malformed_count
