"""Red-team round 6: hostile input to `kvtrace anonymize` and the reading commands, past the
round-1..5 fixes (test_redteam_input*.py). Each test asserts a promise the tool makes and fails
today (2026-11-27)."""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers import KVTRACE, kvtrace_child, peak_rss_mb

pytestmark = [pytest.mark.slow]
ROUND6 = "red team round 6"


# ---- a record's values, not its containers: the Unicode walk holds a tuple per value -------

BOUND = 8 << 20
ZEROS = 4_000_000  # `0,` each: a record just under BOUND


def _anonymize_peak(tiny_tokenizer, tmp_path, name: str, data: bytes | None = None) -> int:
    if data is not None:
        (tmp_path / name).write_bytes(data)
    out = tmp_path / f"out-{name}"
    code, peak, said = peak_rss_mb(
        KVTRACE
        + [
            "anonymize",
            "--input",
            str(tmp_path / name),
            "--output",
            str(out),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "16",
            "--processes",
            "1",
            "--max-record-bytes",
            str(BOUND),
        ]
    )
    assert code == 0, said[-2000:]
    return peak


@pytest.mark.parametrize("form", ["jsonl", "parquet"])
def test_a_record_of_many_small_values_costs_what_the_bounds_say(tiny_tokenizer, tmp_path, form):
    """BOUNDS.md: "a record of 8 MiB of "ab", (1.7 M short strings) parses to 152 MB over the
    process, 19 x: the true worst case of a JSONL record" (and "9 x for Parquet"). Only a
    record's containers are bounded before it is parsed; its values are not, and
    json_tree.check_tree, the Unicode walk every Parquet row and every JSONL line orjson does
    not read (a 19-digit number is enough) goes through, pushes a (value, depth) tuple for
    every child of a list at once: 64 bytes per `0,` of input, on top of the parse. An 8 MB
    `input_ids` of zeros with one 19-digit number and one `\\u` escape peaks ~320 MB over the
    process (40 x); the same list in a 1.3 KB Parquet file ~290 MB over (35 x), both exported.
    Promise: every resource bounded before it is spent, as docs/BOUNDS.md states it."""
    baseline = _anonymize_peak(
        tiny_tokenizer,
        tmp_path,
        "small.jsonl",
        b'{"timestamp": 1, "prompt": "hello world", "output_length": 1}\n',
    )
    if form == "jsonl":
        ids = b"0," * (ZEROS - 1) + b"0"
        line = (
            b'{"timestamp":1,"input_ids":[' + ids + b'],"output_length":1,'
            b'"big":1234567890123456789,"s":"\\u0041"}\n'
        )
        assert len(line) < BOUND
        peak = _anonymize_peak(tiny_tokenizer, tmp_path, "zeros.jsonl", line)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(
            pa.table(
                {
                    "timestamp": pa.array([1], pa.int64()),
                    "input_ids": pa.array([[0] * 2_700_000], pa.list_(pa.int64())),
                    "output_length": pa.array([1], pa.int64()),
                }
            ),
            tmp_path / "zeros.parquet",
            compression="zstd",
        )
        assert (tmp_path / "zeros.parquet").stat().st_size < 16 << 10
        peak = _anonymize_peak(tiny_tokenizer, tmp_path, "zeros.parquet")
    over = peak - baseline
    # the documented worst case: 19 x the record (152 MB for 8 MiB)
    assert over <= 20 * (BOUND >> 20), f"{over} MB over the process for an {BOUND >> 20} MiB record"


# ---- trace JSONL: pyarrow's JSON reader, first in line for every trace, recurses natively ----

DEPTH = 20_000  # a 40 KB line


