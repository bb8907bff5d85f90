"""A stop (SIGTERM, as `kill PID` sends it) at any moment leaves nothing of the run behind: the
dead letters' staging folder and Beam's temporary folders are in the run's one cleanup registry
(storage.remove_on_exit) from the step that makes them. A prelude wraps that step and signals
right after it; the CLI's own handlers then do what they do."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import chat, kvtrace_child, write_jsonl

pytestmark = pytest.mark.slow
NOTHING = "stopped: nothing published"


def _night(tmp_path: Path, tokenizer: str) -> list[str]:
    """An anonymize run's arguments on a log of six chats and a dead letter."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(6)] + [b"{broken"])
    salt = tmp_path / "salt"
    salt.write_text("a-salt-of-thirty-two-bytes-or-so")
    return ["--input", str(src), "--tokenizer", tokenizer, "--block-size", "4"] + [
        "--salt-file",
        str(salt),
    ]


def _said(stopped) -> list[str]:
    return [line for line in stopped.stderr.splitlines() if " INFO " not in line]


# SIGTERM to the CLI right after the run's letters' staging folder is made (before the run's
# own try block: a stop there never reached the letters' settling).
_TERM_AFTER_THE_LETTERS_STAGE = """
import os, signal
from kvtrace.transforms.write import publish
_begin = publish.DeadLetterRun.begin
def _begin_then_stop(self, *args, **kwargs):
    _begin(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
publish.DeadLetterRun.begin = _begin_then_stop
"""


def test_a_stop_right_after_the_letters_are_staged_leaves_no_staging(tiny_tokenizer, tmp_path):
    out = tmp_path / "out"
    stopped = kvtrace_child(
        "anonymize",
        *_night(tmp_path, tiny_tokenizer),
        "--output",
        str(out),
        prelude=_TERM_AFTER_THE_LETTERS_STAGE,
        timeout=120,
    )
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert NOTHING in _said(stopped), _said(stopped)
    letters = tmp_path / "out-rejected"
    assert not letters.exists() or list(letters.iterdir()) == [], list(letters.iterdir())
    assert not out.exists()


# The Beam job's child, right after Beam made its pipeline's temporary folder, stops the CLI
# (SIGTERM) and then itself (SIGSTOP: a child that cannot unwind, busy in a native call), so
# the parent ends it (SIGKILL) with none of its finally blocks run.
_TERM_AFTER_BEAMS_TEMPORARY_FOLDER = """
import os, signal
import apache_beam as beam
_parent = os.getpid()
_init = beam.Pipeline.__init__
def _init_then_stop(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    if os.getpid() != _parent:
        os.kill(_parent, signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGSTOP)
beam.Pipeline.__init__ = _init_then_stop
"""


@pytest.mark.beam
def test_a_stop_right_after_beam_made_its_temporary_folder_leaves_none(tiny_tokenizer, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    stopped = kvtrace_child(
        "anonymize",
        *_night(tmp_path, tiny_tokenizer),
        "--engine",
        "beam",
        "--output",
        str(tmp_path / "out"),
        prelude=_TERM_AFTER_BEAMS_TEMPORARY_FOLDER,
        timeout=120,
        env={"TMPDIR": str(tmp)},
    )
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert NOTHING in _said(stopped), _said(stopped)
    assert sorted(p.name for p in tmp.iterdir()) == []
    letters = tmp_path / "out-rejected"
    assert not letters.exists() or list(letters.iterdir()) == [], list(letters.iterdir())
