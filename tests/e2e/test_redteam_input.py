"""Red-team reproducers: hostile input to `kvtrace anonymize`. Each asserts a promise the tool
makes and failed when written (2026-11-26)."""

from __future__ import annotations

import json
import shutil

import pytest

from helpers import anonymize, chat, peak_rss_mb, trace, write_jsonl

# Slow, so the fast set stays fast. Each hole found here is closed; the tests keep it so.
pytestmark = [pytest.mark.slow]

# ---- a chat template builds a value past the sandbox's bound in one C call ---------------------

# bounded_sandbox.py: "every value a template builds [is] sized before it is built", at most
# MAX_VALUE_LENGTH (256 Mi) items. Each width or count below is under MAX_ARGUMENT (1 Mi), but the
# value is the sum (or product) of them: 300 M characters, built whole in one C call the watchdog
# cannot stop. Scaled to 3000 it is 3 GB in one allocation (measured: 2.2 GB RSS at a 3 GB cap).
OVERSIZED = {
    "str.format widths": "{% set f = '{0:>1000000}' * 300 %}{{ f.format('')|length }}",
    "% format widths": "{% set f = '%(a)1000000s' * 300 %}{{ (f % {'a': ''})|length }}",
    "expandtabs": "{% set t = '\\t' * 300 %}{{ t.expandtabs(1000000)|length }}",
}


@pytest.mark.parametrize("template", OVERSIZED.values(), ids=OVERSIZED.keys())
def test_a_template_cannot_build_a_value_past_the_sandbox_bound(tiny_tokenizer, tmp_path, template):
    folder = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, folder)
    (folder / "chat_template.jinja").write_text(template + "{{ messages[0].content }}")
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), chat(1, 10)])
    anonymize(str(folder), [src], tmp_path / "out", "--block-size", "4")
    # a 300 M-character value was built: no request may be exported through it
    assert not list((tmp_path / "out").glob("trace-*")) or trace(tmp_path / "out") == []


# ---- odd --input words -------------------------------------------------------------------------


def test_an_existing_file_named_with_brackets_is_the_file_read(tiny_tokenizer, tmp_path):
    """`--input 'x[1].jsonl'` names a file that exists; glob reads it as a pattern and reads
    x1.jsonl, another file, instead (silently)."""
    named = write_jsonl(tmp_path / "x[1].jsonl", [chat(0, 0)])
    write_jsonl(tmp_path / "x1.jsonl", [chat(5, 0) | {"output_length": 99}])
    assert anonymize(tiny_tokenizer, [named], tmp_path / "out", "--block-size", "4") == 0
    assert [row["output_length"] for row in trace(tmp_path / "out")] == [0]


def test_one_file_named_twice_is_read_once(tiny_tokenizer, tmp_path):
    """The same file by two spellings (a glob and a path, relative and absolute, `./`) is read
    twice: every request is published twice and the manifest counts double."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), chat(1, 10)])
    again = f"{tmp_path}/./in.jsonl"  # (pathlib would drop the "./")
    assert anonymize(tiny_tokenizer, [src, again], tmp_path / "out", "--block-size", "4") == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["records"]["exported"] == 2
    letters = (tmp_path / "out-rejected").glob("*.jsonl")
    assert not any(p.read_bytes() for p in letters)  # and nothing rejected
    assert len(trace(tmp_path / "out")) == 2


def test_a_file_whose_size_is_not_its_length_is_not_read_as_empty(tiny_tokenizer, tmp_path):
    """/proc files are regular files whose fstat size is 0: the input is read as empty, and an
    empty trace is published with exit 0 and no dead letter (its lines are neither exported
    nor dead-lettered)."""
    out = tmp_path / "out"
    code = anonymize(tiny_tokenizer, ["/proc/self/status"], out, "--block-size", "4")
    manifest = json.loads((out / "manifest.json").read_text()) if code == 0 else None
    letters = list((tmp_path / "out-rejected").glob("*.jsonl"))
    assert code != 0 or manifest["records"]["exported"] + len(letters) > 0


# ---- Ctrl-C while one large record is tokenized --------------------------------------------------


def test_ctrl_c_while_a_large_record_is_tokenized_leaves_nothing(tiny_tokenizer, tmp_path):
    """Ctrl-C lands while the main thread is in the tokenizer's one long call (a 12 MB prompt,
    under the 16 MiB default bound, --processes 1): the KeyboardInterrupt never unwinds, the
    watcher's deadline ends the process with os._exit, and the staging folder and the lock are
    left beside the output (test_stop_signals asserts neither is left)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from helpers import ROOT

    words = "hello world this is a prompt about caching blocks".split()
    prompt = " ".join(words[i % len(words)] for i in range(2_100_000))
    log = write_jsonl(
        tmp_path / "big.jsonl", [{"timestamp": 0, "prompt": prompt, "output_length": 3}]
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvtrace.cli",
            "anonymize",
            "--input",
            str(log),
            "--output",
            str(out),
            "--tokenizer",
            tiny_tokenizer,
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
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".out.kvtrace-staging-*")):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.8)  # reading and parsing done: in the tokenizer
        if proc.poll() is not None:
            pytest.skip("the run ended before the stop")
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130
    assert not out.exists()
    assert not list(tmp_path.glob(".out.kvtrace-*"))


