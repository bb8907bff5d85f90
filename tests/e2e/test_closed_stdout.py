"""A reader of stdout that leaves early (`kvtrace ... | head`) ends the command quietly: exit
141 (128 + SIGPIPE, as a Unix tool ends), no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from helpers import ROOT


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
