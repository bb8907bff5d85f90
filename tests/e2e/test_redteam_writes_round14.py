"""Red team round 14, writes, stops and crashes: reproducers of holes left after the thirteenth
round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A stop is injected as an operator sends it: a prelude wraps one system call kvtrace makes and
signals the process right before it, at a named place, so nothing depends on timing. The
signal's handler raises the stop at the next bytecode, inside the cleanup that made the call."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import kvtrace_child, night_args

pytestmark = pytest.mark.slow

# SIGTERM right before the rename probe's cleanup removes its first name, the second (the
# renamed folder) still standing: publish.prove_folder_rename's `finally: _remove_probe(...)`.
_STOP_AS_THE_PROBE_IS_REMOVED = """
import os, signal
_rmdir = os.rmdir
def _stop_first(path, *args, **kwargs):
    if str(path).endswith("probe-%d" % os.geteuid()) and os.path.isdir(f"{path}.renamed"):
        os.rmdir = _rmdir
        os.kill(os.getpid(), signal.SIGTERM)
    return _rmdir(path, *args, **kwargs)
os.rmdir = _stop_first
"""

# SIGTERM right before the output's lock file is removed as the run lets it go
# (publish.output_lock's finally), once the night is published.
_STOP_AS_THE_LOCK_IS_REMOVED = """
import os, signal
_unlink = os.unlink
def _stop_first(path, *args, **kwargs):
    if str(path).endswith("/.out.kvtrace-lock"):
        os.unlink = _unlink
        os.kill(os.getpid(), signal.SIGTERM)
    return _unlink(path, *args, **kwargs)
os.unlink = _stop_first
"""


def test_a_stop_as_the_rename_probe_is_removed_leaves_no_probe_folder(tiny_tokenizer, tmp_path):
    """A stop leaves nothing it made: "stopped: nothing published" and the folder as it was.
    The plan proves a folder can be renamed in the output's parent (prove_folder_rename: made,
    renamed, removed in a finally) before any work; a stop landing in that finally, between
    its two removals, ends the cleanup there and leaves `.kvtrace-staging-probe-UID.renamed/`
    in the operator's folder (cleared only by a later plan proving in the same folder). The
    probe is neither made under stops_deferred nor in the exit registry (remove_on_exit)."""
    out = tmp_path / "out"
    stopped = kvtrace_child(
        *night_args(tmp_path, tiny_tokenizer, out), prelude=_STOP_AS_THE_PROBE_IS_REMOVED
    )
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert "stopped: nothing published" in stopped.stderr, stopped.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "salt"]


def test_a_stop_as_the_output_lock_is_let_go_leaves_no_lock_file(tiny_tokenizer, tmp_path):
    """output_lock: "The lock file goes with the run". A stop landing as the run lets its lock
    go, once the night is published, skips the unlink, yet the inner finally still takes the
    file out of the exit registry (forget_on_exit), so nothing removes it: the published night
    stands beside a stale `.out.kvtrace-lock` (taken by the next run of that output, which for
    a night writing a new folder each night never comes)."""
    out = tmp_path / "out"
    stopped = kvtrace_child(
        *night_args(tmp_path, tiny_tokenizer, out), prelude=_STOP_AS_THE_LOCK_IS_REMOVED
    )
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert (out / "manifest.json").is_file(), stopped.stderr[-2000:]
    letters = Path(f"{out}-rejected")
    assert [p.name.split("-")[0] for p in letters.iterdir()] == ["rejected"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out", "out-rejected", "salt"]