@pytest.mark.parametrize(
    "command",
    [
        ["analyze"],
        ["validate"],
        ["reuse"],
        ["simulate", "--capacity", "100"],
        ["report", "-o", "{out}.html"],
        ["synthesize", "-o", "{out}.jsonl"],
        ["export", "--to", "aiperf", "-o", "{out}.jsonl"],
        ["render", "--tokenizer", "{tok}", "-o", "{out}.jsonl"],
    ],
    ids=lambda c: c[0],
)
def test_a_deeply_nested_field_in_a_trace_line_is_not_a_segfault(tiny_tokenizer, tmp_path, command):
    """Every trace reader streams a JSONL trace through pyarrow's JSON reader first
    (trace_io._read_jsonl_streamed -> pa_json.open_json), and falls back to json.loads line by
    line only when pyarrow raises. pyarrow's parser recurses in C++ on nesting: a row carrying
    any extra field nested 20,000 deep (`"junk": [[[...]]]`, a 40 KB line, far under the 16 MiB
    line bound) overflows the native stack and the process dies of SIGSEGV, silently, before a
    row is checked: analyze, validate, reuse, simulate, report, synthesize, export and render
    alike. Promise: bad input gets a one-line error or a malformed line, never a crash."""
    src = tmp_path / "trace.jsonl"
    src.write_text(
        '{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n'
        '{"timestamp": 1, "input_length": 4, "output_length": 1, "hash_ids": [1], "junk": '
        + "[" * DEPTH
        + "]" * DEPTH
        + "}\n"
    )
    args = [a.format(out=tmp_path / "out", tok=tiny_tokenizer) for a in command]
    done = kvtrace_child(*[args[0], str(src), *args[1:]], timeout=120)
    assert done.returncode >= 0, f"killed by signal {-done.returncode}: {done.stderr[-500:]}"
    assert "Traceback" not in done.stderr, done.stderr[-2000:]


# ---- Parquet: an unused column's nested type is walked by Python recursion -----------------


