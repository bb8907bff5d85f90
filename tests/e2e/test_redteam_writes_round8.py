"""Red team round 8, the write protocol, stops and readers: reproducers of holes left after the
seventh round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A stop is injected as an operator sends it (a prelude wraps one of kvtrace's own steps and
signals right before or after it); the CLI's own handlers then do what they do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import chat, write_jsonl

pytestmark = pytest.mark.slow
ROUND8 = "red team round 8"
ROOT = Path(__file__).resolve().parents[2]
NOTHING = "stopped: nothing published"


def _kvtrace(*args: str, prelude: str = "", timeout: int = 300, **kwargs) -> subprocess.CompletedProcess:
    """kvtrace in a child process (prelude: Python run first, to inject a stop)."""
    code = prelude + "\nimport sys\nfrom kvtrace.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=timeout,
        text=True,
        check=False,
        **kwargs,
    )


def _said(done: subprocess.CompletedProcess) -> list[str]:
    """What the run said on stderr, its progress log (INFO lines, transformers') aside."""
    return [
        line
        for line in done.stderr.splitlines()
        if " INFO " not in line and "PyTorch was not found" not in line
    ]


def _night(tmp_path: Path, tokenizer: str, n: int, letters: bool = True) -> list[str]:
    """An anonymize run's arguments on a log of n chats (and two dead letters, if letters)."""
    src = write_jsonl(
        tmp_path / f"in{n}.jsonl",
        [chat(i, 1000 * i) for i in range(n)] + ([b"{broken", b"[]"] if letters else []),
    )
    salt = tmp_path / "salt"
    salt.write_text("round-eight-salt-of-thirty-two-b")
    return ["--input", str(src), "--tokenizer", tokenizer, "--block-size", "4",
            "--salt-file", str(salt)]


# `kill PARENT` (SIGTERM) sent by the Beam job's child right after it published something: as
# an operator's signal landing while the child publishes (the child defers only its own stop).
_TERM_PARENT_AFTER_CHILD_PUBLISHED = """
import os, signal, time
from kvtrace.transforms.write import publish
_parent = os.getpid()
_publish = publish.publish_in_place
def _publish_then_stop(*args, **kwargs):
    _publish(*args, **kwargs)
    if os.getpid() != _parent:
        os.kill(_parent, signal.SIGTERM)
        time.sleep(1)
publish.publish_in_place = _publish_then_stop
"""


@pytest.mark.beam
@pytest.mark.xfail(strict=True, reason=ROUND8)
def test_a_stop_after_the_beam_child_published_never_says_nothing_was(tiny_tokenizer, tmp_path):
    """--engine beam runs its job in a child (pipelines/child_process.run_in_child), and the
    child publishes the trace (anonymize_night.publish_trace). What a stop says comes from
    publish.published_here(), a record of the process it is read in: the parent's, empty. A
    SIGTERM to the CLI once the child has published exits 143 with "stopped: nothing
    published" beside a whole, fresh output (with dead letters, it names the letters alone).
    Round 6's fix (a stop after publication says so) holds only where the publication ran in
    the process that reports: the record does not cross the child's boundary."""
    out = tmp_path / "out"
    night = _night(tmp_path, tiny_tokenizer, 6, letters=False)
    stopped = _kvtrace("anonymize", *night, "--engine", "beam", "--output", str(out),
                       prelude=_TERM_PARENT_AFTER_CHILD_PUBLISHED)
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert (out / "manifest.json").is_file()  # published whole by the stopped run's child
    assert NOTHING not in _said(stopped), _said(stopped)
