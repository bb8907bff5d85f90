"""Red team round 10, determinism: reproducers of byte-identical output broken by the engine,
the form or the order of the same input. Each test asserts the promised behaviour and failed
before its fix (issue 33)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import SALT, anonymize, assert_same_output, chat, kvtrace_child, trace, write_jsonl

pytestmark = pytest.mark.slow

DAY0 = 1_700_000_000_000
DAY0_S = 1_763_703_600  # 2025-11-21T05:40:00Z


def _salt(tmp_path: Path) -> Path:
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    return salt


def _batch_files(folder: Path, custom_ids: list[str]) -> list[Path]:
    """An OpenAI Batch input file and its output file, one request and its answer per id."""
    requests, answers = [], []
    for i, custom_id in enumerate(custom_ids):
        body = {"model": "m", "messages": chat(i, 0)["messages"]}
        requests.append({"custom_id": custom_id, "method": "POST", "body": body})
        answer = {"created": DAY0_S + i, "usage": {"completion_tokens": 3 + i}}
        response = {"status_code": 200, "body": answer}
        answers.append({"id": f"b{i}", "custom_id": custom_id, "response": response})
    return [
        write_jsonl(folder / "input.jsonl", requests),
        write_jsonl(folder / "output.jsonl", answers),
    ]


@pytest.mark.beam
def test_a_batch_custom_id_of_a_lone_surrogate_is_joined_alike_on_every_engine(
    tiny_tokenizer, tmp_path
):
    """Promise: the same input and configuration give byte-identical output on any engine; bad
    input is a dead letter, never a failed run (read/batch_join.py: 'One pure function decides
    each custom_id's fate on every engine'). A Batch line whose custom_id is a lone surrogate
    (the JSON escape \\ud800, which json.loads keeps) is, on the local engine, one
    invalid_unicode letter, the other pairs published (partition_of hashes it with
    surrogatepass). On Beam, SetAsideHalves emits it as a GroupByKey key, which Beam's str
    coder encodes as strict UTF-8: the whole job fails ("'utf-8 [while running
    'JoinBatch/SetAsideHalves/...']' codec can't encode character"), nothing published."""
    inputs = _batch_files(tmp_path, ["req-0", "req-1", "x\ud800", "req-3"])
    salt = _salt(tmp_path)
    codes = {}
    for engine in ("local", "beam"):
        codes[engine] = anonymize(
            tiny_tokenizer, inputs, tmp_path / engine, "--engine", engine,
            "--block-size", "4", "--salt-file", str(salt),
        )  # fmt: skip
    assert codes["local"] == 0 and len(trace(tmp_path / "local")) == 3
    assert codes["beam"] == 0
    assert_same_output(tmp_path / "local", tmp_path / "beam")


def test_a_latency_in_seconds_reads_as_the_same_milliseconds_as_its_parquet_duration(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/ANONYMIZE.md, Input: JSONL 'and Parquet with the same fields'; round 9's
    fix read an Arrow duration as its JSONL seconds): a response time logged as `latency` reads
    alike in both forms. Round 9's reproducer used multiples of 250 ms, which binary floating
    point holds exactly. response_end._duration_ms multiplies JSONL seconds by 1000 in binary
    floating point and floors: `"latency": 1.001` (1000.9999999999999) publishes response_ms
    1000, where the same latency as a Parquet duration (or as `latency_ms: 1001`) publishes
    1001. About 0.7% of latencies written to the ms lose one: the bytes depend on the input's
    form."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    latency_ms = [1001, 1003, 1005, 2009, 4011, 8013]
    records = [chat(i, DAY0 + 700 * i, f"u{i % 2}") for i in range(6)]
    as_jsonl = write_jsonl(
        tmp_path / "log.jsonl", [{**r, "latency": ms / 1000} for r, ms in zip(records, latency_ms)]
    )
    table = pa.Table.from_pylist(records).append_column(
        "latency", pa.array(latency_ms, type=pa.duration("ms"))
    )
    as_parquet = tmp_path / "log.parquet"
    pq.write_table(table, as_parquet)
    salt = _salt(tmp_path)
    runs = {}
    for name, log in (("jsonl", as_jsonl), ("parquet", as_parquet)):
        out = tmp_path / name
        code = anonymize(tiny_tokenizer, [log], out, "--block-size", "4", "--salt-file", str(salt))
        runs[name] = (code, trace(out))
    assert runs["parquet"][0] == 0
    assert [r["response_ms"] for r in runs["parquet"][1]] == latency_ms
    assert runs["jsonl"] == runs["parquet"]


DECIMAL_FIELDS = {
    # field: (JSONL values, decimal type); the same numbers as the Parquet decimal column holds
    "latency": (["0.25", "0.5", "1.25", "2", "0.75", "1.5"], (10, 3)),
    "timestamp": ([f"{DAY0 // 1000 + i}.{100 * i:03d}" for i in range(6)], (16, 3)),
}


