"""Red team round 18, writes, stops and crashes: reproducers of holes left after the
seventeenth round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A fault is injected as the system gives it: a prelude wraps one of kvtrace's own steps and
fails right there, so nothing depends on timing."""

from __future__ import annotations

import pytest

from helpers import kvtrace_child, night_args

pytestmark = pytest.mark.slow

# The disk is full as the rename probe makes its folder (publish.prove_folder_rename's
# os.mkdir): a full file system (blocks or inodes) fails a mkdir with ENOSPC, as it fails
# every other write.
_FULL_AS_THE_PROBE_IS_MADE = """
import errno, os
_mkdir = os.mkdir
def _full_for_the_probe(path, *args, **kwargs):
    if ".kvtrace-staging-probe-" in str(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return _mkdir(path, *args, **kwargs)
os.mkdir = _full_for_the_probe
"""


def test_a_full_disk_met_by_the_rename_probe_is_a_job_that_stopped(tiny_tokenizer, tmp_path):
    """kvtrace/cli.py: storage running out (ENOSPC, EDQUOT, EFBIG) "is a job that stopped (1
    ...), never a refusal (2)": exit 2 tells a scheduler the command line is wrong and a retry
    is useless, so a night met by a disk full for a moment is never retried (round 8 fixed the
    same for standard input's spool). Round 17's probe, which tells a failed mkdir from a failed
    rename, turns every OSError of its mkdir (and of its rename) into OutputRefused: a full disk
    exits 2 with "write elsewhere"."""
    out = tmp_path / "out"
    full = kvtrace_child(
        *night_args(tmp_path, tiny_tokenizer, out), prelude=_FULL_AS_THE_PROBE_IS_MADE, timeout=120
    )
    assert "No space left on device" in full.stderr, full.stderr[-2000:]
    assert full.returncode == 1, full.stderr[-2000:]
    assert not out.exists()