# ---- dead letters are held whole in memory ---------------------------------------------------------


@pytest.mark.parametrize("engine, lines", [("local", 10_000), ("beam", 5_000)])
def test_rejected_lines_cost_bounded_memory(tiny_tokenizer, tmp_path, engine, lines):
    """A 50-100 KB .gz of lines that are not JSON (4 KB of control characters each, 40 MB
    decoded): every dead letter is held in a list and the file written from one joined string,
    each line escaped 6x (\\u0001), so the dead letters cost ~55 KB of memory per line (local:
    ~1.1 GB at 20,000 lines; Beam ~0.9 GB at 5,000) and 24 KB of disk each (116 MB from a 26 KB
    file). Memory grows with the count of bad lines, not with --max-record-bytes: a 1 MB .gz
    holds 200,000 of them (~10 GB)."""
    import gzip
    import sys

    from helpers import ROOT

    src = tmp_path / "in.jsonl.gz"
    with gzip.open(src, "wb", compresslevel=9) as handle:
        for i in range(3):
            handle.write(json.dumps(chat(i, i)).encode() + b"\n")
        handle.write((b'"' + b"\x01" * 4000 + b"\n") * lines)
    code, peak, _ = peak_rss_mb(
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
            "--engine",
            engine,
            *(["--processes", "1"] if engine == "local" else []),
        ],
        ROOT,
    )
    assert code == 0
    assert peak < 400, f"{peak} MB peak for {lines} rejected lines"


# ---- a record the real tokenizer's regex gives up on -------------------------------------------


