"""Red team round 9, hostile input: reproducers of the holes found past the round-1..8 fixes
(test_redteam_input*.py). Each asserts the promised behaviour (bad input: a one-line error that
names what is wrong, never an unanticipated exception) and fails today (2026-11-27)."""

from __future__ import annotations

import io
import json
import shutil

import pytest

from helpers import KVTRACE, kvtrace_child, peak_rss_mb, write_jsonl

pytestmark = pytest.mark.slow

# Deeper than CPython's JSON parser survives (it raises RecursionError past ~1000 levels).
DEEP = 5000


def _one_chat(tmp_path) -> str:
    return str(
        write_jsonl(
            tmp_path / "logs.jsonl",
            [{"timestamp": 1_700_000_000, "messages": [{"role": "user", "content": "hi"}]}],
        )
    )


def test_a_deeply_nested_tokenizer_config_is_named_in_one_line(tiny_tokenizer, tmp_path):
    """fast_tokenizer._json_object catches json.JSONDecodeError only: a 10 KB
    tokenizer_config.json of 5,000 nested lists raises RecursionError, which the CLI's
    catch-all reports as "the job failed: RecursionError: maximum recursion depth exceeded
    ... (run with --verbose for the traceback)", naming neither the file nor its fault (exit
    1, as for a failed job, not 2 for bad input); anonymize, audit and render alike, on both
    engines. A shallow damaged config is "error: tokenizer_config.json: not JSON (...)"."""
    folder = tmp_path / "tokenizer"
    shutil.copytree(tiny_tokenizer, folder)
    (folder / "tokenizer_config.json").write_text("[" * DEEP + "]" * DEEP)
    done = kvtrace_child(
        "anonymize",
        "--input",
        _one_chat(tmp_path),
        "--output",
        str(tmp_path / "out"),
        "--tokenizer",
        str(folder),
        "--quiet",
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "tokenizer_config.json" in done.stderr, done.stderr
    assert "RecursionError" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists()


def test_deeply_nested_chat_template_kwargs_are_refused_naming_the_flag(tiny_tokenizer, tmp_path):
    """anonymize.py reads --chat-template-kwargs with a bare json.loads (as do `check` and
    `replay`): a 10 KB value nested 5,000 deep is "the job failed: RecursionError ...", exit
    1, where every other bad value of the flag is a usage error naming it (exit 2)."""
    kwargs = json.dumps({"enable_thinking": False})[:-1] + ', "x": ' + "[" * DEEP + "]" * DEEP
    done = kvtrace_child(
        "anonymize",
        "--input",
        _one_chat(tmp_path),
        "--output",
        str(tmp_path / "out"),
        "--tokenizer",
        tiny_tokenizer,
        "--quiet",
        "--chat-template-kwargs",
        kwargs + "}",
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "--chat-template-kwargs" in done.stderr, done.stderr
    assert "RecursionError" not in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def _named_writer(path, writer: str) -> None:
    """Rewrites a Parquet file's footer to name `writer` as the program that wrote it (the
    footer's created_by string, its length prefix and the footer's length)."""
    import pyarrow.parquet as pq

    data = path.read_bytes()
    footer_bytes = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_bytes
    footer = data[start:-8]
    old = pq.ParquetFile(io.BytesIO(data)).metadata.created_by.encode()
    at = footer.find(old)
    new = writer.encode()
    assert footer[at - 1] == len(old) and len(new) < 128  # a one-byte length prefix
    footer = footer[: at - 1] + bytes([len(new)]) + new + footer[at + len(old) :]
    path.write_bytes(data[:start] + footer + len(footer).to_bytes(4, "little") + b"PAR1")


@pytest.mark.parametrize(
    "writer",
    [
        "parquet-mr version 1.2.4294967296 (build x)",  # patch 2^32: Arrow's int reads 0
        "parquet-mr version 1.4294967298.0 (build x)",  # minor 2^32 + 2: Arrow's int reads 2
    ],
)
def test_a_parquet_mr_version_arrow_reads_as_old_is_refused(tmp_path, writer):
    """Round 8 refused footers naming parquet-mr before 1.2.9 (paths._check_writer), for which
    Arrow reads each column chunk 100 bytes past its stated size (PARQUET-816) where the page
    walk never looks. But kvtrace reads the version as Python ints of any length, and
    Arrow as C ints, which wrap past 2^31: a version kvtrace reads as
    1.2.4294967296 (>= 1.2.9: passed) Arrow reads as 1.2.0 (< 1.2.9: padded). Round 8's
    1.4 KB trace file, its hidden page holding a cell of 40 M nulls, written by such a
    version: `analyze` peaks at ~1.16 GB (89 MB when the writer says 1.2.8 and is refused).
    Promise: every resource bounded before it is spent (docs/BOUNDS.md)."""
    from test_redteam_input_round8 import _hidden_last_page

    src = tmp_path / "trace.parquet"
    _hidden_last_page(src, 40_000_000)
    _named_writer(src, writer)
    assert src.stat().st_size < 2048
    _, peak, said = peak_rss_mb([*KVTRACE, "analyze", str(src), "--block-size", "16"])
    assert "Traceback" not in said, said[-2000:]
    assert peak < 300, f"{peak} MB peak reading a {src.stat().st_size}-byte Parquet file"


def test_a_parquet_log_of_many_columns_is_read_within_the_documented_bound(
    tiny_tokenizer, tmp_path
):
    """BOUNDS.md: "a worker's reading stays under about 3 x --max-record-bytes for JSONL and
    9 x for Parquet", the footer bounded by --max-record-bytes in bytes. But what Arrow and
    the page walks spend follows the count of columns and column chunks the footer declares,
    not its bytes: a 4.7 MB file of one row and 32,000 null columns (footer 3.9 MB, under
    --max-record-bytes 4MiB) peaks at ~415 MB (89 MB for a one-line input; +325 MB, 81 x the
    bound): opening it (+89 MB), decoding its row group (+119 MB) and the sizing walks. At
    the default 16 MiB, an 18.7 MB file of 125,000 columns peaks at 1.43 GB (19 s)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "wide.parquet"
    columns = 32_000
    names = ["timestamp", "prompt"] + [f"{i:x}" for i in range(columns)]
    arrays = [pa.array([1_700_000_000], pa.int64()), pa.array(["hi there"])]
    table = pa.Table.from_arrays(arrays + [pa.nulls(1)] * columns, names=names)
    pq.write_table(table, src, write_statistics=False, compression="none", use_dictionary=False)
    assert pq.ParquetFile(src).metadata.serialized_size < 4 << 20
    _, peak, said = peak_rss_mb(
        [
            *KVTRACE,
            "anonymize",
            "--input",
            str(src),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
            "--processes",
            "1",
            "--max-record-bytes",
            "4MiB",
            "--quiet",
        ]
    )
    assert "Traceback" not in said, said[-2000:]
    assert peak < 250, f"{peak} MB peak reading a {src.stat().st_size}-byte Parquet file"


def test_standard_input_is_told_parquet_within_the_footer_bound(tiny_tokenizer, tmp_path):
    """decompress.standard_input_form tells Parquet on `--input -` by opening the spooled copy
    with pyarrow (_is_parquet), its footer allowed up to MAX_SNIFFED_FOOTER_BYTES (64 MiB)
    whatever --max-record-bytes says, in the CLI's own process. A footer's decoded form
    follows its column chunks, ~20 x its bytes: a 56 MB footer-only file (3,000 columns in
    400 row groups) peaks at 1.14 GB on standard input, and at 89 MB given by path, where
    the 16 MiB footer bound refuses it before Arrow parses it (the same too_large letter)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {f"{i}": pa.nulls(1) for i in range(3000)}
    table = pa.table({"timestamp": [1_700_000_000], "prompt": ["hi there"], **columns})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, write_statistics=False, use_dictionary=False)
    metadata = pq.ParquetFile(io.BytesIO(buffer.getvalue())).metadata
    group = pq.ParquetFile(io.BytesIO(buffer.getvalue())).metadata
    for _ in range(399):
        metadata.append_row_groups(group)
    src = tmp_path / "footer.parquet"
    metadata.write_metadata_file(str(src))
    assert src.stat().st_size > 48 << 20
    out = tmp_path / "out"
    # The shell gives the file as standard input to the CLI, whose peak peak_rss_mb takes.
    command = [
        "sh",
        "-c",
        '"$@" < "$0"',
        str(src),
        *KVTRACE,
        "anonymize",
        "--input",
        "-",
        "--output",
        str(out),
        "--tokenizer",
        tiny_tokenizer,
        "--quiet",
    ]
    _, peak, said = peak_rss_mb(command)
    assert "Traceback" not in said, said[-2000:]
    assert "too_large" in said, said[-2000:]
    assert peak < 300, f"{peak} MB peak telling the form of {src.stat().st_size} bytes on stdin"


@pytest.mark.parametrize("capacity", ["3,000,000", "1,5GB"])
def test_a_size_written_with_separators_is_not_read_as_a_list(tmp_path, capacity):
    """capacity.parse_capacities splits --capacity at commas (a list: 3M,50M), so a size
    written with thousands separators is a list of other sizes: `simulate --capacity
    3,000,000` simulates 3 tokens and 0 tokens twice and exits 0, as `1,5GB` (a decimal
    comma) is 1 token and 5 GB. The parser refuses a bare 40G because "bytes or tokens is
    the question a typo must not answer" (capacity.py); this typo answers how many."""
    trace = tmp_path / "t.jsonl"
    write_jsonl(
        trace,
        [
            {"timestamp": i, "input_length": 8, "output_length": 1, "hash_ids": [0, i]}
            for i in range(4)
        ],
    )
    done = kvtrace_child(
        "simulate", str(trace), "--block-size", "4", "--capacity", capacity,
        "--kv-bytes-per-token", "1000",
    )  # fmt: skip
    assert done.returncode == 2, done.stdout[-1000:]
    assert capacity in done.stderr, done.stderr


def test_a_parquet_page_failing_its_checksum_is_a_damaged_file_not_a_record(
    tiny_tokenizer, tmp_path
):
    """A Parquet page may carry a CRC of its bytes (pyarrow: write_page_checksum=True), and
    Arrow checks it when asked (page_checksum_verification).
    kvtrace never asks (paths.parquet_file, trace_io): a page whose bytes changed after it was
    written, its CRC saying so, is decoded and published as if whole (30 of 30 exported, the
    damaged prompt hashed), where a .gz, .zst, .xz or .bz2 failing its check is a
    damaged_file letter. Promise: bad input is a dead letter, never a record."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "logs.parquet"
    prompts = [f"hello number {i} " * 20 for i in range(30)]
    table = pa.table({"timestamp": [1_700_000_000 + i for i in range(30)], "prompt": prompts})
    pq.write_table(
        table, src, row_group_size=10, compression="none", use_dictionary=False,
        write_page_checksum=True,
    )  # fmt: skip
    data = bytearray(src.read_bytes())
    at = data.index(b"hello number 15")
    data[at : at + 5] = b"HELLO"  # a byte flipped on disk, after the page's CRC was taken
    src.write_bytes(bytes(data))
    out = tmp_path / "out"
    done = kvtrace_child(
        "anonymize", "--input", str(src), "--output", str(out), "--tokenizer", tiny_tokenizer,
        "--block-size", "4", "--max-rejected-fraction", "1", "--quiet",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    letters = [
        json.loads(line)
        for path in sorted((tmp_path / "out-rejected").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert [letter["error"] for letter in letters] == ["damaged_file"], done.stderr


def test_containers_inside_tool_call_arguments_are_bounded_as_the_record_s_are(
    tiny_tokenizer, tmp_path
):
    """BOUNDS.md: every JSON line reader counts a line's containers before parsing it
    (json_tree.containers_over, brackets inside strings not counted: they are text), so "a
    record of 8 MiB of `[],` is now refused unparsed (was 612 MB peak, 31 x)", and the worst
    record peaks at 244 MB (8 MiB of short strings). But a tool call's `arguments` is a JSON
    text inside a string, parsed by chat._arguments (json_tree.loads_checked) with no count:
    an 8 MB record whose arguments are `[[],[],...]` is parsed into 2.7 M lists, 354 MB peak
    (`--processes 1 --max-record-bytes 8388608`), before the record is even found to lack a
    timestamp (a missing_timestamp letter)."""
    arguments = "[" + "[]," * (8_000_000 // 3) + "[]]"
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    src = write_jsonl(tmp_path / "logs.jsonl", [{"messages": messages}])
    _, peak, said = peak_rss_mb(
        [
            *KVTRACE,
            "anonymize",
            "--input",
            str(src),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            tiny_tokenizer,
            "--processes",
            "1",
            "--max-record-bytes",
            "8388608",
            "--quiet",
        ]  # fmt: skip
    )
    assert "Traceback" not in said, said[-2000:]
    assert peak < 250, f"{peak} MB peak for one {src.stat().st_size}-byte record"
