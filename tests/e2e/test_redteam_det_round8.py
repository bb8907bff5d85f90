"""Red team round 8 (det8): determinism and nothing lost across forms, engines, nights and
derived traces. Each test asserts a promise and fails today."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import SALT, anonymize, chat, trace, write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.slow

DAY0 = 1_700_000_000_000


def _letters(out: Path) -> list[dict]:
    folder = Path(f"{out}-rejected")
    return [json.loads(line) for p in sorted(folder.glob("*.jsonl")) for line in p.open()]


@pytest.mark.parametrize(
    "field",
    [{"output_length": None}, {"completion_tokens": None}, {"output": None}],
    ids=["output_length", "completion_tokens", "output"],
)
def test_a_null_output_count_reads_alike_as_jsonl_and_as_parquet(tiny_tokenizer, tmp_path, field):
    """Promise (docs/ANONYMIZE.md, Input; round 7's fix): the same records read alike as JSONL
    and as Parquet, a null field read as absent. records.without_nulls drops nulls from Parquet
    rows only; the JSONL reader keeps an explicit null of the fields an output length is taken
    from (output_length, completion_tokens, output) and calls it a
    wrong_type letter ('output_length is null, not an integer'). The same record written as
    Parquet (pyarrow.Table.from_pylist of the same dicts) loses the null: the row is exported
    with output_length 0. One request: a letter in one form, a row in the other."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [chat(i, DAY0 + 1000 * i, session="s") for i in range(3)]
    last = chat(5, DAY0 + 9000, session="s")
    last.pop("output_length")
    records.append({**last, **field})
    as_jsonl = write_jsonl(tmp_path / "log.jsonl", records)
    as_parquet = tmp_path / "log.parquet"
    pq.write_table(pa.Table.from_pylist(records), as_parquet)
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    runs = {}
    for name, log in (("jsonl", as_jsonl), ("parquet", as_parquet)):
        out = tmp_path / name
        code = anonymize(tiny_tokenizer, [log], out, "--block-size", "4", "--salt-file", str(salt))
        runs[name] = (code, trace(out), [letter["error"] for letter in _letters(out)])
    assert runs["jsonl"] == runs["parquet"]


def test_synthesize_num_requests_draws_the_same_rows_whatever_the_input_order(tmp_path):
    """Promise: same input and config give byte-identical output whatever the order or split;
    docs/ANALYSIS.md: 'the same --seed gives the same bytes' (and without --num-requests the
    output is indeed the same for shuffled rows, on both engines). With --num-requests,
    synth/sample.sample_requests draws output lengths by file row (trace.output_length[
    rng.integers(len(trace))]) and own-part lengths from own_tokens in file row order (pool),
    not in the causal (timestamp) order it uses for conversations: the same rows, with distinct
    timestamps, in two files given as A B or B A (or shuffled in one file) give another trace."""
    rows = [
        {
            "timestamp": 1000 * i,
            "input_length": 4 * (3 + i % 7),
            "output_length": 3 + i % 4,
            "hash_ids": [(i % 5) * 100 + k for k in range(3 + i % 7)],
            "session": i % 5,
        }
        for i in range(60)
    ]
    first = write_jsonl(tmp_path / "a.jsonl", rows[::2])
    second = write_jsonl(tmp_path / "b.jsonl", rows[1::2])
    outputs = []
    for name, files in (("ab", [first, second]), ("ba", [second, first])):
        out = tmp_path / name
        args = ["synthesize", *map(str, files), "-o", str(out), "--block-size", "4"]
        assert main([*args, "--num-requests", "80", "--seed", "7"]) == 0
        outputs.append((out / "trace-00000-of-00001.jsonl").read_bytes())
    assert outputs[0] == outputs[1]


def test_the_id_map_records_a_night_alike_whatever_its_time_origin(tiny_tokenizer, tmp_path):
    """Promise (docs/NIGHTLY.md, --time-origin night): 'only the rows move': what the map records
    of the night stays on the map's clock, and 'the same nights give the same map bytes'. The
    map records each night by id_map.night_identity, the sha256 of its published files'
    digests, and with --time-origin night those files are the moved rows: the same two nights
    give another versions/000002.json (its history's 'night' and so its MAC) under each origin.
    So a map depends on a presentation flag, and a recorded night rerun with the other origin
    is not found in the map: it is refused as a new night 'at or before' the map's published
    end (exit 1), though it is the same night."""
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    logs = {
        n: write_jsonl(
            tmp_path / f"night{n}.jsonl",
            [chat(i + n, DAY0 + (n - 1) * 86_400_000 + 613 * i, f"u{i % 3}") for i in range(12)],
        )
        for n in (1, 2)
    }

    def night(n: int, map_name: str, *extra: str) -> int:
        args = ["--block-size", "4", "--salt-file", str(salt), "--id-map", str(tmp_path / map_name)]
        args += ["--id-map-marks", str(tmp_path / f"marks-{map_name}"), *extra]
        return anonymize(tiny_tokenizer, [logs[n]], tmp_path / f"{map_name}-{n}", *args)

    for map_name, origin in (("on-map", "map"), ("own", "night")):
        assert night(1, map_name, "--time-origin", origin) == 0
        assert night(2, map_name, "--time-origin", origin) == 0
    recorded = [(tmp_path / m / "versions" / "000002.json").read_bytes() for m in ("on-map", "own")]
    assert recorded[0] == recorded[1]


def _tool_turn(i: int, call: dict, tools: list | None = None) -> dict:
    record = {
        "timestamp": DAY0 + 1000 * i,
        "output_length": 3,
        "messages": [
            {"role": "user", "content": "the fox"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "dog"},
        ],
    }
    return {**record, "tools": tools} if tools else record


TOOL = {"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"a": 1}'}}


@pytest.mark.parametrize(
    "odd",
    [
        {"call": {**CALL, "id": None}},
        {"call": {**CALL, "type": None}},
        {"call": {**CALL, "function": {"name": "get", "arguments": None}}},
        {"tools": [{**TOOL, "type": None}]},
        {"tools": [{"type": "function", "function": {"name": None, "parameters": {}}}]},
    ],
    ids=["call.id", "call.type", "call.function.arguments", "tool.type", "tool.function.name"],
)
def test_a_null_required_field_reads_alike_as_jsonl_and_as_parquet(tiny_tokenizer, tmp_path, odd):
    """The same mechanism as the output counts, in the request: shapes.py declares a tool call's
    id, type and function.arguments and a tool's type and function.name as strings (not
    optional), so the JSONL reader letters a null one (wrong_type), while a field that is absent
    passes (no shape requires presence). Parquet cannot tell null from absent and
    records.without_nulls makes it absent: the same request is a wrong_type letter as JSONL and
    an exported row as Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [_tool_turn(i, CALL, [TOOL]) for i in range(3)]
    records.append(_tool_turn(5, odd.get("call", CALL), odd.get("tools", [TOOL])))
    as_jsonl = write_jsonl(tmp_path / "log.jsonl", records)
    as_parquet = tmp_path / "log.parquet"
    pq.write_table(pa.Table.from_pylist(records), as_parquet)
    runs = {}
    for name, log in (("jsonl", as_jsonl), ("parquet", as_parquet)):
        out = tmp_path / name
        code = anonymize(tiny_tokenizer, [log], out, "--block-size", "4")
        runs[name] = (code, len(trace(out)), [letter["error"] for letter in _letters(out)])
    assert runs["jsonl"] == runs["parquet"]


@pytest.mark.parametrize("damage", ["parquet-cut-short", "gzip-corrupt-header"])
def test_a_file_lost_whole_weighs_its_bytes_as_lost(tiny_tokenizer, tmp_path, capsys, damage):
    """Promise (docs/ANONYMIZE.md): --max-rejected-fraction (default 0.5) fails the run when
    more than half the records are rejected 'or more than F of the input bytes are lost'; the
    summary says 'the damaged files and the bytes they lost'. A file lost whole weighs nothing:
    a Parquet file cut short (an upload that broke off: no PAR1 at its end) loses every row,
    but sources._parquet's 'not a readable Parquet file' letter carries no lost_bytes; a gzip
    file damaged in its first block (or a plain log misnamed .gz) breaks off 'at byte 0
    (decompressed)', and sources._damaged_tail weighs only the partial record decoded (none).
    3,000 requests (42 KB as Parquet) beside a JSONL of 30 are '1 of 31 records rejected',
    'damaged 1 file(s) broke off, 0 bytes lost', and the run publishes the 30 rows (exit 0).
    (A row group that breaks off weighs its bytes: _row_group's letter has lost_bytes.)"""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [chat(i, DAY0 + 1000 * i) for i in range(3000)]
    if damage == "parquet-cut-short":
        whole = tmp_path / "whole.parquet"
        pq.write_table(pa.Table.from_pylist(records), whole, row_group_size=500)
        lost = tmp_path / "lost.parquet"
        lost.write_bytes(whole.read_bytes()[:-100])
    else:
        data = bytearray(gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in records)))
        data[20] ^= 0xFF  # inside the first deflate block's header
        lost = tmp_path / "lost.jsonl.gz"
        lost.write_bytes(bytes(data))
    small = write_jsonl(tmp_path / "small.jsonl", [chat(i, DAY0 + 1000 * i) for i in range(30)])
    capsys.readouterr()
    code = anonymize(tiny_tokenizer, [lost, small], tmp_path / "out", "--block-size", "4")
    said = capsys.readouterr()
    assert code == 1, said.out
    assert not (tmp_path / "out").exists()


def test_a_parquet_timestamp_column_reads_as_the_same_time_in_jsonl(tiny_tokenizer, tmp_path):
    """Promise (docs/ANONYMIZE.md, Input): 'JSONL ... and Parquet with the same fields', the same
    records read alike in both. A time in JSONL is a number or an ISO-8601 string; in Parquet
    its own type is an Arrow timestamp (what pandas, Spark, DuckDB and a database export
    write for a datetime column). paths.python_values hands records.timestamp_ms a
    datetime.datetime, which it refuses: every row a wrong_type letter ('timestamp is a
    datetime, not a number or string'), the run refused, where the JSONL of the same moments
    (ISO strings) publishes every row."""
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    moments = [dt.datetime(2025, 11, 21, 4, 41, i, 7000, tzinfo=dt.timezone.utc) for i in range(6)]
    records = [chat(i, 0) for i in range(6)]
    as_jsonl = write_jsonl(
        tmp_path / "log.jsonl",
        [
            {**r, "timestamp": m.isoformat().replace("+00:00", "Z")}
            for r, m in zip(records, moments)
        ],
    )
    table = pa.Table.from_pylist(records)
    column = pa.array(moments, type=pa.timestamp("ms", tz="UTC"))
    table = table.set_column(table.schema.get_field_index("timestamp"), "timestamp", column)
    as_parquet = tmp_path / "log.parquet"
    pq.write_table(table, as_parquet)
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    runs = {}
    for name, log in (("jsonl", as_jsonl), ("parquet", as_parquet)):
        out = tmp_path / name
        code = anonymize(tiny_tokenizer, [log], out, "--block-size", "4", "--salt-file", str(salt))
        runs[name] = (code, trace(out))
    assert runs["jsonl"][0] == 0 and len(runs["jsonl"][1]) == 6
    assert runs["parquet"] == runs["jsonl"]


def test_convert_gives_the_same_trace_whatever_the_order_of_its_rows(tmp_path):
    """Promise: same input and config give byte-identical output whatever the order (the
    derived manifest's sources_sha256 names the input's bytes, but the trace is the rows').
    docs/ANALYSIS.md: convert writes the Bailian rows in 'time order', sessions per
    conversation. Rows of one timestamp keep the file's order, and sessions are numbered as
    conversations appear in it: the same five Bailian rows (two conversations of two turns, one
    lone request; three rows at 3.0 s) in two orders give two traces, rows and session numbers
    swapped (transforms/read/bailian: no tie key, where anonymize's rows follow
    ids/row_order.py's total order)."""

    def row(chat, parent, ts, ids, turn=1):
        return {
            "chat_id": chat,
            "parent_chat_id": parent,
            "timestamp": ts,
            "input_length": 16 * len(ids),
            "output_length": 5,
            "type": "text",
            "turn": turn,
            "hash_ids": ids,
        }

    rows = [
        row(1, -1, 1.0, [1]),
        row(2, -1, 1.0, [5]),
        row(3, 1, 3.0, [1, 2], 2),
        row(4, 2, 3.0, [5, 6], 2),
        row(6, -1, 3.0, [9]),
    ]
    traces = []
    for name, order in (("given", rows), ("reversed", rows[::-1])):
        src = write_jsonl(tmp_path / f"{name}.jsonl", order)
        assert main(["convert", str(src), "-o", str(tmp_path / name)]) == 0
        traces.append((tmp_path / name / "trace-00000-of-00001.jsonl").read_bytes())
    assert traces[0] == traces[1]


def test_the_summary_says_how_many_rows_got_an_output_length_of_0(tiny_tokenizer, tmp_path, capsys):
    """Promise (transforms/write/manifest.py, RUN_COUNTS: the run's counts no published row
    proves, 'requests without an output length or with a message the template left out', are
    'kept beside the run's dead letters while it runs, for the CLI's summary'). Since the
    manifest stopped publishing them (8f11592), a request with no output length anywhere is
    published with output_length 0 (docs/ANONYMIZE.md: 'else 0'), counted in run-counts.json as
    without_output_length, and never told: commands/anonymize.py's summary prints the
    unrendered-messages count but not this one. 10 of 20 rows whose output length was made up
    (0, indistinguishable from an empty reply) pass unnoticed: nothing says so."""
    records = [chat(i + 1, DAY0 + 1000 * i) for i in range(20)]
    for record in records[::2]:
        record.pop("output_length")
    log = write_jsonl(tmp_path / "log.jsonl", records)
    capsys.readouterr()
    assert anonymize(tiny_tokenizer, [log], tmp_path / "out", "--block-size", "4") == 0
    said = capsys.readouterr()
    assert sum(row["output_length"] == 0 for row in trace(tmp_path / "out")) == 10
    told = [line for line in (said.out + said.err).splitlines() if "output length" in line]
    assert told and "10" in told[0], said.out + said.err
