"""Red-team round 2: hostile input to `kvtrace anonymize` and the reading commands, past the
round-1 fixes (test_redteam_input.py). Each test asserts a promise the tool makes and fails
today (2026-11-26)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from helpers import ROOT, anonymize, chat, peak_rss_mb, trace, write_jsonl

pytestmark = [pytest.mark.slow]
ROUND2 = "red team round 2"


def _template_folder(tiny_tokenizer, tmp_path, template: str):
    folder = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, folder)
    (folder / "chat_template.jinja").write_text(template + "{{ messages[0].content }}")
    return folder


# ---- one-call builders the sandbox does not size --------------------------------------------

# bounded_sandbox.py sizes *, **, %, format, expandtabs, join, replace, indent, ~ and +. Other
# single C calls build a value far larger than their operands, unsized: each below builds a
# 300 M-character value (over MAX_VALUE_LENGTH, 256 Mi) in one call the watchdog cannot stop,
# and the request is exported through it. Scaled 10x it is 3 GB in one allocation.
UNSIZED = {
    # str.translate: each character mapped to a 1 M-character string
    "str.translate": "{{ ('x' * 300).translate({120: 'y' * 1000000})|length }}",
    # jinja's wordwrap: wrapstring.join over every wrapped line
    "wordwrap wrapstring": "{{ ('a ' * 300)|wordwrap(1, wrapstring='x' * 1000000)|length }}",
    # str() of a list that holds one long string 300 times (|string, print, ~ all call it)
    "string of a repeated list": "{{ ([('x' * 1000000)] * 300)|string|length }}",
    # transformers' tojson: json.dumps of the same
    "tojson of a repeated list": "{{ ([('x' * 1000000)] * 300)|tojson|length }}",
    # markupsafe's escape: '\"' becomes '&#34;', 5x
    "escape": "{{ ('\"' * 60000000)|e|length }}",
    # jinja's join with attribute=: the items sized are the dicts (0), not the strings joined
    "join attribute": "{{ ([{'a': 'x' * 1000000}] * 300)|join(attribute='a')|length }}",
    # transformers' tojson with indent (under MAX_ARGUMENT): a million spaces per line
    "tojson indent": "{{ ([0] * 300)|tojson(indent=1000000)|length }}",
}


@pytest.mark.parametrize("template", UNSIZED.values(), ids=UNSIZED.keys())
def test_a_template_cannot_build_a_value_past_the_bound_in_an_unsized_call(
    tiny_tokenizer, tmp_path, template
):
    folder = _template_folder(tiny_tokenizer, tmp_path, template)
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), chat(1, 10)])
    anonymize(str(folder), [src], tmp_path / "out", "--block-size", "4", "--processes", "1")
    # a value over MAX_VALUE_LENGTH was built: no request may be exported through it
    assert not list((tmp_path / "out").glob("trace-*")) or trace(tmp_path / "out") == []


# ---- one C call that runs for hours: the render budget never fires, nor does SIGTERM --------


def test_a_template_cannot_hang_the_run_in_one_c_call(tiny_tokenizer, tmp_path):
    """`sum` of a million one-item lists with start=[] is one C call (builtin sum) doing
    quadratic work (5e11 pointer copies) on 8 MB: every check passes (no integer over
    MAX_ARGUMENT, no value over the bound). The call holds the GIL, so neither the render
    watchdog (5 s budget) nor the stop watcher can run: the run hangs for well over ten minutes
    (measured: 11 min of CPU, then SIGKILL), and neither `timeout`'s SIGTERM nor Ctrl-C
    (SIGINT, measured: still running 20 s after it) is honoured."""
    folder = _template_folder(
        tiny_tokenizer, tmp_path, "{{ ([[1]] * 1000000)|sum(start=[])|length }}"
    )
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), chat(1, 10)])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvtrace.cli",
            "anonymize",
            "--input",
            str(src),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            str(folder),
            "--block-size",
            "4",
            "--processes",
            "1",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    try:
        time.sleep(20)  # start-up, then 5 s of render budget, with room to spare
        if proc.poll() is None:
            proc.terminate()  # SIGTERM: a stopped run ends promptly
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        ended = proc.poll() is not None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert ended, "still running 40 s in (20 s after SIGTERM) on a 2-record input"


# ---- a Parquet dictionary bomb through the dense fallback -------------------------------------


def _prompt_bomb(path, rows: int) -> None:
    """The round-1 bomb plus one row written after pyarrow's writer fell back to PLAIN pages."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array(["not a time"] * (rows + 1)),  # rejected once read
                "prompt": pa.array(["hello " * 650_000] * rows + ["b"]),
                "output_length": pa.array([1] * (rows + 1)),
            }
        ),
        path,
        compression="zstd",
        write_batch_size=rows,
        data_page_size=1024,
    )


