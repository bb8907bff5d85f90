"""Red team round 15, writes, stops and crashes: reproducers of holes left after the fourteenth
round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A stop is injected as an operator sends it: a prelude wraps one system call kvtrace makes and
signals the process right after it returns, at a named place, so nothing depends on timing. The
signal's handler raises the stop at the next bytecode, as the step that made the call goes on."""

from __future__ import annotations

import pytest

from helpers import kvtrace_child, night_args

pytestmark = pytest.mark.slow

# SIGTERM right after the output's lock file is created (publish._take_lock's os.open with
# O_CREAT), before output_lock puts it in the exit registry (storage.remove_on_exit).
_STOP_AS_THE_LOCK_IS_TAKEN = """
import os, signal
_open = os.open
def _stop_after(path, *args, **kwargs):
    try:
        return _open(path, *args, **kwargs)
    finally:
        if str(path).endswith("/.out.kvtrace-lock"):
            os.open = _open
            os.kill(os.getpid(), signal.SIGTERM)
os.open = _stop_after
"""


def test_a_stop_as_the_output_lock_is_taken_leaves_no_lock_file(tiny_tokenizer, tmp_path):
    """A stop leaves nothing it made: "stopped: nothing published" and the folder as it was.
    Round 14 put the lock's letting go in one deferred section; its taking has the same gap:
    _take_lock creates `.out.kvtrace-lock` (os.open O_CREAT) and only then does output_lock
    register it for removal (remove_on_exit) and enter the try whose finally removes it. A
    stop landing between the two unwinds through neither, and the lock file stays in the
    operator's folder (taken by the next run of that output, which for a nightly folder named
    by date never comes)."""
    out = tmp_path / "out"
    stopped = kvtrace_child(
        *night_args(tmp_path, tiny_tokenizer, out), prelude=_STOP_AS_THE_LOCK_IS_TAKEN
    )
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert "stopped: nothing published" in stopped.stderr, stopped.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "salt"]
