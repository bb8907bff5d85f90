"""Red team round 12, writes, stops and crashes: reproducers of holes left after the eleventh
round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A fault is injected as the system gives it: a prelude wraps one of kvtrace's own steps and
fails (or signals) right there, so nothing depends on timing."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import kvtrace_child, night_args

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
    return night_args(tmp_path, tokenizer, out, records=records)


# The disk is full from the moment the trace is published: any file created or copied after
# it fails (the measured parts were joined there, a copy of them all, before this round's fix).
_FULL_ONCE_PUBLISHED = """
import errno, shutil
from kvtrace.pipelines import anonymize_night
from kvtrace.transforms import storage
def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")
_publish_folder = anonymize_night.publish_folder
def _publish_then_full(*args, **kwargs):
    _publish_folder(*args, **kwargs)
    storage.create = shutil.copyfileobj = _full
anonymize_night.publish_folder = _publish_then_full
"""

# The disk is full as the measured parts are joined (read/measured.join_measured).
_FULL_AS_MEASURED_IS_JOINED = """
import errno
from kvtrace.transforms.read import measured
def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")
measured.shutil.copyfileobj = _full
"""


def test_a_full_disk_once_the_trace_is_published_keeps_the_nights_letters(tiny_tokenizer, tmp_path):
    """publish.DeadLetterRun: "a run that fails after publishing (a full disk while it tidies
    up) still publishes its letters"; once the trace is published, settling its letters is
    renames only, which need no space. The measured file (issue 37.1) added a write after the
    commit point: _settle_staged joined the measured parts (a copy of them all) before it
    renamed anything, so a full disk there ended the run with its trace published and its
    letters (and measured file) left hidden in staging, settled only by a later run of that
    same output (a nightly run writes a new folder each night: never). Now the parts are
    joined while the output is staged, and the settle writes nothing."""
    out = tmp_path / "out"
    ran = kvtrace_child(
        *_measured_night(tmp_path, tiny_tokenizer, out), prelude=_FULL_ONCE_PUBLISHED, timeout=120
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (out / "manifest.json").is_file()
    letters = Path(f"{out}-rejected")
    assert sorted(p.name.split("-")[0] for p in letters.iterdir()) == ["measured", "rejected"]


def test_a_full_disk_as_the_measured_parts_are_joined_publishes_nothing(tiny_tokenizer, tmp_path):
    """The join is the output's last write before its publication: a full disk there fails
    the night whole, in one line, its trace, letters and staging gone (its rerun writes them)."""
    out = tmp_path / "out"
    failed = kvtrace_child(
        *_measured_night(tmp_path, tiny_tokenizer, out),
        prelude=_FULL_AS_MEASURED_IS_JOINED,
        timeout=120,
    )
    assert failed.returncode == 1, failed.stderr[-2000:]
    error = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "No space left" in error[0], failed.stderr[-2000:]
    assert not out.exists()
    letters = Path(f"{out}-rejected")
    assert not letters.exists() or not list(letters.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "salt"]
