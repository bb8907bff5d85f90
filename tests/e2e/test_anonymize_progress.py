"""What `kvtrace anonymize` tells the person running it: progress on stderr in the input's
units (bytes as stored, so a compressed input reaches 100%), a bar on a terminal, nothing with
--quiet, stdout left to the summary, whose figures are the run's own."""

from __future__ import annotations

import fcntl
import gzip
import json
import logging
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections import Counter
from pathlib import Path

import pytest
from tqdm import tqdm

from helpers import ROOT, anonymize, chat, read_jsonl
from kvtrace.pipelines.progress import count_text

PTY_WAIT_S = 120  # the whole run in a terminal, imports included, on a loaded machine


def _gzipped(path: Path, records: list) -> Path:
    with gzip.open(path, "wb") as handle:
        for record in records:
            handle.write(record if isinstance(record, bytes) else json.dumps(record).encode())
            handle.write(b"\n")
    return path


def _inputs(tmp_path: Path) -> list[Path]:
    """A compressed file and a plain one, with three records that are no requests."""
    good = [chat(i, 10 * i, session=f"user-{i % 3}") for i in range(40)]
    return [
        _gzipped(tmp_path / "a.jsonl.gz", good[:25] + [b"not json", b"[1]"]),
        _gzipped(tmp_path / "b.jsonl.gz", good[25:] + [b"{}"]),
    ]


def _progress_lines(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "kvtrace" and r.getMessage().startswith("read:")
    ]


def test_the_summary_is_the_runs_own_figures(tiny_tokenizer, tmp_path, capsys):
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, _inputs(tmp_path), out, "--block-size", "4") == 0
    printed = capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    stats = json.loads((out / "stats.json").read_text())
    (letters,) = (tmp_path / "out-rejected").glob("rejected-*.jsonl")
    figures = re.search(
        r"exported ([\d,]+) of ([\d,]+) records in [\d.]+ s\n"
        r"  records   ([\d,]+) read = ([\d,]+) exported \+ ([\d,]+) rejected\n"
        r"  rejected  ([a-z_]+ [\d,]+(?:, [a-z_]+ [\d,]+)*): (\S+) .*\n"
        r"(?:  lost      [\d,]+ input bytes became no record, .*\n)?"  # lines that were no object
        r"  tokens    ([\d,]+) input in ([\d,]+) blocks, ([\d,]+) of them unique\n"
        r"  hit rate  ([\d.]+)% of input tokens",
        printed,
    )
    assert figures, printed
    exported, read, read_again, exported_again, rejected, reasons, where, *rest = figures.groups()
    tokens, blocks, unique, rate = rest
    number = lambda text: int(text.replace(",", ""))  # noqa: E731
    assert number(exported) == number(exported_again) == manifest["records"]["exported"] == 40
    assert number(read) == number(read_again) == number(exported) + number(rejected) == 43
    assert number(rejected) == len(read_jsonl(letters)) and where == str(letters)
    by_reason = Counter(letter["error"] for letter in read_jsonl(letters))
    assert reasons == ", ".join(
        f"{r} {n}" for r, n in sorted(by_reason.items(), key=lambda i: (-i[1], i[0]))
    )
    assert (number(tokens), number(blocks), number(unique)) == (
        stats["input_tokens"],
        stats["blocks"],
        stats["unique_blocks"],
    )
    assert rate == f"{stats['hit_rates']['token_weighted'] * 100:.1f}"
    assert "read:" not in printed  # progress never reaches stdout


def test_lines_count_compressed_bytes_to_their_total_and_every_record(
    tiny_tokenizer, tmp_path, caplog, capsys
):
    inputs = _inputs(tmp_path)
    stored = sum(os.path.getsize(path) for path in inputs)
    assert anonymize(tiny_tokenizer, inputs, tmp_path / "out", "--block-size", "4") == 0
    lines = _progress_lines(caplog)
    assert len(lines) >= 2, "a line as the work starts, one as it ends"
    total = f"{tqdm.format_sizeof(stored, divisor=1000)}B"
    assert lines[0].startswith("read:   0% 0.00B of " + total)
    assert lines[-1].startswith(f"read: 100% {total} of {total}")
    assert lines[-1].endswith(f", 43 records, {count_text(_tokens(tmp_path / 'out'))} tokens]")
    assert "read:" not in capsys.readouterr().out


def _tokens(out: Path) -> int:
    return json.loads((out / "stats.json").read_text())["input_tokens"]


def test_quiet_shows_no_progress(tiny_tokenizer, tmp_path, caplog, capsys):
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, _inputs(tmp_path), out, "--block-size", "4", "--quiet") == 0
    assert not [r for r in caplog.records if r.name == "kvtrace" and r.levelno < logging.WARNING]
    assert capsys.readouterr().out.startswith("exported 40 of 43 records")


@pytest.mark.parametrize("columns", [100, 0])
def test_a_terminal_gets_a_bar_and_stdout_only_the_summary(tiny_tokenizer, tmp_path, columns):
    """stderr on a pseudo-terminal, sized as a person's shell sizes it or unsized (`script`,
    `docker exec -t`: tqdm alone would draw nothing there), stdout on a pipe."""
    args = ["anonymize", "--output", str(tmp_path / "out"), "--tokenizer", tiny_tokenizer]
    for path in _inputs(tmp_path):
        args += ["--input", str(path)]
    terminal, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24 if columns else 0, columns, 0, 0))
    run = subprocess.Popen(
        [sys.executable, "-m", "kvtrace.cli", *args, "--block-size", "4"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=side,
        stdin=subprocess.DEVNULL,
    )
    os.close(side)
    drawn = _read_until_closed(terminal, time.monotonic() + PTY_WAIT_S)
    stdout, _ = run.communicate(timeout=PTY_WAIT_S)
    assert run.returncode == 0, drawn[-500:]
    bar = drawn.decode(errors="replace")
    assert "\r" in bar and re.search(r"read: 100%\|[^\r\n]*\| \S+B of \S+B \[", bar), bar[-500:]
    assert stdout.decode().startswith("exported 40 of 43 records") and b"read:" not in stdout


def _read_until_closed(terminal: int, deadline: float) -> bytes:
    """All a pseudo-terminal shows until its writer ends (or the deadline passes)."""
    drawn = b""
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([terminal], [], [], deadline - time.monotonic())
            if not ready:
                break
            chunk = os.read(terminal, 65536)  # EIO once the child has closed it (Linux)
            if not chunk:
                break
            drawn += chunk
    except OSError:
        pass
    finally:
        os.close(terminal)
    return drawn
