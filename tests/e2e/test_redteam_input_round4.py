"""Red-team round 4: hostile input to `kvtrace anonymize` and the reading commands, past the
round-1..3 fixes (test_redteam_input*.py). Each test asserts a promise the tool makes and fails
today (2026-11-27)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT, chat, peak_rss_mb, under_rlimit, write_jsonl

pytestmark = [pytest.mark.slow]
ROUND4 = "red team round 4"


def _template_folder(tiny_tokenizer, tmp_path, template: str):
    folder = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, folder)
    (folder / "chat_template.jinja").write_text(template + "{{ messages[0].content }}")
    return folder


def _anonymize_child(folder, src, out, address_space: int | None = None, *extra: str):
    """anonymize in a child (its address space capped when asked): (exit code, stderr)."""

    command = [
        sys.executable,
        "-m",
        "kvtrace.cli",
        "anonymize",
        "--input",
        str(src),
        "--output",
        str(out),
        "--tokenizer",
        str(folder),
        "--block-size",
        "4",
        *([] if "beam" in extra else ["--processes", "1"]),
        *extra,
    ]
    if address_space:
        command = under_rlimit(command, "RLIMIT_AS", address_space)
    proc = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    return proc.returncode, proc.stderr.decode(errors="replace")


def _letters(out) -> list[dict]:
    folder = out.parent / f"{out.name}-rejected"
    return [
        json.loads(line)
        for f in sorted(folder.glob("rejected-*.jsonl"))
        for line in f.read_text().splitlines()
        if line
    ]


BOOM = {"timestamp": 5, "messages": [{"role": "user", "content": "boom"}], "output_length": 1}


# ---- bytes are not sized: `"x".encode() * n` builds any size in one C call -------------------


def test_a_template_cannot_build_bytes_past_the_value_bound(tiny_tokenizer, tmp_path):
    """bounded_sandbox.py promises no value a template builds exceeds MAX_VALUE_LENGTH (256 Mi)
    and every `*` is sized from its operands first. But its sizes know only str, list and tuple
    (_sized, _checked, _SIZED): `str.encode` is a safe method, and `bytes * n` is sized as 0
    (_check_binop's `*` branch: `_sized(bytes) * count`), so `"x".encode() * 400_000_000`
    builds 400 MB in one memset and the record is exported (measured: 479 MB peak, rc 0).
    With n = 4e9 it is 4 GB in one C call, past the 1 GiB render budget, which only looks
    between steps. The same holds for `bytes % (...)` widths, bytes.replace/center/join, and
    `{{ b }}` (repr of bytes, up to 4x)."""
    folder = _template_folder(
        tiny_tokenizer,
        tmp_path,
        '{% if messages[0].content == "boom" %}{% set b = "x".encode() * 400000000 %}'
        "{{ b|length }}{% endif %}",
    )
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), chat(1, 1), chat(2, 2), BOOM])
    out = tmp_path / "out"
    code, said = _anonymize_child(folder, src, out)
    assert code == 0, said[-2000:]
    assert [letter["error"] for letter in _letters(out)] == ["template_error"]


# ---- repr of what the walk does not know: dict views printed whole before they are sized -----


def test_a_dict_view_is_sized_before_it_is_printed(tiny_tokenizer, tmp_path):
    """_text_length (bounded_sandbox.py) walks lists, tuples, dicts and namespaces, and sizes
    anything else as `len(repr(value))`: it builds the text to measure it. `d.values()` is a
    safe dict method returning a dict_values view; a dict literal naming one list 10 times,
    that list naming one 1 MB string 200 times (each step sized and within bounds: 200 M),
    prints as 2 GB. `{{ d.values() }}`, `|string`, `~` and `"%s" %` all size it by building
    it: one C call, past the 1 GiB render budget and MAX_VALUE_LENGTH. Run here under a 1.8 GB
    address-space cap so the machine survives: the record's dead letter says `MemoryError`
    (which depends on the machine's memory, where the docs promise a template_error that
    depends only on the template and the record) instead of a refusal from its size (or, on a
    loaded machine, an overrun of the render budget: the C call's time is the machine's)."""
    folder = _template_folder(
        tiny_tokenizer,
        tmp_path,
        '{% if messages[0].content == "boom" %}{% set s = "x" * 1000000 %}'
        '{% set L = [s] * 200 %}{% set d = {"a": L, "b": L, "c": L, "d": L, "e": L, "f": L, '
        '"g": L, "h": L, "i": L, "j": L} %}{% set t = d.values()|string %}{% endif %}',
    )
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), chat(1, 1), chat(2, 2), BOOM])
    out = tmp_path / "out"
    code, said = _anonymize_child(folder, src, out, 1_800_000_000)
    assert code == 0, said[-2000:]
    (letter,) = _letters(out)
    assert letter["error"] == "template_error"
    assert letter["message"].startswith("ValueTooLarge"), letter["message"]


# ---- dead letters: the merge holds one line of every run, and a large letter is a run --------


@pytest.mark.parametrize("engine", ["local", "beam"])
def test_merging_dead_letters_holds_one_line_not_one_per_run(tiny_tokenizer, tmp_path, engine):
    """dead_letters.py promises letters in bounded memory: SortedRuns holds at most
    SORT_RUN_BYTES (16 MiB) before it spills a run, and merge_runs holds "one line of each run
    at a time" (MERGE_FAN_IN 64 runs open). But a letter keeps its whole line, escaped: a line
    of control characters is 6x its bytes as JSON (`\\u0001`), invalid UTF-8 5x (`\\\\xff`), so
    one letter of a line at --max-record-bytes is ~6x the bound, over SORT_RUN_BYTES alone:
    each is a run of its own, and heapq.merge holds the head line of every run at once. 24
    lines of 3 MiB (a 74 KB .gz) peak at 549 MB (local; Beam 746 MB) where 1 such line peaks
    at 137 MB: ~18 MB per letter, growing with the count of bad lines up to 64 x 6 x the bound
    (~6 GiB at the default 16 MiB bound), none of it in docs/BOUNDS.md (nor the letters' disk:
    453 MB of letters from 75 MB of input)."""
    import gzip

    src = tmp_path / "in.jsonl.gz"
    with gzip.open(src, "wb", compresslevel=9) as handle:
        for i in range(24):
            handle.write(b"\x01" * (3 << 20) + bytes([65 + i]) + b"\n")
        for i in range(3):
            handle.write(json.dumps(chat(i, i)).encode() + b"\n")
    code, peak, said = peak_rss_mb(
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
            tiny_tokenizer,
            "--block-size",
            "4",
            "--max-rejected-fraction",
            "1",
            "--max-record-bytes",
            "4000000",
            "--engine",
            engine,
            *(["--processes", "1"] if engine == "local" else []),
        ],
        ROOT,
    )
    assert code == 0, said[-2000:]
    # The embedded Beam runner holds the records between the Batch join's two stages (its
    # Flatten after the GroupByKey: docs/BOUNDS.md), 72 MiB of lines here, ~560 MB in all.
    bound = 300 if engine == "local" else 650
    assert peak < bound, f"{peak} MB peak for 24 rejected lines of 3 MiB"


# ---- a native abort is silent: native_stderr routes Rust's last words to INFO logs ----------


def _capped(args: list[str], address_space: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        under_rlimit([sys.executable, "-m", "kvtrace.cli", *args], "RLIMIT_AS", address_space),
        cwd=ROOT,
        capture_output=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


# In workers (--processes 2) the parent names the signal and the native last words. The
# default --processes keeps this 7.9 MB input in the one process (one read split), whose own
# death by SIGABRT nothing in it can outlive: that needs the engine to encode in a worker.
@pytest.mark.parametrize("processes", [["--processes", "2"], []], ids=["workers", "default"])
def test_a_record_the_tokenizer_cannot_allocate_for_is_not_a_silent_abort(
    tiny_tokenizer, tmp_path, processes
):
    """An 8 MB prompt record (half the 16 MiB default --max-record-bytes) run under a 1.2 GB
    address-space limit (ulimit -v, as batch schedulers set): the Rust tokenizer's allocation
    fails, it prints "memory allocation of 80 bytes failed" on descriptor 2 and aborts. But
    native_stderr.capture_native_stderr has made descriptor 2 a pipe whose lines are logged at
    INFO, shown only with --verbose: the run dies by SIGABRT (exit -6, default --processes
    too) having said nothing but its start line. Promise: bad input gets a one-line error or a
    dead letter, never a silent death; the native words that explain it are swallowed."""
    words = "the quick brown fox jumps over lazy dog again hello world".split()
    text = " ".join(words[i % len(words)] for i in range(1_500_000))
    src = write_jsonl(
        tmp_path / "in.jsonl", [{"timestamp": 0, "prompt": text, "output_length": 1}, chat(1, 1)]
    )
    done = _capped(
        [
            "anonymize",
            "--input",
            str(src),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
            *processes,
        ],
        1_200_000_000,
    )
    said = done.stderr.decode(errors="replace")
    assert done.returncode >= 0 and "memory" in said.lower(), (done.returncode, said[-2000:])
    assert said.splitlines()[-1].startswith(
        "error: a worker process died by SIGABRT; its "
        "native code's last words: memory allocation of"
    )
    assert done.returncode == 1 and not (tmp_path / "out").exists()


# ---- render: a 73 KB trace row asks for 6 M tokens of text, and tokenizes it again ----------


def test_render_bounds_what_one_small_trace_row_may_cost(tiny_tokenizer, tmp_path):
    """BOUNDS.md bounds a trace line (16 MiB) as read; render then builds input_length tokens
    of text for it and (verify, the default) tokenizes it again, unbounded: one row of 12,000
    block ids and input_length 512 x 12,000 (73 KB of JSON) is 6 M tokens. With a 2 GB
    address-space cap render dies by SIGABRT (the Rust tokenizer's allocation fails; nothing
    printed, see above); uncapped a 4,000-id row (23 KB) already peaks at 913 MB, and a row at
    the 16 MiB line bound (~2 M ids, 1 G tokens) would need hundreds of GB. Promise: every
    resource bounded before it is spent; over a bound, a one-line error (or a skipped row)."""
    n = 12_000
    src = write_jsonl(
        tmp_path / "trace.jsonl",
        [{"timestamp": 0, "input_length": 512 * n, "output_length": 1, "hash_ids": list(range(n))}],
    )
    done = _capped(
        ["render", str(src), "--tokenizer", tiny_tokenizer, "-o", str(tmp_path / "requests.jsonl")],
        2_000_000_000,
    )
    said = done.stderr.decode(errors="replace")
    assert done.returncode >= 0, (done.returncode, said[-2000:])
    assert done.returncode == 0 or len(said.strip().splitlines()) >= 1, said[-2000:]


# ---- Parquet: a FIXED_LEN_BYTE_ARRAY column is sized as one byte a row --------------------


def test_a_fixed_size_binary_dictionary_column_is_sized_before_it_is_decoded(
    tiny_tokenizer, tmp_path
):
    """BOUNDS.md: Parquet rows are sized from their Arrow form before they become Python values
    and converted "a few at a time, at most the bound together"; a chunk's dictionary entries
    are counted per row that references them. arrow_sizes._value_bytes knows string, binary,
    their large forms, lists, structs and dictionaries; a fixed_size_binary value falls to the
    last line, "a number": 1 byte. And paths.group_reader counts dictionary chunks only of
    physical type BYTE_ARRAY, so a dictionary-encoded FIXED_LEN_BYTE_ARRAY chunk is read dense
    with dense_row_bytes 0: 64 rows a batch, each a copy of the entry, all "1 byte". A 1.8 KB
    file of 128 good prompt rows plus an unused column holding one 3.9 MB entry (bound 4 MiB)
    peaks at 875 MB (the same entry as a string column: 158 MB), and every row is exported.
    At the default 16 MiB bound (a dictionary page up to 2 x the bound) that is 64 x 32 MiB
    twice over (Arrow's copies, then Python's bytes): ~4 GiB from a 2 KB file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, size = 128, 3_900_000
    table = pa.table(
        {
            "timestamp": pa.array(range(rows), pa.int64()),
            "prompt": pa.array(["hello world"] * rows),
            "output_length": pa.array([1] * rows, pa.int64()),
            "junk": pa.array([b"x" * size] * rows, type=pa.binary(size)),
        }
    )
    src = tmp_path / "in.parquet"
    pq.write_table(
        table, src, use_dictionary=True, dictionary_pagesize_limit=64 << 20, compression="zstd"
    )
    assert src.stat().st_size < 4096
    code, peak, said = peak_rss_mb(
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
    assert code == 0, said[-2000:]
    # BOUNDS.md: ~9 x the bound for Parquet, plus reader buffers, over a ~150 MB process
    assert peak < 350, f"{peak} MB peak reading a {src.stat().st_size}-byte Parquet file"


def test_a_parquet_log_written_with_string_view_columns_reads(tiny_tokenizer, tmp_path):
    """pyarrow (>= 16) keeps a column's Arrow type in the file (ARROW:schema), string_view
    among them (what Arrow's newer writers and engines produce). group_reader reads a
    dictionary-encoded string chunk as dictionary<string>, and sources._python_rows casts each
    batch to the file's schema before to_pylist: dictionary -> utf8_view is not implemented,
    so every row is a `malformed_record` dead letter, "row 0 has a value Python cannot hold:
    ArrowNotImplementedError ... cast_string_view": a 4-row log of valid prompts exports
    nothing ("too much input rejected"), and an unused string_view column alone condemns
    every row of a good file the same way. The reason is wrong (the values are plain text),
    and the records are lost."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 4
    src = tmp_path / "in.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array(range(rows), pa.int64()),
                "prompt": pa.array(["hello world"] * rows, pa.string_view()),
                "output_length": pa.array([1] * rows, pa.int64()),
            }
        ),
        src,
    )
    out = tmp_path / "out"
    code, said = _anonymize_child(tiny_tokenizer, src, out)
    assert code == 0, said[-2000:]
    assert json.loads((out / "manifest.json").read_text())["records"]["exported"] == rows


# ---- trace Parquet: the dictionary bomb anonymize's reader was fixed for ------------------


@pytest.mark.parametrize("command", ["analyze", "validate"])
def test_a_trace_parquet_dictionary_bomb_is_bounded(tmp_path, command):
    """BOUNDS.md: trace Parquet is read with "footer and pages as above at 16 MiB". But
    paths.read_parquet_within checks pages (oversized_pages) and then calls parquet.read():
    every column, dictionaries decoded dense, no per-row sizing (the dictionary-bomb fix,
    group_reader and arrow_sizes, is anonymize's reader only). A 2.8 KB trace of 300 rows
    whose session_id is one 4 MB dictionary entry decodes to 1.2 GB of Arrow and then 300
    Python strings: analyze and validate peak at ~1.15 GB (each page is small; the dictionary
    page is 4 MB, under the 16 MiB bound; 3.4-3.9 GB measured in a test run). Here 80 rows:
    ~1 GB. 1,000 rows of a 16 MiB entry would be 16 GB."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 80
    src = tmp_path / "trace.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array(range(rows), pa.int64()),
                "input_length": pa.array([4] * rows, pa.int64()),
                "output_length": pa.array([1] * rows, pa.int64()),
                "hash_ids": pa.array([[0]] * rows, pa.list_(pa.int64())),
                "session_id": pa.array(["x" * 4_000_000] * rows),
            }
        ),
        src,
        use_dictionary=True,
        dictionary_pagesize_limit=64 << 20,
        compression="zstd",
    )
    assert src.stat().st_size < 4096
    code, peak, said = peak_rss_mb([sys.executable, "-m", "kvtrace.cli", command, str(src)], ROOT)
    assert peak < 400, f"{command}: {peak} MB peak reading a {src.stat().st_size}-byte trace"


