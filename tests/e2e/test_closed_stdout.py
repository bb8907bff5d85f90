"""A reader of stdout that leaves early (`kvtrace ... | head`) ends the command quietly: exit
141 (128 + SIGPIPE, as a Unix tool ends), no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from helpers import ROOT, chat, write_jsonl


def test_a_reader_that_left_gets_no_traceback():
    read, write = os.pipe()
    os.close(read)  # the reader has left before the first line
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kvtrace.cli", "simulate", "--list-models"],
            cwd=ROOT,
            stdout=write,
            stderr=subprocess.PIPE,
            timeout=120,
        )
    finally:
        os.close(write)
    assert proc.returncode == 128 + signal.SIGPIPE
    assert proc.stderr == b""


def test_a_run_whose_summary_finds_the_reader_gone_ends_quietly_published(tiny_tokenizer, tmp_path):
    """The summary is printed after the publication: a reader that left gets exit 141, not an
    error line, and the trace stands."""
    log = write_jsonl(tmp_path / "log.jsonl", [chat(i, 1000 * i) for i in range(3)])
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kvtrace.cli", "anonymize", "--input", str(log)]
            + ["--output", str(tmp_path / "out"), "--tokenizer", tiny_tokenizer, "--quiet"],
            cwd=ROOT,
            stdout=write,
            stderr=subprocess.PIPE,
            timeout=300,
        )
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (128 + signal.SIGPIPE, b"")
    assert (tmp_path / "out" / "manifest.json").exists()
