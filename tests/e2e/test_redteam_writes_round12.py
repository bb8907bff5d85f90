"""Red team round 12, writes, stops and crashes: reproducers of holes left after the eleventh
round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A fault is injected as the system gives it: a prelude wraps one of kvtrace's own steps and
fails (or signals) right there, so nothing depends on timing."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import SALT, kvtrace_child, write_jsonl

pytestmark = pytest.mark.slow

USER = {"role": "user", "content": "the quick brown fox jumps over the lazy dog " * 4}
# A response that reports the engine's cached tokens: the run writes a measured file.
MEASURED = {"usage": {"prompt_tokens_details": {"cached_tokens": 8}}}


def _measured_night(tmp_path: Path, tokenizer: str, out: Path) -> list[str]:
    """An anonymize run's arguments on 8 chats whose responses carry cached-token counts, and
    one dead letter."""
    records = [
        {"timestamp": 1_000 * i, "messages": [USER], "output_length": 3, "response": MEASURED}
        for i in range(8)
    ]
    write_jsonl(tmp_path / "in.jsonl", [*records, b"{broken"])
    (tmp_path / "salt").write_text(SALT)
    return [
        "anonymize",
        "--input",
        str(tmp_path / "in.jsonl"),
        "--tokenizer",
        tokenizer,
        "--block-size",
        "4",
        "--salt-file",
        str(tmp_path / "salt"),
        "--output",
        str(out),
    ]


# The dead-letter folder's disk is full as the run's measured parts are joined: the join copies
# every part into one more file (publish._joined_measured), after the trace was published.
_FULL_AS_MEASURED_IS_JOINED = """
import errno, shutil, types
from kvtrace.transforms.write import publish
def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")
publish.shutil = types.SimpleNamespace(**{**vars(shutil), "copyfileobj": _full})
"""


@pytest.mark.xfail(strict=True, reason="red team round 12")
def test_a_full_disk_as_the_measured_file_is_joined_keeps_the_nights_letters(
    tiny_tokenizer, tmp_path
):
    """publish.DeadLetterRun: "a run that fails after publishing (a full disk while it tidies
    up) still publishes its letters"; once the trace is published, settling its letters is
    renames only, which need no space. The measured file (issue 37.1) added a write after the
    commit point: _settle_staged joins the measured parts (a copy of them all) before it
    renames anything, so a full disk there ends the run with its trace published and its
    letters (and measured file) left hidden in staging, settled only by a later run of that
    same output (a nightly run writes a new folder each night: never)."""
    out = tmp_path / "out"
    failed = kvtrace_child(
        *_measured_night(tmp_path, tiny_tokenizer, out),
        prelude=_FULL_AS_MEASURED_IS_JOINED,
        timeout=120,
    )
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert (out / "manifest.json").is_file()  # the trace was published before the failure
    letters = Path(f"{out}-rejected")
    assert list(letters.glob("rejected-*.jsonl")), sorted(p.name for p in letters.rglob("*"))
