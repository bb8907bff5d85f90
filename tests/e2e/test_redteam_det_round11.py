"""Red team round 11, determinism: reproducers of output that depends on the file split, the
record order or the engine for the same input and configuration. Each test asserts the promised
behaviour and fails today (issue 33)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import SALT, anonymize, chat, kvtrace_child, shared_path, trace, write_jsonl

pytestmark = pytest.mark.slow

DAY0_S = 1_700_000_000
# Oniguruma gives up backtracking `(a|a)+b` over 40 a's (its retry limit): the Rust side panics.
GIVES_UP = "a" * 40 + "c"


def _salt(tmp_path: Path) -> Path:
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    return salt


def _backtracking(tiny_tokenizer: str, folder: Path) -> Path:
    """The tiny tokenizer with a pre-tokenizer regex that backtracks (an operator's own
    tokenizer.json): it panics on GIVES_UP and encodes every other text."""
    folder.mkdir()
    for path in Path(tiny_tokenizer).iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    spec = json.loads((folder / "tokenizer.json").read_text())
    split = {"type": "Split", "pattern": {"Regex": "(a|a)+b"}, "behavior": "Isolated"}
    spec["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [{**split, "invert": False}, {"type": "WhitespaceSplit"}],
    }
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


def test_texts_the_tokenizer_fails_on_are_letters_whatever_file_holds_them(
    tiny_tokenizer, tmp_path
):
    """Promise: same records, same output whatever the file split; a text the tokenizer fails
    on is a `tokenizer_error` dead letter (fallible_tokenizer.py), the run publishes the rest.
    FallibleTokenizer.encode stops the job ('does not tokenize') when the first texts a worker
    is given all fail before it encoded one: a judgement by position. Three such prompts among
    twenty good ones in one file are three letters and a published trace; the same records
    with the three in a file of their own (read first, encoded as their own batch) stop the
    whole run, nothing published."""
    tokenizer = str(_backtracking(tiny_tokenizer, tmp_path / "tok"))
    bad = [{"timestamp": DAY0_S + i, "prompt": GIVES_UP + "c" * i} for i in range(3)]
    good = [{"timestamp": DAY0_S + 10 + i, "prompt": f"hello world {i}"} for i in range(20)]
    salt = _salt(tmp_path)
    splits = {
        "one": [write_jsonl(tmp_path / "all.jsonl", bad + good)],
        "split": [write_jsonl(tmp_path / "a.jsonl", bad), write_jsonl(tmp_path / "b.jsonl", good)],
    }
    runs = {}
    for name, inputs in splits.items():
        out = tmp_path / name
        code = anonymize(tokenizer, inputs, out, "--block-size", "4", "--salt-file", str(salt))
        runs[name] = (code, trace(out) if out.exists() else None)
    assert runs["one"][0] == 0 and len(runs["one"][1]) == 20
    assert runs["split"] == runs["one"]


def test_a_parquet_float32_latency_reads_as_its_jsonl_seconds(tiny_tokenizer, tmp_path):
    """Promise (docs/ANONYMIZE.md, Input: JSONL 'and Parquet with the same fields'; round 10's
    fix, numbers.floor_scaled: 'JSON numbers read exactly as their text wrote them, whatever
    form held them'): the same records read alike in both forms. A latency stored as a Parquet
    float (32-bit: Spark's FloatType, pandas' float32) reaches floor_scaled as the double of the
    float32, whose repr is not the number written: 1.3 s is 1.2999999523162842, published as
    response_ms 1299 where the JSONL `"latency": 1.3` (and the float32's own shortest text,
    '1.3') gives 1300. Four of these six latencies lose a millisecond: the bytes depend on the
    column's width."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    latency = [1.3, 0.7, 2.3, 1.1, 0.9, 4.7]
    records = [chat(i, DAY0_S * 1000 + 700 * i, f"u{i % 2}") for i in range(6)]
    as_jsonl = write_jsonl(
        tmp_path / "log.jsonl", [{**r, "latency": s} for r, s in zip(records, latency)]
    )
    column = pa.array(latency, type=pa.float32())
    as_parquet = tmp_path / "log.parquet"
    pq.write_table(pa.Table.from_pylist(records).append_column("latency", column), as_parquet)
    salt = _salt(tmp_path)
    runs = {}
    for name, log in (("jsonl", as_jsonl), ("parquet", as_parquet)):
        out = tmp_path / name
        code = anonymize(tiny_tokenizer, [log], out, "--block-size", "4", "--salt-file", str(salt))
        runs[name] = (code, trace(out))
    assert [row["response_ms"] for row in runs["jsonl"][1]] == [1300, 700, 2300, 1100, 900, 4700]
    assert runs["parquet"] == runs["jsonl"]


def _tool(properties: dict) -> dict:
    parameters = {"type": "object", "properties": properties}
    return {
        "type": "function",
        "function": {"name": "f", "description": "d", "parameters": parameters},
    }


def _jsonl_and_parquet(tmp_path: Path, records: list[dict], column: str, values, kind) -> tuple:
    """The records as JSONL, and as Parquet with `column` written as the Arrow type kind."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    as_jsonl = write_jsonl(tmp_path / "log.jsonl", records)
    rest = pa.Table.from_pylist([{k: v for k, v in r.items() if k != column} for r in records])
    as_parquet = tmp_path / "log.parquet"
    pq.write_table(rest.append_column(column, pa.array(values, type=kind)), as_parquet)
    return as_jsonl, as_parquet


def _runs(tokenizer: str, tmp_path: Path, logs: tuple, block_size: str) -> dict:
    salt = _salt(tmp_path)
    runs = {}
    for name, log in zip(("jsonl", "parquet"), logs):
        out = tmp_path / name
        code = anonymize(
            tokenizer, [log], out, "--block-size", block_size, "--salt-file", str(salt)
        )
        runs[name] = (code, trace(out) if out.exists() else None)
    return runs


def test_a_parquet_map_of_tool_properties_reads_as_its_jsonl_object(tmp_path):
    """Promise (docs/ANONYMIZE.md, Input: JSONL 'and Parquet with the same fields'; rounds 8-10
    read Parquet's own types for a time, a duration and a decimal as their JSONL values): the
    same records give the same trace in both forms. A JSON object whose keys vary from row to
    row (a tool's parameter `properties`, an Anthropic tool_use `input`) is stored by Spark's
    and DuckDB's MAP type as a Parquet map; Arrow's to_pylist (paths.python_values,
    sources._as_python) hands the fields a list of (key, value) tuples, which the chat template
    renders as `[["city", {...}]]` where the JSONL object renders `{"city": {...}}`: every row
    published with other token counts and ids, silently, nothing rejected."""
    import pyarrow as pa

    tokenizer = str(shared_path("tokenizers", "qwen3"))
    properties = [{"city": {"type": "string"}}, {"zone": {"type": "string"}}]
    records = [
        {**chat(i, DAY0_S * 1000 + 700 * i, f"u{i % 2}"), "tools": [_tool(properties[i % 2])]}
        for i in range(4)
    ]
    as_map = [[_tool(list(properties[i % 2].items()))] for i in range(4)]
    prop = pa.map_(pa.string(), pa.struct([("type", pa.string())]))
    params = pa.struct([("type", pa.string()), ("properties", prop)])
    function = pa.struct(
        [("name", pa.string()), ("description", pa.string()), ("parameters", params)]
    )
    kind = pa.list_(pa.struct([("type", pa.string()), ("function", function)]))
    logs = _jsonl_and_parquet(tmp_path, records, "tools", as_map, kind)
    runs = _runs(tokenizer, tmp_path, logs, "16")
    assert runs["jsonl"][0] == 0 and len(runs["jsonl"][1]) == 4
    assert runs["parquet"] == runs["jsonl"]


def test_parquet_messages_stored_as_maps_read_as_their_jsonl_messages(tiny_tokenizer, tmp_path):
    """The same cause, loud: messages written as a list of string maps (Spark's
    ArrayType(MapType(StringType, StringType)), the natural schema for role/content objects)
    reach the record's shape check as lists of tuples: every row a wrong_type letter and the
    run refused ('too much input rejected: 6 of 6'), where the JSONL of the same messages
    publishes every row."""
    import pyarrow as pa

    records = [chat(i, DAY0_S * 1000 + 700 * i, f"u{i % 2}") for i in range(6)]
    as_map = [[list(m.items()) for m in r["messages"]] for r in records]
    kind = pa.list_(pa.map_(pa.string(), pa.string()))
    logs = _jsonl_and_parquet(tmp_path, records, "messages", as_map, kind)
    runs = _runs(tiny_tokenizer, tmp_path, logs, "4")
    assert runs["jsonl"][0] == 0 and len(runs["jsonl"][1]) == 6
    assert runs["parquet"] == runs["jsonl"]


def _qwen3_splitting_on(tmp_path: Path, regex: str) -> str:
    """Qwen3's tokenizer with its Split pre-tokenizer's regex replaced (an operator's own
    tokenizer.json; fastokens' closed list takes any regex of an Isolated Split)."""
    qwen3 = shared_path("tokenizers", "qwen3")
    folder = tmp_path / "tok"
    folder.mkdir()
    for path in qwen3.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": regex}
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return str(folder)


def _prompts(tmp_path: Path, odd: str) -> Path:
    good = [{"timestamp": DAY0_S + i, "prompt": f"hello world number {i}"} for i in range(6)]
    bad = [{"timestamp": DAY0_S + 10 + i, "prompt": odd * (40 + i) + "c"} for i in range(3)]
    return write_jsonl(tmp_path / "log.jsonl", good + bad)


def test_texts_tokenizers_fails_on_are_letters_with_the_fast_backend_too(tmp_path, capsys):
    """Promise (docs/TOKENIZER_BACKENDS.md: 'a backend is used only where it gives exactly the
    ids of tokenizers'; 'A text fastokens fails on ... is encoded by tokenizers, which decides:
    its ids, or the tokenizer_error dead letter a tokenizers run would give'): the bytes never
    depend on --tokenizer-backend. The converse is not decided: a text the reference fails on
    (Oniguruma's retry limit: `(q|q)+z` over 40 q's) and fastokens encodes (its regex engine
    gives up at once, no `z` in the text) is published with fastokens' ids unless it is one of
    the 1 in 64 texts sampled. Here `tokenizers` exports 6 of 9 (3 tokenizer_error letters),
    `fastokens` and `auto` export 9 of 9. The same happens with Qwen3's own tokenizer on a
    record of 12 M spaces (`\\s*[\\r\\n]+`): 5 of 6 against 6 of 6 (38 s, 900 MB: not run here).

    Fixed by construction at load (fast_backend.RUNS: the reference fails on a run of q's, so
    fastokens is refused: `auto` is `tokenizers`, `fastokens` a one-line error) and in the run
    (fast_backend.MAX_FAST_CHARS: a text of millions of characters is the reference's). Since
    round 14 such a pre-tokenizer is refused before the probes, off the verified list."""
    tokenizer = _qwen3_splitting_on(tmp_path, "(q|q)+z")
    log = _prompts(tmp_path, "q")
    salt = _salt(tmp_path)
    runs = {}
    for backend in ("tokenizers", "auto", "fastokens"):
        out = tmp_path / backend
        code = anonymize(
            tokenizer, [log], out, "--block-size", "4", "--salt-file", str(salt),
            "--tokenizer-backend", backend,
        )  # fmt: skip
        runs[backend] = (code, trace(out) if out.exists() else None)
    assert runs["tokenizers"][0] == 0 and len(runs["tokenizers"][1]) == 6
    assert runs["auto"] == runs["tokenizers"]
    assert runs["fastokens"] == (2, None)  # refused before any input is read
    said = capsys.readouterr().err
    assert "--tokenizer-backend fastokens: the pre-tokenizer (sha256" in said
    assert "Traceback" not in said


def test_auto_keeps_tokenizers_when_the_reference_fails_on_a_probe_text(tmp_path):
    """Promise: `--tokenizer-backend auto` is 'fastokens where it is verified for the
    tokenizer, else tokenizers' (docs/TOKENIZER_BACKENDS.md), and bad input is a one-line error,
    never a traceback. fast_backend.probe_difference encodes the probe texts with the reference
    outside any guard: a tokenizer that panics on a probe (a long word of a's under `(a|a)+b`)
    ends the run with pyo3's PanicException and a Python traceback (exit 1, nothing
    published), where `--tokenizer-backend tokenizers` publishes the same input (6 of 9, 3
    tokenizer_error letters)."""
    tokenizer = _qwen3_splitting_on(tmp_path, "(a|a)+b")
    log = _prompts(tmp_path, "a")
    salt = _salt(tmp_path)
    done = {}
    for backend in ("tokenizers", "auto"):
        out = tmp_path / backend
        done[backend] = kvtrace_child(
            "anonymize", "--input", str(log), "--output", str(out), "--tokenizer", tokenizer,
            "--block-size", "4", "--salt-file", str(salt), "--tokenizer-backend", backend,
            "--quiet", env={"RUST_BACKTRACE": "0"},
        )  # fmt: skip
    assert done["tokenizers"].returncode == 0
    assert "Traceback" not in done["auto"].stderr
    assert done["auto"].returncode == 0
    assert trace(tmp_path / "auto") == trace(tmp_path / "tokenizers")
