"""Run a command as a whole process and measure it: wall seconds and peak memory."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

# Runs a command and prints the peak resident set of it and its descendants, in KiB.
_PEAK_RSS = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
    "stdout=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def run_measured(command: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB of the command and its children)."""
    seconds, peak, _ = run_measured_with_log(command)
    return seconds, peak


def run_measured_with_log(command: list[str]) -> tuple[float, float, str]:
    """run_measured, and what the command wrote to stderr."""
    start = time.perf_counter()
    measured = subprocess.run([sys.executable, "-c", _PEAK_RSS, *command], check=True,
                              capture_output=True, text=True)
    return time.perf_counter() - start, int(measured.stdout.split()[-1]) / 1024, measured.stderr


def tool_python(name: str, requirement: str) -> str:
    """A python with a compared tool installed in a venv of its own (each pins its own
    dependencies), where .ci/run's tool_env puts it: $TMPDIR/kvtrace-NAME-venv."""
    venv = Path(os.environ.get("TMPDIR", "/tmp")) / f"kvtrace-{name}-venv"
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", requirement], check=True)
    return str(venv / "bin" / "python")


def corpus_parser(doc: str | None) -> argparse.ArgumentParser:
    """The arguments every anonymize benchmark takes: a corpus, a tokenizer, a block size."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--block-size", type=int, default=512)
    return parser