def test_an_unused_deeply_nested_parquet_column_is_not_a_failed_run(tiny_tokenizer, tmp_path):
    """sources._row_group sizes a row group after paths.without_views(parquet.schema_arrow), a
    recursive rewrite of every column's type (_plain_type), the unused ones too. A Parquet log
    with one column of 1,000 nested lists (a 100 KB file, written without the Arrow schema, so
    pyarrow rebuilds it from the Parquet one) raises RecursionError, which no reader catches:
    on the local engine (in the warm-up, in this process) the whole run fails, "the job failed:
    RecursionError", and the good records of the other input are lost with it; the Beam engine
    reads the same file and publishes every record. Promises: bad input is a dead letter (a
    damaged_file at worst) or a one-line error about it, not a failed run; the same input gives
    the same output whatever the engine."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "good.jsonl").write_text(
        '{"timestamp": 1, "prompt": "hello world", "output_length": 1}\n'
    )
    kind = pa.int64()
    for _ in range(1000):
        kind = pa.list_(kind)
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array([0], pa.int64()),
                "output_length": pa.array([1], pa.int64()),
                "prompt": ["hi"],
                "junk": pa.nulls(1, kind),
            }
        ),
        tmp_path / "deep.parquet",
        store_schema=False,
    )
    outputs = {}
    for engine in ("beam", "local"):
        out = tmp_path / f"out-{engine}"
        done = kvtrace_child(
            *[
                "anonymize",
                "--engine",
                engine,
                "--input",
                str(tmp_path / "good.jsonl"),
                "--input",
                str(tmp_path / "deep.parquet"),
                "--output",
                str(out),
                "--tokenizer",
                tiny_tokenizer,
                # The refused file weighs nearly all the input's bytes (lost whole): the rejection
                # gate would stop the night, which is right but not what this test is about.
                "--max-rejected-fraction",
                "1",
            ],
            env={"KVTRACE_SALT": "a-salt-for-tests-that-is-long-enough"},
        )
        assert done.returncode == 0, f"{engine}: {done.stderr[-600:]}"
        outputs[engine] = (out / "trace-00000-of-00001.jsonl").read_bytes()
    assert outputs["local"] == outputs["beam"]


# ---- the Beam engine tokenized in the CLI's own process: a native abort was a silent death ---


def test_a_record_the_tokenizer_cannot_allocate_for_is_not_a_silent_abort_on_beam(
    tiny_tokenizer, tmp_path
):
    """Round 4's reproducer, fixed for the local engine only ("every run encodes in a worker
    process"; README: "a native abort ... is a one-line error, never the CLI's silent death").
    `--engine beam` (or any Beam option, which picks it) runs Beam's in-process runner, so the
    Rust tokenizer tokenizes input in the CLI's own process: an 8 MB prompt under a 1.5 GB
    address-space limit (as batch schedulers set) aborts it, exit -6 (SIGABRT), having said
    nothing but its start line (Rust's last words go to INFO logs, shown with --verbose only).
    Promise: bad input gets a one-line error or a dead letter, never a silent death. Fixed: the
    Beam engine runs its pipeline in a child process (pipelines/child_process.py), whose death
    is the CLI's one-line error."""

    words = "the quick brown fox jumps over lazy dog again hello world".split()
    text = " ".join(words[i % len(words)] for i in range(1_500_000))
    src = tmp_path / "in.jsonl"
    src.write_text(
        json.dumps({"timestamp": 0, "prompt": text, "output_length": 1})
        + "\n"
        + json.dumps(
            {"timestamp": 1, "messages": [{"role": "user", "content": "hi"}], "output_length": 1}
        )
        + "\n"
    )

    done = kvtrace_child(
        *[
            "anonymize",
            "--engine",
            "beam",
            "--input",
            str(src),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
        ],
        prelude="import resource; resource.setrlimit(resource.RLIMIT_AS, (1_500_000_000,) * 2)",
    )
    assert done.returncode >= 0, f"killed by signal {-done.returncode}: {done.stderr[-1000:]}"
    assert done.stderr.strip().splitlines()[-1].startswith("error: "), done.stderr[-1000:]


# ---- Parquet: a refused row group is counted by the footer's claim, one letter per row -----


def _zigzag_varint(value: int) -> bytes:
    value, out = value << 1, bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _claiming_rows(path, claimed: int, rows: int = 7, prompt_bytes: int = 3000) -> None:
    """A Parquet log of `rows` rows (one uncompressed page per column) whose footer says every
    count of rows and values is `claimed` (Thrift compact i64 fields rewritten, footer length
    fixed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array(range(rows), pa.int64()),
                "prompt": ["z" * prompt_bytes + str(i) for i in range(rows)],
                "output_length": pa.array([1] * rows, pa.int64()),
            }
        ),
        path,
        use_dictionary=False,
        compression="none",
    )
    data = path.read_bytes()
    footer_bytes = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_bytes
    footer = data[start:-8].replace(
        b"\x16" + _zigzag_varint(rows), b"\x16" + _zigzag_varint(claimed)
    )
    path.write_bytes(data[:start] + footer + len(footer).to_bytes(4, "little") + b"PAR1")
    assert pq.ParquetFile(path).metadata.row_group(0).num_rows == claimed


def test_a_refused_row_group_costs_the_rows_it_holds_not_the_rows_its_footer_claims(
    tiny_tokenizer, tmp_path
):
    """BOUNDS.md: "the footer's chunk sizes and value counts are never trusted"; a row group
    whose pages are over the bound has "every row of its row group a too_large dead letter,
    unread". Which rows: sources._unread_rows writes one letter per row the footer's
    RowGroup.num_rows claims, a number nothing checks against the pages. A 34 KB file of 7
    rows whose footer claims 1,000,000 (read at --max-record-bytes 8192, its pages over 2 x
    that) is 1,000,000 dead letters: 40 s of a core and 1,000,001 records "read" from two
    files of 8; a claim of 10^12 is days of a core and terabytes of staged letters, from the
    same 34 KB. Promises: every resource bounded before it is spent (by the file, not by what
    it says); counts add up (records read are records there)."""
    import re

    _claiming_rows(tmp_path / "claims.parquet", 1_000_000)
    (tmp_path / "good.jsonl").write_text(
        '{"timestamp": 1, "prompt": "hello world", "output_length": 1}\n'
    )
    done = kvtrace_child(
        *[
            "anonymize",
            "--input",
            str(tmp_path / "claims.parquet"),
            "--input",
            str(tmp_path / "good.jsonl"),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            tiny_tokenizer,
            "--max-record-bytes",
            "8192",
        ]
    )
    said = done.stderr
    counted = re.search(r"(\d+) of (\d+) records", said)
    assert counted, said[-1000:]
    assert int(counted.group(2)) <= 8, said.strip().splitlines()[-1]


# ---- Parquet: an empty list is sized as nothing, so a row of millions of them is decoded ---


def test_a_row_of_empty_lists_is_sized_before_it_becomes_python_values(tiny_tokenizer, tmp_path):
    """BOUNDS.md: each Parquet row is "sized from its offsets ... before it becomes Python
    values"; "over the bound: too_large, never decoded". arrow_sizes._value_bytes sizes a list
    as the sum of its values, each at least a byte: an empty list `[]` (2 bytes of JSON, a
    56-byte Python list) counts 0, and so does a list of them. A 1.6 KB Parquet log whose one
    row carries, in a column anonymize never uses, 4,000,000 empty lists (list<list<int8>>) is
    sized as 0 bytes of junk, turned into 4 M Python lists, dumped as a 16 MB JSON line and
    only then refused ("row of 16000071 bytes as JSON, over --max-record-bytes 4194304"):
    ~370 MB over the process at a 4 MiB bound (the documented Parquet reading: about 9 x).
    Among rows of a row group, one row may hold the group's whole average of such values: the
    same cell then costs 64 bytes per value unbounded by the row's bound. Promise: every
    resource bounded before it is spent."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, bound = 4_000_000, 4 << 20
    inner = pa.ListArray.from_arrays(pa.array([0] * (n + 1), pa.int32()), pa.array([], pa.int8()))
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array([1], pa.int64()),
                "prompt": ["hello world"],
                "output_length": pa.array([1], pa.int64()),
                "junk": pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), inner),
            }
        ),
        tmp_path / "empties.parquet",
        compression="zstd",
    )
    assert (tmp_path / "empties.parquet").stat().st_size < 4 << 10
    (tmp_path / "small.jsonl").write_text(
        '{"timestamp": 1, "prompt": "hello world", "output_length": 1}\n'
    )
    peaks = {}
    for name in ("small.jsonl", "empties.parquet"):
        _, peaks[name], said = peak_rss_mb(
            KVTRACE
            + [
                "anonymize",
                "--input",
                str(tmp_path / name),
                "--input",
                str(tmp_path / "small.jsonl"),
                "--output",
                str(tmp_path / f"out-{name}"),
                "--tokenizer",
                tiny_tokenizer,
                "--processes",
                "1",
                "--max-record-bytes",
                str(bound),
                "--max-rejected-fraction",
                "1",
            ]
        )
        assert "Traceback" not in said, said[-2000:]
    over = peaks["empties.parquet"] - peaks["small.jsonl"]
    assert over <= 9 * (bound >> 20) + 24, f"{over} MB over the process for a 1.6 KB file"


