"""Bounded resources for any input: bombs and oversized records in every format and compression
are read by the real reader, in a child process whose peak memory and time are measured, and
each comes out as a dead letter (the records around it intact), never an abort or a hang.

The whole CLI runs; the unit tests are in tests/transforms/read/test_bounds.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from backports import zstd

from helpers import ROOT

MiB = 1 << 20


def _fifo(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


def test_audit_answers_on_a_fifo_named_like_a_shard(tmp_path):
    path = _fifo(tmp_path, "trace-00000-of-00001.jsonl")
    done = subprocess.run(
        [sys.executable, "-m", "kvtrace.cli", "audit", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "not a regular file" in done.stdout + done.stderr and "Traceback" not in done.stderr


def test_convert_refuses_an_overlong_line_in_one_line(tmp_path, capsys):
    from kvtrace.cli import main

    path = tmp_path / "bailian.jsonl.zst"
    path.write_bytes(zstd.compress(b"{}\n" + b"7" * (17 * MiB) + b"\n"))
    assert main(["convert", str(path), "-o", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "line 2 is over" in error
