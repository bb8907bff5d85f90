"""Red team round 17, writes, stops and crashes: reproducers of holes left after the sixteenth
round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

Held this round: every written location spelled '-' (each command's --output, --json, MAP),
outputs under a file, /proc, /sys, a FIFO as a folder, owner-only modes under umask 0, a night
refused by the rejected fraction on both engines (no map folder, no segments). What follows
is what broke."""

from __future__ import annotations

import pytest

from helpers import STOP_AS_THE_OUTPUT_IS_STAGED, kvtrace_child, night_args

pytestmark = pytest.mark.slow

# The OOM killer ends the Beam engine's child the moment its id-map commit's one atomic step
# is done (version 1's record linked into versions/: exclusive._create_local), inside the
# commit's publication (the COMMITTED marks, CURRENT and the mark still to come).
_KILL_THE_CHILD_AS_ITS_COMMIT_STANDS = """
import os, signal
_cli, _link = os.getpid(), os.link
def _link_then_die(source, destination, *args, **kwargs):
    done = _link(source, destination, *args, **kwargs)
    if os.getpid() != _cli and str(destination).endswith("/versions/000001.json"):
        os.kill(os.getpid(), signal.SIGKILL)
    return done
os.link = _link_then_die
"""


@pytest.mark.beam
def test_a_beam_child_dying_as_its_id_map_commit_stands_says_the_map_was_extended(
    tiny_tokenizer, tmp_path
):
    """NIGHTLY.md: "A failure after the commit ... or inside its publication once the
    version's record stands ... says it too: `error: ...; published version N of the id map
    MAP before the failure`, on both engines (a Beam child that dies after its commit
    included)". Round 16 made the local engine record the commit the moment its record is
    linked (create_exclusive's `created`); the Beam child still tells its parent only once
    the whole publication ends (publish._Published.note, forward_publications). Killed
    between the two (the OOM killer picks the child, the largest process), the parent says
    `error: a worker process died by SIGKILL` beside a map that holds the night (version 1),
    its trace unpublished: the line hides that the map was extended."""
    out, id_map = tmp_path / "out", tmp_path / "map"
    night = night_args(tmp_path, tiny_tokenizer, out, "--engine", "beam")
    night += ["--id-map", str(id_map), "--id-map-marks", str(tmp_path / "marks")]
    failed = kvtrace_child(*night, prelude=_KILL_THE_CHILD_AS_ITS_COMMIT_STANDS, timeout=120)
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert not out.exists()
    assert (id_map / "versions" / "000001.json").is_file()  # the night is in the map
    said = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert said and f"version 1 of the id map {id_map}" in said[-1], said


def test_a_stopped_night_leaves_no_folder_it_made_on_its_outputs_way(tiny_tokenizer, tmp_path):
    """A stop leaves nothing it made: "stopped: nothing published" and the folder as it was
    (round 14), as the id map's folders a run made go when it committed nothing
    (id_map.run_segments). The output's and the dead letters' missing parents do not: the
    run makes them before its work (DeadLetterRun.__init__'s os.makedirs beside the output's
    lock; make_folder's parents of the dead-letter folder) and nothing removes them, so a
    stopped (or refused: the rejected fraction) night leaves `night/` and `letters/` behind,
    empty, in the operator's folder, on every exit."""
    out, letters = tmp_path / "night" / "out", tmp_path / "letters" / "dead"
    night = night_args(tmp_path, tiny_tokenizer, out, "--dead-letter", str(letters))
    stopped = kvtrace_child(*night, prelude=STOP_AS_THE_OUTPUT_IS_STAGED, timeout=120)
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert "stopped: nothing published" in stopped.stderr, stopped.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "salt"]