# ---- decompression: a valid .xz with stream padding loses its later streams ----------------


@pytest.mark.parametrize("engine", ["local", "beam"])
def test_an_xz_file_with_stream_padding_reads_whole(tiny_tokenizer, tmp_path, engine):
    """The .xz format allows Stream Padding (null bytes, a multiple of 4) between and after
    concatenated streams; `xz -dc` reads this file's 10 records. decompress.py starts a new
    LZMADecompressor after each stream (concatenated members are read) and hands it the
    padding: LZMAError, a `damaged_file` letter "corrupt compressed data" with lost_bytes 0,
    and the second stream's 5 records are never read ("exported 5 of 6"): records lost from a
    well-formed file, on both engines, and --max-rejected-fraction weighs none of them."""
    import lzma

    good = b"".join(json.dumps(chat(i, i)).encode() + b"\n" for i in range(5))
    src = tmp_path / "in.jsonl.xz"
    src.write_bytes(lzma.compress(good) + b"\x00" * 4 + lzma.compress(good))
    if shutil.which("xz"):
        assert (
            subprocess.run(["xz", "-dc", str(src)], capture_output=True, check=True).stdout.count(
                b"\n"
            )
            == 10
        )
    out = tmp_path / "out"
    code, said = _anonymize_child(tiny_tokenizer, src, out, None, "--engine", engine)
    assert code == 0, said[-2000:]
    assert json.loads((out / "manifest.json").read_text())["records"]["exported"] == 10
    assert _letters(out) == []


