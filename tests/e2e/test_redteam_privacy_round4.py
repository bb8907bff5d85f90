"""Red team round 4: what other commands publish beside a trace (analyze --output). Each test
asserts the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import json

import pytest

from helpers import anonymize, chat, write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.slow
ROUND4 = "red team round 4"


def test_analyze_output_publishes_the_operators_paths(tiny_tokenizer, tmp_path):
    """The manifest publishes no path ("no string an operator typed, no path": a local
    tokenizer folder is published as null), but `analyze --output DIR` writes analysis.txt
    opening with "Analyzing: <absolute path of every trace file read>"
    (kvtrace/commands/analyze_text.py), so the folder published beside a trace names the
    operator's directories (here a customer's and a user's name, a date)."""
    private = tmp_path / "home" / "jane.doe" / "acme-corp-logs-2026-11-26"
    private.mkdir(parents=True)
    rows = [chat(i, 1_700_000_000_000 + 997 * i) for i in range(6)]
    night = write_jsonl(tmp_path / "night.jsonl", rows)
    assert anonymize(tiny_tokenizer, [night], private / "out", "--block-size", "4") == 0
    assert main(["analyze", str(private / "out"), "--output", str(tmp_path / "analysis")]) == 0
    for path in (tmp_path / "analysis").iterdir():
        text = path.read_text(errors="replace")
        assert "jane.doe" not in text and "acme-corp" not in text, (
            f"{path.name} names the operator's folders: {text.splitlines()[0][:120]}"
        )


def _private_night(tiny_tokenizer, tmp_path):
    """An anonymized night in a folder whose path names a user and a customer."""
    private = tmp_path / "home" / "jane.doe" / "acme-corp-logs-2026-11-26"
    private.mkdir(parents=True)
    night = write_jsonl(tmp_path / "night.jsonl", [chat(i, 997 * i) for i in range(6)])
    assert anonymize(tiny_tokenizer, [night], private / "out", "--block-size", "4") == 0
    return private


def test_analyze_output_names_a_malformed_lines_file_by_its_name(tiny_tokenizer, tmp_path):
    """A malformed line is reported with where it is: in the published analysis, by the file's
    name (text and JSON alike), never its folders."""
    private = _private_night(tiny_tokenizer, tmp_path)
    trace = private / "trace.jsonl"
    trace.write_bytes((private / "out" / "trace-00000-of-00001.jsonl").read_bytes() + b"{oops\n")
    assert (
        main(["analyze", str(trace), "--block-size", "4", "--output", str(tmp_path / "analysis")])
        == 0
    )
    text = (tmp_path / "analysis" / "analysis.txt").read_text()
    assert "trace.jsonl:7" in text
    for path in (tmp_path / "analysis").iterdir():
        assert "jane.doe" not in path.read_text(), path.name


def test_export_json_names_the_output_by_its_name(tiny_tokenizer, tmp_path):
    """export --json holds the replay command: run beside the exported file, named by its file
    name, not the absolute path the operator gave."""
    private = _private_night(tiny_tokenizer, tmp_path)
    report = tmp_path / "export.json"
    assert (
        main(
            [
                "export",
                str(private / "out"),
                "--to",
                "sglang",
                "-o",
                str(private / "sessions.jsonl"),
                "--json",
                str(report),
            ]
        )
        == 0
    )
    text = report.read_text()
    assert "jane.doe" not in text and "acme-corp" not in text, text
    assert "sessions.jsonl" in json.loads(text)["command"]