# ---- trace readers: a row's ids are numbered one level (one numpy pass) per id --------------


@pytest.mark.parametrize(
    "command",
    [["analyze"], ["validate"], ["simulate", "--capacity", "100"], ["synthesize", "-o", "{out}"]],
    ids=lambda c: c[0],
)
def test_one_long_trace_row_costs_time_linear_in_its_bytes(tmp_path, command):
    """stats.trace_blocks.prefix_ids numbers every block by its prefix "level by level": one
    round of numpy calls (argsort, lexsort, diff, cumsum) per position of the longest row, each
    ~60-150 us of fixed cost whatever the rows at that level. One row of 1,000,000 ids (within
    the 16 MiB line bound and MAX_ROW_IDS), all `0`, is a 2 KB .gz: analyze spends 75-150 s of
    a core on it (cProfile: prefix_ids 147 s of 151), validate, simulate and synthesize alike,
    where a trace of the same 2 MB in short rows takes a second. A folder of such files is
    hours. Promise: every resource (CPU time included) bounded before it is spent; a trace line
    is bounded in bytes, and what a line costs should follow its bytes."""
    import gzip

    n = 1_000_000
    src = tmp_path / "trace.jsonl.gz"
    with gzip.open(src, "wt", compresslevel=9) as handle:
        handle.write(
            f'{{"timestamp": 0, "input_length": {16 * n}, "output_length": 1, '
            f'"hash_ids": [{",".join(["0"] * n)}]}}\n'
        )
    assert src.stat().st_size < 4 << 10
    args = [a.format(out=tmp_path / "out.jsonl") for a in command]
    try:
        # ~1 s for the same bytes in short rows; 18 s here on a quiet machine (was 75-150 s)
        kvtrace_child(*[args[0], str(src), "--block-size", "16", *args[1:]], timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{command[0]} of a {src.stat().st_size}-byte trace not done in 10 s")


# ---- trace JSONL: the streamed reader builds a column for every field of every row ---------


def test_a_trace_with_many_extra_fields_costs_its_trace_fields_not_a_column_each(tmp_path):
    """Round 5 made the line-by-line trace reader keep "only their trace fields as they go";
    but every JSONL trace goes first through pyarrow's streamed JSON reader
    (trace_io._streamed_columns), which infers a column for every field of the first block and
    builds every column of every block before _columns_from_table picks the trace fields. A
    row may carry any field: three 1 MB rows of 90,000 extra fields `"kN": 0` (a 3 MB file)
    peak at ~630 MB in analyze (one row 374 MB, ten 1.04 GB), 38 s of a core (ten: 98 s),
    where the same rows read line by line, or the same 3 MB of short rows, take ~100 MB.
    Promise: every resource bounded before it is spent (round 5's own bar for a 12-line
    trace of 4 MiB lines: 400 MB)."""
    keys = ",".join(f'"k{i}": 0' for i in range(90_000))
    row = f'{{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1], {keys}}}\n'
    src = tmp_path / "trace.jsonl"
    src.write_text(row * 3)
    code, peak, said = peak_rss_mb(KVTRACE + ["analyze", str(src)])
    assert code == 0, said[-1000:]
    assert peak < 400, f"{peak} MB peak reading a {src.stat().st_size}-byte trace of 3 rows"


def test_a_nested_field_under_the_crash_depth_costs_time_linear_in_its_bytes(tmp_path):
    """Below the depth that crashes it (above), pyarrow's streamed JSON reader, first in line
    for every JSONL trace, spends time quadratic in a field's nesting: a 10 KB line nested
    5,000 deep takes 13-29 s (pyarrow's open_json alone: 13.4 s), 10,000 deep (20 KB) 103 s of
    analyze, per 1 MiB block that holds one (three such rows in a block cost what one does):
    a trace padded to one per block is minutes per MiB, hours for a small .gz. Promise: every
    resource (CPU time included) bounded before it is spent; what a trace line costs follows
    its bytes (a 24 KB line of short values reads in well under a second)."""
    depth = 12_000
    src = tmp_path / "trace.jsonl"
    src.write_text(
        '{"timestamp": 1, "input_length": 4, "output_length": 1, "hash_ids": [1], "junk": '
        + "[" * depth
        + "]" * depth
        + "}\n"
    )
    try:
        kvtrace_child(*["analyze", str(src)], timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"analyze of a {src.stat().st_size}-byte trace not done in 15 s")


# ---- trace Parquet: a column name given twice is an unanticipated failure of the whole read -


@pytest.mark.parametrize("command", ["analyze", "validate"])
def test_a_trace_parquet_naming_a_column_twice_is_a_malformed_file_not_a_failed_job(
    tmp_path, command
):
    """A Parquet file may name two columns alike (pyarrow writes it). trace_io._read_parquet
    turns what read_parquet_within raises (OSError, ValueError, ArrowException) into a
    malformed line 0 "not a readable Parquet file", and the other inputs read on; two
    `hash_ids` columns make it raise KeyError ("Column hash_ids does not exist in schema"),
    which nothing expects: every trace reader (analyze, validate, reuse, synthesize, export)
    stops with "the job failed: KeyError ... (run with --verbose for the traceback)", the
    bug path, and the good trace beside it is not read. Promise: bad input gets a one-line
    error about it or is reported and skipped, as any other unreadable Parquet file is."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.Table.from_arrays(
            [
                pa.array([0, 1], pa.int64()),
                pa.array([4, 4], pa.int64()),
                pa.array([1, 1], pa.int64()),
                pa.array([[1], [2]], pa.list_(pa.int64())),
                pa.array([[3], [4]], pa.list_(pa.int64())),
            ],
            names=["timestamp", "input_length", "output_length", "hash_ids", "hash_ids"],
        ),
        tmp_path / "twice.parquet",
    )
    good = tmp_path / "good.jsonl"
    good.write_text('{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n')
    done = kvtrace_child(*[command, str(good), str(tmp_path / "twice.parquet")], timeout=120)
    assert "the job failed" not in done.stderr, done.stderr[-1000:]


def test_a_footer_claiming_many_rows_does_not_let_one_cell_of_millions_of_values_decode(
    tiny_tokenizer, tmp_path
):
    """BOUNDS.md: "rows averaging more values than the bound ... counted from the page
    headers, is refused"; "the footer's chunk sizes and value counts are never trusted". The
    average divides by RowGroup.num_rows, the footer's claim. A 3-row group whose first cell
    holds 30,000,000 dictionary-encoded zeros (RLE: a 1.6 KB file) is refused unread at a
    1 MiB bound (94 MB peak); rewrite the footer's row counts to say 10^9 and the average
    passes: Arrow decodes the 30 M values (240 MB dense, more as a list) before the row is
    sized and refused, ~505 MB peak, and the same 1.6 KB at 300 M values is gigabytes. The
    "pages it spans bound that" of the documented residual does not hold for RLE either.
    Promise: every resource bounded before it is spent."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, claimed = 30_000_000, 10**9
    ids = pa.ListArray.from_arrays(
        pa.array([0, n, n + 1, n + 2], pa.int32()), pa.array(np.zeros(n + 2, dtype=np.int64))
    )
    path = tmp_path / "rle.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array([0, 1, 2], pa.int64()),
                "prompt": ["hi", "ho", "hu"],
                "output_length": pa.array([1, 1, 1], pa.int64()),
                "ids": ids,
            }
        ),
        path,
        use_dictionary=True,
        compression="zstd",
    )
    data = path.read_bytes()
    footer_bytes = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_bytes
    footer = data[start:-8].replace(b"\x16" + _zigzag_varint(3), b"\x16" + _zigzag_varint(claimed))
    path.write_bytes(data[:start] + footer + len(footer).to_bytes(4, "little") + b"PAR1")
    assert pq.ParquetFile(path).metadata.row_group(0).num_rows == claimed
    assert path.stat().st_size < 4 << 10
    (tmp_path / "small.jsonl").write_text(
        '{"timestamp": 1, "prompt": "hello world", "output_length": 1}\n'
    )
    peaks = {}
    for name in ("small.jsonl", "rle.parquet"):
        _, peaks[name], said = peak_rss_mb(
            KVTRACE
            + [
                "anonymize",
                "--input",
                str(tmp_path / name),
                "--input",
                str(tmp_path / "small.jsonl"),
                "--output",
                str(tmp_path / f"out-{name}"),
                "--tokenizer",
                tiny_tokenizer,
                "--processes",
                "1",
                "--max-record-bytes",
                str(1 << 20),
                "--max-rejected-fraction",
                "1",
            ]
        )
        assert "Traceback" not in said, said[-2000:]
    over = peaks["rle.parquet"] - peaks["small.jsonl"]
    assert over <= 100, f"{over} MB over the process for a 1.6 KB file at a 1 MiB bound"
