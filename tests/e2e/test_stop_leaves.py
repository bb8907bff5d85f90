"""What a stop (SIGTERM, as `kill PID` sends it) leaves, and says it leaves, at any moment: nothing
of the run behind (the dead letters' staging folder and Beam's temporary folders are in the
run's one cleanup registry, storage.remove_on_exit, from the step that makes them), and a line
naming what it published, an id map's version committed included, whichever process committed
it. A prelude wraps a step and signals right after it; the CLI's own handlers then do what they
do."""

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


# SIGTERM to the CLI right after the id map's version is committed (id_map.publish), by
# whichever process commits it: the local engine's, or the Beam engine's child.
_TERM_AFTER_THE_COMMIT = """
import os, signal
from kvtrace.transforms.ids import id_map
_parent = os.getpid()
_publish = id_map.publish
def _publish_then_stop(*args, **kwargs):
    record = _publish(*args, **kwargs)
    os.kill(_parent, signal.SIGTERM)
    return record
id_map.publish = _publish_then_stop
"""


@pytest.mark.parametrize("engine", ["local", pytest.param("beam", marks=pytest.mark.beam)])
def test_a_stop_right_after_the_id_map_commit_says_it_committed(tiny_tokenizer, tmp_path, engine):
    """Before, both engines said "stopped: nothing published" beside a map extended to version
    1: the commit was no publication of the record (and the Beam engine's is its child's)."""
    out, map_dir = tmp_path / "out", tmp_path / "map"
    stopped = kvtrace_child(
        "anonymize",
        *_night(tmp_path, tiny_tokenizer),
        *("--output", str(out), "--engine", engine, "--id-map", str(map_dir)),
        prelude=_TERM_AFTER_THE_COMMIT,
        timeout=120,
    )
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert (map_dir / "versions" / "000001.json").is_file()
    assert not out.exists()
    said = _said(stopped)
    assert f"stopped: published version 1 of the id map {map_dir} before the stop" in said, said
