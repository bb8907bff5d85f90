"""Red team round 19, writes, stops and crashes: reproducers of holes left after the eighteenth
round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A fault is injected as the system gives it: a prelude wraps one of kvtrace's own steps and
fails right there, so nothing depends on timing."""

from __future__ import annotations

import pytest

from helpers import kvtrace_child, night_args

pytestmark = pytest.mark.slow

# The disk fails (EIO) as the Beam engine's child opens the night's first id-map segment file
# (BlockIds/WriteSegment): after the child made the new map's folders, before any commit.
_EIO_AS_THE_CHILD_WRITES_A_SEGMENT = """
import errno, os
_cli, _open = os.getpid(), os.open
def _fail_in_the_child(path, *args, **kwargs):
    if os.getpid() != _cli and "/segments/" in str(path):
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))
    return _open(path, *args, **kwargs)
os.open = _fail_in_the_child
"""


@pytest.mark.beam
def test_a_failed_beam_night_leaves_no_folder_it_made_for_a_new_id_map(tiny_tokenizer, tmp_path):
    """storage.run_folders: "a run that publishes nothing leaves the operator's folders as they
    were", every folder a run made removed while empty on every exit that raises. The Beam
    engine makes the new map's folders in its supervised child (id_map.map_folder, through
    storage._make_missing), whose folders are never noted (_MADE is keyed by the CLI's PID and
    a forked child's "are never noted"); run_segments removes only the map's own folder and
    its segments/. The map's missing parent (`maps/`, owner-only) is left behind by a night
    that failed and published nothing; the local engine, given the same fault, leaves none."""
    out, id_map = tmp_path / "night" / "out", tmp_path / "maps" / "m"
    night = night_args(tmp_path, tiny_tokenizer, out, "--engine", "beam")
    night += ["--id-map", str(id_map), "--id-map-marks", str(tmp_path / "marks")]
    failed = kvtrace_child(*night, prelude=_EIO_AS_THE_CHILD_WRITES_A_SEGMENT, timeout=120)
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert "Input/output error" in failed.stderr, failed.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "salt"]
