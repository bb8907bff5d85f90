"""Run a command as a whole process and measure it: wall seconds and peak memory."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs a command; prints the CPU seconds (user + system) and the peak resident set (KiB) of it
# and its descendants.
_USAGE = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
    "stdout=subprocess.DEVNULL); usage = resource.getrusage(resource.RUSAGE_CHILDREN); "
    "print(usage.ru_utime + usage.ru_stime, usage.ru_maxrss)"
)


def run_measured(command: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB of the command and its children)."""
    seconds, _, peak, _ = _measure(command)
    return seconds, peak


def run_measured_with_log(command: list[str]) -> tuple[float, float, str]:
    """run_measured, and what the command wrote to stderr."""
    seconds, _, peak, log = _measure(command)
    return seconds, peak, log


def run_measured_cpu(
    command: list[str], cwd: Path, env: dict[str, str]
) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS in MiB) of the command run in cwd with env."""
    seconds, cpu, peak, _ = _measure(command, cwd, env)
    return seconds, cpu, peak


def _measure(
    command: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> tuple[float, float, float, str]:
    start = time.perf_counter()
    measured = subprocess.run(
        [sys.executable, "-c", _USAGE, *command],
        check=True,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    cpu, peak_kib = measured.stdout.split()[-2:]
    return time.perf_counter() - start, float(cpu), int(peak_kib) / 1024, measured.stderr


@contextlib.contextmanager
def baseline_tree(revision: str, parent: Path) -> Iterator[Path]:
    """The repository at revision, checked out as a worktree in parent for the duration."""
    tree = parent / "baseline"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), revision],
        check=True,
        capture_output=True,
    )
    try:
        yield tree
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
            capture_output=True,
        )


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
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--block-size", type=int, default=512)
    return parser
