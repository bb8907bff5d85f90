"""Red team round 11, determinism: reproducers of output that depends on the file split, the
record order or the engine for the same input and configuration. Each test asserts the promised
behaviour and fails today (issue 33)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import SALT, anonymize, chat, trace, write_jsonl

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


@pytest.mark.xfail(strict=True, reason="red team round 11")
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


@pytest.mark.xfail(strict=True, reason="red team round 11")
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