@pytest.mark.parametrize("field", sorted(DECIMAL_FIELDS))
def test_a_parquet_decimal_column_reads_as_its_jsonl_number(tiny_tokenizer, tmp_path, field):
    """Promise (docs/ANONYMIZE.md, Input: JSONL 'and Parquet with the same fields'; rounds 8
    and 9 read Parquet's own types for a time and a duration as their JSONL numbers): the same
    records read alike in both forms. A number with a fixed count of decimals is stored by SQL
    exports (Spark's and DuckDB's DECIMAL, a ROUND(latency, 3)) as a Parquet decimal; the reader
    hands the fields a decimal.Decimal (paths.python_values), which timestamps.timestamp_ms and
    response_end._duration_ms refuse as not a number: every row a wrong_type letter, the run
    refused ('too much input rejected: 6 of 6'), where the JSONL of the same numbers
    publishes every row."""
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    texts, (precision, scale) = DECIMAL_FIELDS[field]
    records = [chat(i, DAY0 + 700 * i, f"u{i % 2}") for i in range(6)]
    as_jsonl = write_jsonl(
        tmp_path / "log.jsonl", [{**r, field: float(t)} for r, t in zip(records, texts)]
    )
    column = pa.array([decimal.Decimal(t) for t in texts], type=pa.decimal128(precision, scale))
    table = pa.Table.from_pylist(records)
    if field in table.column_names:
        table = table.drop_columns([field])
    as_parquet = tmp_path / "log.parquet"
    pq.write_table(table.append_column(field, column), as_parquet)
    salt = _salt(tmp_path)
    runs = {}
    for name, log in (("jsonl", as_jsonl), ("parquet", as_parquet)):
        out = tmp_path / name
        code = anonymize(tiny_tokenizer, [log], out, "--block-size", "4", "--salt-file", str(salt))
        runs[name] = (code, trace(out))
    assert runs["jsonl"][0] == 0 and len(runs["jsonl"][1]) == 6
    assert runs["parquet"] == runs["jsonl"]


def _shared_prefix_trace(path: Path, rows: int = 60) -> Path:
    """A Mooncake trace at block size 4 whose rows share prefixes at many distances: row i
    repeats the first blocks of row i // 2 and adds blocks of its own."""
    table: list[dict] = []
    for i in range(rows):
        ids = table[i // 2]["hash_ids"][: 1 + i % 5] if i else []
        ids = ids + [1000 + 10 * i + k for k in range(1 + i % 4)]
        table.append(
            {
                "timestamp": 250 * i,
                "input_length": 4 * len(ids),
                "output_length": 2,
                "hash_ids": ids,
            }
        )
    return write_jsonl(path, table)


@pytest.mark.beam
def test_reuse_reports_the_same_ccdf_on_every_engine(tmp_path):
    """Promise: the same input and configuration give the same output on any engine
    (docs/ANALYSIS.md, reuse: '--engine beam runs the CCDF and reuse times as a Beam pipeline
    ... equal to the local numbers, tested'; only the stack distances stay local). The CCDF is
    sampled by two algorithms: the local engine at up to 400 log-spaced rounded intervals
    (reuse.ccdf_curve, floats), Beam at every bin edge below a used bin (reuse_shards.
    ReuseSummary.ccdf, integers, one point more at the start). `reuse --json` (and its plot)
    differ by engine for one trace: the test that calls them equal checks only that Beam's
    points lie on the curve."""
    from kvtrace.cli import main

    trace_path = _shared_prefix_trace(tmp_path / "trace.jsonl")
    reports = {}
    for engine in ("local", "beam"):
        out = tmp_path / f"{engine}.json"
        code = main(
            [
                "reuse", str(trace_path), "--block-size", "4", "--engine", engine,
                "-o", str(tmp_path / f"{engine}.png"), "--json", str(out),
            ]
        )  # fmt: skip
        assert code == 0
        reports[engine] = json.loads(out.read_text())
    assert reports["local"]["ccdf"]["interval_tokens"]
    assert reports["beam"]["ccdf"] == reports["local"]["ccdf"]


def test_a_chat_template_reading_the_request_time_as_epoch_seconds_never_reads_the_zone(
    tiny_tokenizer, tmp_path
):
    """Promise (transforms/encode/template_names.py: 'A render must give the same text for the
    same request on any worker, day or zone'; round 9 bound strftime_now to the request's time,
    in UTC): the same input and configuration give byte-identical output in any time zone.
    strftime_now formats a UTC datetime with datetime.strftime, which hands C's strftime a
    struct tm without its zone: glibc's `%s` (seconds since the epoch, which templates print as
    a request id or a cache-buster) converts it with mktime, in the worker's local zone (TZ).
    Here a template repeats a word once per hour of strftime_now("%s"): the same log under
    TZ=UTC and TZ=Pacific/Kiritimati publishes other lengths and ids."""
    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(tiny_tokenizer, tokenizer)
    template = tokenizer / "chat_template.jinja"
    hours = '(strftime_now("%s") | int) // 3600 % 24'
    clock = f'<|im_start|>system\n{{{{ "the " * ({hours}) }}}}<|im_end|>\n'
    template.write_text(clock + template.read_text())
    log = write_jsonl(tmp_path / "log.jsonl", [chat(i, DAY0 + 1000 * i) for i in range(4)])
    salt = _salt(tmp_path)
    runs = []
    for zone in ("UTC", "Pacific/Kiritimati"):
        out = tmp_path / zone.replace("/", "-")
        args = ["anonymize", "--input", str(log), "--output", str(out), "--tokenizer"]
        args += [str(tokenizer), "--block-size", "4", "--salt-file", str(salt)]
        done = kvtrace_child(*args, env={"TZ": zone})
        runs.append((done.returncode, trace(out)))
    assert runs[0][0] == 0 and len(runs[0][1]) == 4
    assert runs[0] == runs[1]