def test_a_long_run_of_whitespace_is_a_dead_letter_not_a_traceback(qwen3_tokenizer, tmp_path):
    """One chat record of 12 M spaces then a letter (12 MB, under the 16 MiB default bound):
    Qwen3's (and DeepSeek-R1's) pre-tokenizer regex `\\s*[\\r\\n]+` backtracks over the whole
    run, Oniguruma's retry-limit-in-match (10 M) is exceeded, and the Rust side panics:
    pyo3_runtime.PanicException (a BaseException) ends the whole run with a Rust backtrace and
    a Python traceback, exit 1, instead of one dead letter."""
    import subprocess
    import sys

    from helpers import ROOT

    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {
                "timestamp": 0,
                "messages": [{"role": "user", "content": " " * 12_000_000 + "x"}],
                "output_length": 1,
            },
            chat(0, 10),
            chat(1, 20),
            chat(2, 30),
        ],
    )
    done = subprocess.run(
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
            qwen3_tokenizer,
            "--processes",
            "1",
            # The one letter holds nearly all the input's bytes, which refuses the night by
            # default (every letter weighs its bytes): here the letter itself is the subject.
            "--max-rejected-fraction",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in done.stderr and "panicked" not in done.stderr, done.stderr[-800:]
    assert done.returncode == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    letters = list((tmp_path / "out-rejected").glob("*.jsonl"))
    assert manifest["records"]["exported"] == 3 and len(letters[0].read_text().splitlines()) == 1


@pytest.mark.parametrize("engine", ["local", "beam"])
def test_a_tokenizer_regex_that_gives_up_is_one_line(tiny_tokenizer, tmp_path, engine):
    """A tokenizer folder whose pre-tokenizer is a backtracking regex (`(a|a)+b`) and a
    41-character record: Oniguruma's retry limit panics the tokenizer; both engines end with
    a Rust backtrace and Python tracebacks (Beam: two), not a one-line error or dead letter."""
    import subprocess
    import sys

    from helpers import ROOT

    folder = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {
                "type": "Split",
                "pattern": {"Regex": "(a|a)+b"},
                "behavior": "Isolated",
                "invert": False,
            },
            {"type": "WhitespaceSplit"},
        ],
    }
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [{"timestamp": 0, "prompt": "a" * 40 + "c", "output_length": 1}, chat(0, 10)],
    )
    done = subprocess.run(
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
            "--engine",
            engine,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = [
        line
        for line in done.stderr.splitlines()
        if "PyTorch was not found" not in line and " INFO " not in line
    ]
    assert "Traceback" not in done.stderr and len(said) <= 1, "\n".join(said[-5:])


# ---- three long conversations first in a log condemn the template, and the run ------------------


def test_long_conversations_first_in_a_log_are_dead_letters_not_a_failed_run(
    qwen3_tokenizer, tmp_path
):
    """Three chat records of 400,000 one-word messages (13.6 MB each, under the 16 MiB bound)
    first in a log: Qwen3's template takes over the 5 s render budget on each, and the run
    ends with "the chat template went over the render budget ... on each of the first 3
    requests: it does not render" (exit 1). The template renders every other record: the 20
    requests after them are lost with the run, instead of 3 dead letters."""
    messages = [{"role": "user", "content": "a"}] * 400_000
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            *({"timestamp": i, "messages": messages, "output_length": 1} for i in range(3)),
            *(chat(i, 10 + i) for i in range(20)),
        ],
    )
    out = tmp_path / "out"
    # The 3 letters hold nearly all the input's bytes, which refuses the night by default
    # (every letter weighs its bytes): here the letters themselves are the subject.
    fraction = ("--max-rejected-fraction", "1")
    assert anonymize(qwen3_tokenizer, [src], out, "--processes", "1", *fraction) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    letters = list((tmp_path / "out-rejected").glob("*.jsonl"))
    assert manifest["records"]["exported"] == 20 and len(letters[0].read_text().splitlines()) == 3


# ---- a Parquet dictionary bomb -------------------------------------------------------------------


def test_a_parquet_dictionary_bomb_is_read_within_the_documented_bound(tiny_tokenizer, tmp_path):
    """A 1.5 KB Parquet file: one dictionary page holding a 3.9 MB prompt (under the 4 MiB bound,
    and under the page ceiling), referenced by 128 rows. Every page check passes; the rows are
    decoded 64 at a time, each its own 3.9 MB string and JSON: the run peaks at ~1.1 GB and
    fails with "the job failed: MemoryError" under a 2 GB address-space cap (at the 16 MiB
    default, a 2.5 KB file does the same). docs/BOUNDS.md: reading stays under 9 x
    --max-record-bytes for Parquet (36 MiB here)."""
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    from helpers import ROOT

    rows = 128
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array(["not a time"] * rows),  # rejected once read: no tokenizing
                "prompt": pa.array(["hello " * 650_000] * rows).dictionary_encode(),
                "output_length": pa.array([1] * rows),
            }
        ),
        tmp_path / "bomb.parquet",
        compression="zstd",
    )
    assert (tmp_path / "bomb.parquet").stat().st_size < 4096
    capped = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
        "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_module('kvtrace.cli', "
        "run_name='__main__')"
    )
    code, peak, said = peak_rss_mb(
        [
            sys.executable,
            "-c",
            capped,
            "kvtrace",
            "anonymize",
            "--input",
            str(tmp_path / "bomb.parquet"),
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
    assert "MemoryError" not in said, said[-500:]
    assert peak < 9 * 4 + 300, f"{peak} MB peak reading a {rows}-row, 1.5 KB Parquet file"