def _messages_bomb(path, rows: int) -> None:
    """Chat rows as any tool writes them: pyarrow's defaults, one 3.9 MB message repeated."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array(["not a time"] * rows),
                "messages": pa.array([[{"role": "user", "content": "hello " * 650_000}]] * rows),
                "output_length": pa.array([1] * rows),
            }
        ),
        path,
        compression="zstd",
    )


@pytest.mark.parametrize("write", [_prompt_bomb, _messages_bomb], ids=["prompt", "messages"])
def test_a_dictionary_bomb_with_one_plain_page_is_read_within_the_bound(
    tiny_tokenizer, tmp_path, write
):
    """A 3.9 MB dictionary entry referenced by 128 rows (a 1.5-2.4 KB file), whose column chunk
    also holds a PLAIN page: pyarrow's writer falls back to PLAIN once its dictionary is over
    dictionary_pagesize_limit (1 MB), which any entry over 1 MB does, with its defaults too
    (the messages case: pages dictionary, 127 indices, 1 PLAIN value). paths.group_reader reads
    a chunk whose pages are not all dictionary-indexed dense (_dictionary_throughout), so Arrow
    decodes 64 rows at once, 3.9 MB each, before any row is sized. Measured: ~870 MB peak
    (138 MB for the round-1 bomb), where docs/BOUNDS.md promises reading under
    9 x --max-record-bytes (36 MiB here)."""
    rows = 128
    path = tmp_path / "bomb.parquet"
    write(path, rows)
    assert path.stat().st_size < 4096
    code, peak, said = peak_rss_mb(
        [
            sys.executable,
            "-m",
            "kvtrace.cli",
            "anonymize",
            "--input",
            str(path),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
            "--processes",
            "1",
            "--max-record-bytes",
            str(4 << 20),
        ],
        ROOT,
    )
    assert peak < 9 * 4 + 300, f"{peak} MB peak reading a {rows}-row, 2 KB Parquet file"


# ---- a Parquet page header nested past Python's recursion limit ends the run ------------------


@pytest.mark.parametrize("engine", ["local", "beam"])
def test_a_page_header_of_nested_lists_is_a_damaged_file_not_a_failed_run(
    tiny_tokenizer, tmp_path, engine
):
    """paths._CompactReader bounds nesting only in struct(): a list (or map) of lists recurses
    through _value without a depth check. A Parquet file whose column chunk is over the bound
    (so its page headers are read, paths.oversized_pages) with 5,000 bytes of 0x19 (a list of
    one list of one list...) as its first page header raises RecursionError, which neither
    sources._parquet nor its callers catch (they catch OSError, ValueError, ArrowException):
    the whole run fails ("the job failed: RecursionError"), losing the good file beside it,
    instead of one damaged_file dead letter."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 20
    path = tmp_path / "nested.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array(list(range(rows))),
                "prompt": pa.array(["hello world " * 100] * rows),
                "output_length": pa.array([1] * rows),
            }
        ),
        path,
        compression="none",
        use_dictionary=False,
    )
    offset = pq.ParquetFile(path).metadata.row_group(0).column(1).data_page_offset
    data = bytearray(path.read_bytes())
    data[offset : offset + 5000] = b"\x19" * 5000
    path.write_bytes(bytes(data))
    good = write_jsonl(tmp_path / "good.jsonl", [chat(i, i) for i in range(4)])
    out = tmp_path / "out"
    code = anonymize(
        tiny_tokenizer,
        [good, path],
        out,
        "--block-size",
        "4",
        "--max-record-bytes",
        "10000",
        "--max-rejected-fraction",
        "1",
        "--engine",
        engine,
    )
    assert code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["records"]["exported"] == 4  # the run's other counts are private: letters
    letters = [
        json.loads(line)
        for f in (tmp_path / "out-rejected").glob("rejected-*.jsonl")
        for line in f.read_text().splitlines()
    ]
    assert [letter["error"] for letter in letters] == ["damaged_file"]


# ---- render drops malformed rows without a word -----------------------------------------------


def test_render_says_so_when_it_leaves_out_malformed_rows(tiny_tokenizer, tmp_path, capsys):
    """`kvtrace render` on a 3-line trace whose middle line is not JSON says "rendered 2 of 2
    rows" and exits 0: the malformed row is counted only in --json's report
    (pipelines/render.py `malformed_lines`), never said (kvtrace/commands/replay.run), where
    `export` refuses the same trace in one line (exit 2) and analyze/reuse/simulate list it."""
    from kvtrace.cli import main

    src = tmp_path / "trace.jsonl"
    src.write_text(
        '{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [0, 1]}\n'
        "not json\n"
        '{"timestamp": 5, "input_length": 8, "output_length": 2, "hash_ids": [0, 2]}\n'
    )
    code = main(
        [
            "render",
            str(src),
            "--tokenizer",
            tiny_tokenizer,
            "--output",
            str(tmp_path / "requests.jsonl"),
            "--block-size",
            "4",
        ]
    )
    said = capsys.readouterr()
    assert code != 0 or "malformed" in said.err + said.out or "of 3 rows" in said.out, said.out