# ---- integers past MAX_INT_BITS through filters: |int(base=16), then |round(-n) -------------


def test_filters_cannot_build_and_divide_integers_past_the_bit_bound(tiny_tokenizer, tmp_path):
    """bounded_sandbox.py bounds integers at MAX_INT_BITS (4096) in call_binop only. jinja's
    `int` filter takes a base: `("f" * 4000000)|int(base=16)` parses a 16 M-bit integer in
    linear time (a power-of-two base is not under Python's int_max_str_digits), its result
    unmeasured (_checked sizes str and lists). jinja's `round` filter is Python's round(),
    and a negative precision (|precision| <= MAX_ARGUMENT passes _check_integers) makes
    CPython's long_round compute 10**1000000 and divide the 16 M-bit integer by it: one
    schoolbook long division in one C call holding the GIL, ~80 s here (88.9 s wall for a
    4-record run), where the render budget is 5 s and the watchdog stops only between steps.
    A 64 M-bit integer (a 16 M-character string, still within every bound) takes hours."""
    import signal
    import time

    folder = _template_folder(
        tiny_tokenizer,
        tmp_path,
        '{% if messages[0].content == "boom" %}{% set x = ("f" * 4000000)|int(base=16) %}'
        "{% set y = x|round(-1000000) %}{% endif %}",
    )
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), chat(1, 1), chat(2, 2), BOOM])
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
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    started = time.monotonic()
    try:
        proc.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # start-up plus one 5 s budget, with room for a loaded machine
    assert time.monotonic() - started < 35, "one render ran far past its 5 s budget"


