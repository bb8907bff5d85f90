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

import pytest

from helpers import ROOT, kvtrace_child

pytestmark = [pytest.mark.slow]


def _trace_rows(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "trace-00000-of-00001.jsonl").open()]


# ---- standard input: a bad option waits for (and copies) the whole of stdin first -------------


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
        "{{ message.content }}{% if message.tool_calls %}{{ message.tool_calls | tojson }}"
        "{% endif %}<|im_end|>\n{% endfor %}"
    )
    for name in ("chat_template.jinja",):
        if (folder / name).exists():
            (folder / name).write_text(template)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    if "chat_template" in config:
        config["chat_template"] = template
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder)


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
        done = kvtrace_child(
            *[
                "anonymize",
                "--input",
                str(tmp_path / f"{name}.jsonl"),
                "--output",
                str(out),
                "--tokenizer",
                tokenizer,
                "--block-size",
                "4",
            ]  # fmt: skip
        )
        assert done.returncode == 0, done.stderr[-2000:]
        rows[name] = _trace_rows(out)
    assert rows["envelope"][0]["input_length"] == rows["litellm"][0]["input_length"]
    assert rows["envelope"] == rows["litellm"]


# ---- the trace reader: a row's fate decided by another row ---------------------------------


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

    clean, dirty = (
        read_trace([str(tmp_path / "clean.jsonl")]),
        read_trace([str(tmp_path / "dirty.jsonl")]),
    )
    # The odd line is one thing, whatever the line after it: a row in both files, or malformed
    # in both (the dirty file's extra malformed line is its own).
    assert len(clean.input_length) == len(dirty.input_length)
    assert clean.malformed_count + 1 == dirty.malformed_count


# ---- Parquet: a struct field absent from a row is null, and null is not absent ---------------

_OPENAI = {
    "timestamp": 1764000000,
    "messages": [
        {"role": "user", "content": "What is the capital of France ?"},
        {"role": "assistant", "content": "Paris", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "hello world", "tool_call_id": "a"},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                "parameters": {"type": "object"}}}],
    "output_length": 3,
}  # fmt: skip
_ANTHROPIC = {
    "timestamp": 1764000001,
    "system": "hello world",
    "messages": [{"role": "user", "content": "the quick brown fox"}],
    "tools": [{"name": "g", "input_schema": {"type": "object"}}],
    "output_length": 3,
}