# ---- a line with no end is read once per range: quadratic reading --------------------------


def test_a_line_without_a_newline_is_read_about_once(tmp_path, monkeypatch):
    """A plain file is read in ranges (the local engine's claims of 2 MiB, Beam's 8 MiB splits);
    each range after the first starts by skipping to the next newline (paths.read_lines ->
    _skip_line), so in a file whose bytes hold no newline every range reads to its end: a
    100 MB file is read ~2.5 GB, a 1 GB one ~250 GB. A sparse file costs no disk: `truncate -s
    10G` is hours of reading (measured with `kvtrace anonymize --processes 1`: 100 MB 3.5 s,
    200 MB 13 s, 4x for 2x), where docs/BOUNDS.md promises an oversized line skipped in 1 MiB
    steps to the next newline, once."""
    import io

    from kvtrace.pipelines.anonymize_local import CLAIM_BYTES
    from kvtrace.transforms.read import sources
    from kvtrace.transforms.read.sources import file_ranges, read_range

    path = tmp_path / "sparse.jsonl"
    with open(path, "wb") as handle:
        handle.write(b'{"timestamp": 0, "prompt": "hello world", "output_length": 1}\n')
        handle.truncate(100 << 20)  # zeros, no newline: no disk
    size = path.stat().st_size
    consumed = [0]

    class Counting(io.FileIO):
        def readinto(self, buffer):
            got = super().readinto(buffer)
            consumed[0] += got or 0
            return got

    monkeypatch.setattr(sources, "open_stream", lambda name: io.BufferedReader(Counting(name)))
    records = [
        item
        for piece in file_ranges(str(path), size, CLAIM_BYTES)
        for item in read_range(piece, 16 << 20)
    ]
    assert len(records) == 2  # the record, and the oversized rest
    assert consumed[0] < 3 * size, f"{consumed[0] / size:.0f} x the file's size read"


# ---- one Parquet cell Python cannot hold ends the run --------------------------------------


@pytest.mark.parametrize("engine", ["local", "beam"])
def test_a_timestamp_past_year_9999_in_parquet_is_a_dead_letter(tiny_tokenizer, tmp_path, engine):
    """A Parquet timestamp[s] column, one row of which holds 10**12 s (year ~33,658): Arrow
    holds it, but to_pylist (sources._row_group) raises OverflowError ("date value out of
    range"), which is neither OSError, ValueError nor ArrowException: the run fails ("the job
    failed: OverflowError", both engines), losing the 99 good rows and the good file beside,
    instead of one dead letter (or, at worst, a damaged_file letter for its row group)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 100
    stamps = [1_764_000_000 + i for i in range(rows)]
    stamps[50] = 10**12
    path = tmp_path / "stamps.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array(stamps, pa.timestamp("s")),
                "prompt": pa.array(["hello world"] * rows),
                "output_length": pa.array([1] * rows),
            }
        ),
        path,
    )
    good = write_jsonl(
        tmp_path / "good.jsonl",
        [
            {"timestamp": 1_764_000_000_000 + i, "prompt": "hello world", "output_length": 1}
            for i in range(4)
        ],
    )
    out = tmp_path / "out"
    code = anonymize(
        tiny_tokenizer,
        [good, path],
        out,
        "--block-size",
        "4",
        "--max-rejected-fraction",
        "1",
        "--engine",
        engine,
    )
    assert code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["records"]["exported"] >= 4


@pytest.mark.parametrize("command", [["analyze"], ["validate"], ["simulate", "--capacity", "100"]])
def test_a_trace_timestamp_past_year_9999_is_a_malformed_row(tmp_path, capsys, command):
    """The same cell in a trace Parquet file (timestamp[s] = 10**12): analyze, validate and
    simulate end with "the job failed: OverflowError: date value out of range" instead of
    counting a malformed row (docs/BOUNDS.md: a bad trace row is a malformed line for analyze,
    a failed check for validate)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kvtrace.cli import main

    path = tmp_path / "trace.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array([10**12] * 5, pa.timestamp("s")),
                "input_length": pa.array([8] * 5),
                "output_length": pa.array([2] * 5),
                "hash_ids": pa.array([[0, i] for i in range(5)]),
            }
        ),
        path,
    )
    main([*command, str(path)])
    said = capsys.readouterr()
    assert "job failed" not in said.err and "OverflowError" not in said.err, said.err[-300:]
