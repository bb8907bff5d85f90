"""Red team round 4: what other commands publish beside a trace (analyze --output). Each test
asserts the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import pytest
from conftest import anonymize, chat, write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.slow
ROUND4 = "red team round 4"


@pytest.mark.xfail(strict=True, reason=ROUND4)
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
        assert "jane.doe" not in text and "acme-corp" not in text, \
            f"{path.name} names the operator's folders: {text.splitlines()[0][:120]}"