# ---- convert writes what kvtrace's own trace readers refuse --------------------------------


def test_a_converted_folder_reads_back(tmp_path):
    """bailian._parsed accepts timestamps in [0, 1e12) seconds and writes round(ts * 1000) ms,
    up to 1e15; the trace readers (trace_io.MAX_READ_TIMESTAMP_MS) refuse any over 2^42 ms
    (4.4e12, i.e. 4.4e9 s). A Bailian row at 4.5e9 s converts without a word ("converted 2
    rows"), into a folder whose manifest says 2 rows; `kvtrace analyze` of that folder then
    fails with "is not a whole kvtrace output: its shards hold 1 rows, its manifest says 2
    (copied partly?)", blaming a copy for kvtrace's own write (validate: NOT VALID). Promise:
    bad input is refused in one line (or counted), and what kvtrace writes it reads."""
    src = write_jsonl(
        tmp_path / "bailian.jsonl",
        [
            {
                "chat_id": 1,
                "parent_chat_id": -1,
                "timestamp": 1.0,
                "input_length": 16,
                "output_length": 1,
                "hash_ids": [1],
                "type": "text",
                "turn": 1,
            },
            {
                "chat_id": 2,
                "parent_chat_id": -1,
                "timestamp": 4.5e9,
                "input_length": 16,
                "output_length": 1,
                "hash_ids": [2],
                "type": "text",
                "turn": 1,
            },
        ],
    )
    folder = tmp_path / "converted"
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "kvtrace.cli", *args],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    converted = run("convert", str(src), "-o", str(folder))
    if converted.returncode != 0:  # refused in one line: the promise kept
        assert len(converted.stderr.decode().strip().splitlines()) == 1
        return
    analyzed = run("analyze", str(folder))
    assert analyzed.returncode == 0, analyzed.stderr.decode()[-2000:]