def _published_as_jsonl_and_parquet(records: list[dict], tokenizer: str, tmp_path) -> dict:
    """The trace rows the same records publish as a JSONL log and as a Parquet log."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    pq.write_table(pa.Table.from_struct_array(pa.array(records)), tmp_path / "log.parquet")
    published = {}
    for name in ("log.jsonl", "log.parquet"):
        out = tmp_path / f"out-{name}"
        done = kvtrace_child(
            *["anonymize", "--input", str(tmp_path / name), "--output", str(out)]
            + ["--tokenizer", tokenizer, "--block-size", "4"]
        )
        assert done.returncode == 0, done.stderr[-2000:]
        published[name] = _trace_rows(out)
    return published


def test_the_same_records_as_parquet_publish_what_they_publish_as_jsonl(tiny_tokenizer, tmp_path):
    """A Parquet column of structs holds every field any row has: a row without one reads it as
    null (paths.sized_rows, to_pylist). The shapes (shapes.TOOL: name, function, input_schema
    not optional) and chat.is_anthropic (`"system" in body`, `"input_schema" in tool`) take a
    null field for a present one. So one Anthropic request in a Parquet log turns every OpenAI
    request beside it into an Anthropic one (system: null; its tools' input_schema: null), or a
    wrong_type dead letter (the Chat Completions tool has name: null; the Anthropic tool,
    function: null): here both rows are rejected and the run publishes nothing, while the same
    two records as JSONL publish two rows. docs/ANONYMIZE.md: "Parquet with the same fields"."""
    tokenizer = _tool_rendering_tokenizer(tiny_tokenizer, tmp_path)
    records = [_OPENAI, _ANTHROPIC]
    published = _published_as_jsonl_and_parquet(records, tokenizer, tmp_path)
    assert published["log.jsonl"] == published["log.parquet"]


def test_an_openai_request_beside_an_anthropic_one_in_parquet_keeps_its_tool_calls(
    tiny_tokenizer, tmp_path
):
    """The same null-for-absent hole without tools: an Anthropic row's `system` gives the
    OpenAI row `system: null`, so chat.is_anthropic reads it as Anthropic Messages, whose
    reader (chat.anthropic_messages) drops the assistant's `tool_calls`: a shorter prompt than
    the same record alone, or as JSONL."""
    tokenizer = _tool_rendering_tokenizer(tiny_tokenizer, tmp_path)
    openai = {k: v for k, v in _OPENAI.items() if k != "tools"}
    anthropic = {k: v for k, v in _ANTHROPIC.items() if k != "tools"}
    records = [openai, anthropic]
    published = _published_as_jsonl_and_parquet(records, tokenizer, tmp_path)
    assert published["log.jsonl"] == published["log.parquet"]


# ---- a field read that no shape declares --------------------------------------------------------


@pytest.mark.parametrize("engine", ["local", "beam"])
@pytest.mark.parametrize("value", ['"5"', "[5]", "{}", "true"])
def test_a_batch_line_with_a_completion_count_of_the_wrong_type_is_a_wrong_type_letter(
    tiny_tokenizer, tmp_path, engine, value
):
    """records._output reads LiteLLM's `completion_tokens` from any record, but only the log
    envelope declares it (shapes.ENVELOPE); a Batch line (custom_id) is held to
    BATCH_ENVELOPE, which does not. So its value reaches _count unchecked and `0 <= "5"`
    raises TypeError, caught only by the reader's last-resort net: a malformed_record letter
    whose message is Python's ("TypeError: '<=' not supported between instances of 'int' and
    'str'"), not the shape's wrong_type naming the field."""
    line = (
        '{"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "hello world"}, '
        # joined already (a response beside its body): read alone, not held for a join
        '"response": {"status_code": 200, "body": {}}, '
        f'"timestamp": 1764000000, "completion_tokens": {value}}}\n'
        '{"prompt": "the quick brown fox", "timestamp": 1764000001, "output_length": 2}\n'
    )
    (tmp_path / "batch.jsonl").write_text(line)
    out = tmp_path / "out"
    done = kvtrace_child(
        *[
            "anonymize",
            "--input",
            str(tmp_path / "batch.jsonl"),
            "--output",
            str(out),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
            "--engine",
            engine,
            # its one letter is most of the input's bytes: the letter is the subject here
            "--max-rejected-fraction",
            "1",
        ]  # fmt: skip
    )
    assert done.returncode == 0, done.stderr[-2000:]
    letters = [
        json.loads(line) for path in (tmp_path / "out-rejected").iterdir() for line in path.open()
    ]
    assert len(letters) == 1
    assert letters[0]["error"] == "wrong_type", letters[0]
    assert "Error:" not in letters[0]["message"]


# ---- standard input's name: a set held by one process --------------------------------------


def test_letters_name_standard_input_as_dash_on_beam_worker_processes(tiny_tokenizer, tmp_path):
    """decompress.input_name names the spooled copy `-` by looking it up in _SPOOLED, a set of
    the process that spooled it. Beam's workers in their own processes (DirectRunner
    --direct_running_mode multi_processing) never saw that set: their letters name the random
    temporary file (/tmp/kvtrace-stdin-XXXX/stdin.jsonl), so the same stdin gives different
    dead letters each run, and others than the local engine's (`-`). (multi_processing is now
    refused, runner.refuse_unsupervised_workers: Beam's two workers are the child's threads.)"""
    log = tmp_path / "log.jsonl"
    log.write_text(
        "".join(
            f'{{"prompt": "hello world", "timestamp": {1764000000 + i}, "output_length": 2}}\n'
            for i in range(20)
        )
        + "not json\n"
        '{"prompt": "the quick brown fox"}\n'
    )
    letters = {}
    for name, engine in {
        "local": ["--engine", "local"],
        "beam": ["--engine", "beam", "--direct_num_workers", "2",
                 "--direct_running_mode", "multi_threading"],
    }.items():  # fmt: skip
        out = tmp_path / f"out-{name}"
        with log.open("rb") as stdin:
            done = kvtrace_child(
                *[
                    "anonymize",
                    "--input",
                    "-",
                    "--output",
                    str(out),
                    "--tokenizer",
                    tiny_tokenizer,
                    "--block-size",
                    "4",
                    *engine,
                ],  # fmt: skip
                stdin=stdin,
            )
        assert done.returncode == 0, done.stderr[-2000:]
        letters[name] = sorted(
            line
            for path in (tmp_path / f"out-{name}-rejected").iterdir()
            for line in path.read_text().splitlines()
        )
    assert {json.loads(line)["source"] for line in letters["beam"]} == {"-"}
    assert letters["local"] == letters["beam"]


# ---- `-` is standard input on the command line only ---------------------------------------


def test_standard_input_named_in_a_config_file_is_standard_input(tiny_tokenizer, tmp_path):
    """anonymize.run spools stdin when `-` is in args.input, before --config files are merged
    (in _run): `input: ["-"]` in a config file is not standard input but a file named `-` in
    the working directory ("'-' matches no file" without one; with one, its records are
    published in place of the piped log's)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "-").write_text(
        '{"prompt": "the quick brown fox", "timestamp": 1764000000, "output_length": 2}\n'
    )
    piped = tmp_path / "piped.jsonl"
    piped.write_text(
        "".join(
            f'{{"prompt": "hello world", "timestamp": {1764000000 + i}, "output_length": 2}}\n'
            for i in range(5)
        )
    )
    config = tmp_path / "run.yaml"
    config.write_text(f'input: ["-"]\ntokenizer: {tiny_tokenizer}\nblock_size: 4\n')
    out = tmp_path / "out"
    with piped.open("rb") as stdin:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "kvtrace.cli",
                "anonymize",
                "--config",
                str(config),
                "--output",
                str(out),
            ],  # fmt: skip
            cwd=work,
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(_trace_rows(out)) == 5  # the piped log's, not the file named `-`


def test_a_closed_standard_input_is_a_one_line_error_saying_so(tiny_tokenizer, tmp_path):
    """`kvtrace anonymize --input - <&-`: sys.stdin is None, and spooled_standard_input's
    `sys.stdin.buffer` raises AttributeError, caught only by the command's last-resort net
    ("the job failed: AttributeError: 'NoneType' object has no attribute 'buffer'")."""
    done = subprocess.run(
        [
            "sh",
            "-c",
            'exec "$@" <&-',
            "sh",
            sys.executable,
            "-m",
            "kvtrace.cli",
            "anonymize",
            "--input",
            "-",
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
        ],  # fmt: skip
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode != 0
    assert "Error" not in done.stderr and "NoneType" not in done.stderr, done.stderr[-500:]
    assert "standard input" in done.stderr


# ---- a Batch request the API refused ----------------------------------------------------------


def _batch_line(custom_id: str, response: dict, **extra) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hello world"}]},
        "response": response,
        "error": None,
        **extra,
    }


@pytest.mark.parametrize("timed", [False, True])
def test_a_batch_request_the_api_refused_is_a_failed_request_letter(
    tiny_tokenizer, tmp_path, timed
):
    """In an OpenAI Batch output file a request the API refused (context too long, invalid)
    has `error: null` and `response: {status_code: 400, body: {error: ...}}`; `error` is for
    requests the batch never ran. records._check_batch looks at `error` only, so the refused
    request is read as served: with no time of its own it is an `unjoined_batch` letter
    telling the user to join lines that are joined; with a time (a log that adds one) it is
    published as a trace row (output_length 0, defaulted) that no engine ever served."""
    served = {"status_code": 200, "request_id": "q", "body": {
        "created": 1764000000, "choices": [{"index": 0, "message": {"content": "Paris"}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3}}}  # fmt: skip
    refused = {"status_code": 400, "request_id": "q", "body": {"error": {
        "message": "maximum context length exceeded", "type": "invalid_request_error",
        "code": "context_length_exceeded"}}}  # fmt: skip
    extra = {"timestamp": 1764000100} if timed else {}
    lines = [_batch_line(f"r{i}", served) for i in range(10)]
    lines.append(_batch_line("refused", refused, **extra))
    (tmp_path / "joined.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    done = kvtrace_child(
        *[
            "anonymize",
            "--input",
            str(tmp_path / "joined.jsonl"),
            "--output",
            str(out),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
        ]  # fmt: skip
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(_trace_rows(out)) == 10
    letters = [
        json.loads(line) for path in (tmp_path / "out-rejected").iterdir() for line in path.open()
    ]
    assert [letter["error"] for letter in letters] == ["failed_request"]
