"""Red team round 18, the gate's publishing side (nothing private published; the audit fails
closed, and passes what kvtrace itself writes): reproducers of what anonymize publishes and
`kvtrace audit` refuses. Each asserts the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import anonymize
from kvtrace.cli import main

pytestmark = pytest.mark.slow


def _audited(folder: Path, tokenizer: str, capsys) -> tuple[int, list[str]]:
    """audit's exit code and flags on folder, as the run was given (no option but the tokenizer)."""
    report = folder.parent / "audit.json"
    code = main(["audit", str(folder), "--tokenizer", tokenizer, "--json", str(report)])
    capsys.readouterr()
    return code, json.loads(report.read_text())["flags"]


@pytest.mark.xfail(strict=True, reason="red team round 18")
@pytest.mark.parametrize("log", [b"", b"\n\n"], ids=["empty", "blank-lines"])
def test_a_night_of_no_records_is_refused_by_anonymize_or_passed_by_audit(
    tiny_tokenizer, tmp_path, capsys, log
):
    """What anonymize publishes, the audit passes (AUDIT.md: "passes only what kvtrace itself
    writes"). A night whose log holds no record at all (a quiet night's empty file) exits 0 and
    publishes a whole folder (manifest `records.exported: 0`, stats of zeros, empty shards);
    `kvtrace audit` of it, given the run's own options, refuses it: "no trace rows: nothing to
    publish, or not a kvtrace output". A nightly job that gates on the audit stops on kvtrace's
    own output. A night whose every record is rejected already fails (ANONYMIZE.md: "nothing to
    publish"); a night of none read must agree with one or the other: anonymize fails it the
    same way (exit 1, no folder), or the audit passes the folder it wrote."""
    src = tmp_path / "in.jsonl"
    src.write_bytes(log)
    out = tmp_path / "out"
    code = anonymize(tiny_tokenizer, [src], out, "--quiet")
    capsys.readouterr()
    if code != 0:
        assert not out.exists()
        return
    assert _audited(out, tiny_tokenizer, capsys) == (0, [])