def test_synthesize_output_called_valid_is_valid(tmp_path):
    """synthesize promises "every output row valid" and prints "output: ... (valid)". Its
    scalings are bounded as options ([1e-6, 1e6]) but their results are not checked against
    the readers' bounds: a trace at the readers' own limits (a row at 2^42 ms, a row of
    output_length 2^31 - 1), synthesized with --speedup-ratio 0.5 --osl-multiplier 3, becomes
    timestamp 8796093022208 and output_length 6442450941, "(valid)", and `kvtrace validate`
    of it says NOT VALID, "no rows could be read" (analyze, simulate and export skip or refuse
    them the same way)."""
    src = write_jsonl(
        tmp_path / "trace.jsonl",
        [
            {"timestamp": 0, "input_length": 8, "output_length": 2**31 - 1, "hash_ids": [0, 1]},
            {"timestamp": 2**42, "input_length": 8, "output_length": 1, "hash_ids": [0, 2]},
        ],
    )
    out = tmp_path / "synth.jsonl"
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "kvtrace.cli", *args],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    made = run(
        "synthesize",
        str(src),
        "-o",
        str(out),
        "--block-size",
        "4",
        "--speedup-ratio",
        "0.5",
        "--osl-multiplier",
        "3",
    )
    if made.returncode != 0:  # refused in one line: the promise kept
        assert len(made.stderr.decode().strip().splitlines()) == 1
        return
    checked = run("validate", str(out), "--block-size", "4")
    assert b"NOT VALID" not in checked.stdout + checked.stderr, checked.stdout.decode()


# ---- `+` on two strings is measured after it is built --------------------------------------


def test_adding_two_strings_is_sized_before_it_runs(tiny_tokenizer, tmp_path):
    """BOUNDS.md: "each step is sized from its operands before it runs: repetition, `+`, ...".
    BoundedSandbox.add calls _check_binop("+", ...), which has branches for two integers and
    two lists only: `str + str` is built first and refused after (`type(result) in _SIZED`),
    so `s + s` with s at the 256 Mi bound allocates 512 MB in one C call before the refusal
    (the same message a check before it would give). Measured by peak RSS: ~256 MB for s,
    then 512 MB more for the sum that a check from len(left) + len(right) would never build."""

    folder = _template_folder(
        tiny_tokenizer,
        tmp_path,
        '{% if messages[0].content == "boom" %}{% set s = "x" * 268435456 %}'
        "{% set t = s + s %}{% endif %}",
    )
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), chat(1, 1), chat(2, 2), BOOM])
    code, peak, said = peak_rss_mb(
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
        ROOT,
    )
    assert code == 0, said[-2000:]
    assert peak < 600, f"{peak} MB peak: the sum was built before it was sized"
