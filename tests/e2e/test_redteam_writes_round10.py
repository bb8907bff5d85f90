"""Red team round 10, writes, stops and crashes: reproducers of holes left after the ninth
round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A stop or a crash is injected as an operator (or the OOM killer) sends it: a prelude wraps one of
kvtrace's own steps (or a library's) and signals right before or after it; the CLI's own handlers
then do what they do."""

from __future__ import annotations

import signal

import pytest

from helpers import kvtrace_child, night_args

pytestmark = pytest.mark.slow

# The disk fills while the night's block hashes are staged, right after its id map version was
# committed (the map is published before the trace and its block hashes).
_DISK_FULL_AT_THE_BLOCK_HASHES = """
import errno
from kvtrace.transforms import storage
from kvtrace.transforms.write import shards
_create = storage.create
def _create_on_a_full_disk(path, *args, **kwargs):
    if str(path).endswith(shards.BLOCK_HASHES_OUTPUT):
        raise OSError(errno.ENOSPC, "No space left on device")
    return _create(path, *args, **kwargs)
storage.create = _create_on_a_full_disk
"""


def test_a_night_that_fails_after_its_id_map_commit_says_the_map_was_extended(
    tiny_tokenizer, tmp_path
):
    """NIGHTLY.md: the output is published after the map version, and "a stop after it names it
    in its line (`stopped: published version N of the id map MAP before the stop`), never
    'nothing published'". A failure at the same moment is not told so: storage running out
    while the night's block hashes are staged (publish_block_hashes, inside the night's one
    publication) rolls the trace back, as it should, but the map stays extended by the night
    and the run says only `error: the job failed: [Errno 28] No space left on device` (exit 1),
    the line every failure before the commit gives. An operator reads a failed night that
    changed nothing, where the map now holds it (a rerun completes it, NIGHTLY.md, but only if
    the operator knows to rerun that very night before the next). What a failed run leaves
    must be said as a stopped one's is (publish.published_here, read by cli._run for errors
    too)."""
    out, id_map = tmp_path / "out", tmp_path / "map"
    night = night_args(tmp_path, tiny_tokenizer, out)
    night += ["--id-map", str(id_map), "--id-map-marks", str(tmp_path / "marks")]
    night += ["--emit-block-hashes", str(tmp_path / "hashes"), "--hash-scheme", "dynamo"]
    failed = kvtrace_child(*night, prelude=_DISK_FULL_AT_THE_BLOCK_HASHES, timeout=120)
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert not out.exists()  # the trace rolled back with its block hashes: whole or nothing
    assert (id_map / "versions" / "000001.json").is_file()  # the map kept the night
    said = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert said and f"version 1 of the id map {id_map}" in said[-1], said


# The OOM killer ends the Beam engine's child right after it committed the night's id map
# version, its job finished (anonymize_night.finish_staged; told to the parent:
# publish.forward_publications).
_KILL_THE_CHILD_AFTER_ITS_COMMIT = """
import os, signal
from kvtrace.pipelines import anonymize_night
_cli = os.getpid()
_commit = anonymize_night.commit_id_map
def _commit_then_die(*args, **kwargs):
    done = _commit(*args, **kwargs)
    if os.getpid() != _cli:
        os.kill(os.getpid(), signal.SIGKILL)
    return done
anonymize_night.commit_id_map = _commit_then_die
"""


@pytest.mark.beam
def test_a_beam_child_dying_after_its_id_map_commit_says_the_map_was_extended(
    tiny_tokenizer, tmp_path
):
    """The Beam engine's child commits the id map itself and tells its parent as the commit
    stands, "so the parent's stop says it" (child_process.py). Its death says nothing of it:
    the child killed right after the commit (the OOM killer) gives `error: a worker process
    died by SIGKILL` (exit 1) beside a map extended by the night, its trace unpublished; the
    parent's record holds the commit, but only a stop reads it. As the local failure above:
    the error line must name what stands."""
    out, id_map = tmp_path / "out", tmp_path / "map"
    night = night_args(tmp_path, tiny_tokenizer, out, "--engine", "beam")
    night += ["--id-map", str(id_map), "--id-map-marks", str(tmp_path / "marks")]
    failed = kvtrace_child(*night, prelude=_KILL_THE_CHILD_AFTER_ITS_COMMIT, timeout=120)
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert not out.exists()
    assert (id_map / "versions" / "000001.json").is_file()
    said = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert said and f"version 1 of the id map {id_map}" in said[-1], said


# An operator's shell with the umask most distributions give users (002: group-writable).
_GROUP_WRITABLE_UMASK = "import os\nos.umask(0o002)"


def test_the_folders_kvtrace_makes_for_block_hashes_are_owner_only(tiny_tokenizer, tmp_path):
    """storage.make_folder(private=True): "every folder made here is owner-only, not just the
    last", and an existing folder "other users may write is refused: they could rename, delete
    or plant files among the private ones". The dead letters' and the id map's missing parents
    are made 0700 so. The block hashes' (private: unkeyed engine hashes, a dictionary attack's
    key) are not: publish.output_lock(hashes) makes their missing parents first, with
    os.makedirs under the operator's umask (0775 under 002, 0777 under 0), so make_folder then
    finds them existing and makes only the last one owner-only. kvtrace thus makes, for its own
    private folder, a parent of the kind it refuses in an existing one: a group member can
    rename the block hashes away and plant others in their place for the engine join. Every
    folder kvtrace makes for a private location must be owner-only, whichever step makes it
    first."""
    hashes = tmp_path / "private" / "night" / "hashes"
    night = night_args(tmp_path, tiny_tokenizer, tmp_path / "out")
    night += ["--emit-block-hashes", str(hashes), "--hash-scheme", "dynamo"]
    done = kvtrace_child(*night, prelude=_GROUP_WRITABLE_UMASK, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    made = [hashes, hashes.parent, hashes.parent.parent]
    assert {str(f): oct(f.stat().st_mode & 0o777) for f in made} == {str(f): "0o700" for f in made}


# The OOM killer (or `kill -9`) ends the CLI once the Beam engine's child has started its job.
_KILL_THE_CLI_FROM_THE_JOB = """
import os, signal
from kvtrace.pipelines import anonymize_beam
_cli = os.getpid()
_run_here = anonymize_beam._run_here
def _kill_the_cli_then_run(*args, **kwargs):
    if os.getpid() != _cli:
        os.kill(_cli, signal.SIGKILL)
    return _run_here(*args, **kwargs)
anonymize_beam._run_here = _kill_the_cli_then_run
"""


@pytest.mark.beam
def test_a_killed_beam_run_and_its_rerun_leave_nothing_in_the_temporary_folder(
    tiny_tokenizer, tmp_path
):
    """The Beam engine's child keeps its temporary files (Beam's pipeline folder among them) in
    a folder the parent makes in $TMPDIR (child_process.run_in_child: kvtrace-job-*, removed in
    a finally block or by the hard end's registry). A killed CLI runs neither, and no later run
    looks for it: each kill leaves one more kvtrace-job-*/beam-pipeline-temp*/ in $TMPDIR for
    good (this machine's /tmp held a dozen from test runs), and whatever the job had written
    there. Round 9 held standard input's spool to "a killed run and its rerun must leave
    nothing behind" and made it unnamed; the job's folder is the remaining named leftover of a
    killed run that no rerun clears (a rerun of the output clears its staging and lock)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    night = night_args(tmp_path, tiny_tokenizer, tmp_path / "out", "--engine", "beam")
    for prelude in (_KILL_THE_CLI_FROM_THE_JOB, ""):
        done = kvtrace_child(*night, prelude=prelude, timeout=120, env={"TMPDIR": str(tmp)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("kvtrace-job-")) == []


# A stop (`kill PID`, SIGTERM) lands right after the night's trace was swapped in, while its block
# hashes are synced on a loaded disk: an fsync stalled 3 s (writeback under load, a network
# file system), as the hashes' folder is published (shards.publish_block_hashes).
_STOP_WHILE_THE_HASHES_SYNC_SLOWLY = """
import os, select, signal
from kvtrace.transforms.write import shards
_publish = shards.publish_folder
def _stop_then_sync_slowly(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    select.select([], [], [], 3.0)  # the stalled fsync
    return _publish(*args, **kwargs)
shards.publish_folder = _stop_then_sync_slowly
"""


def test_a_stop_while_a_slow_disk_publishes_the_hashes_never_leaves_half_a_night(
    tiny_tokenizer, tmp_path
):
    """BLOCK_HASHES.md: "A stop (Ctrl-C, SIGTERM) is no such window: both are one publication,
    so a stop that lands while the output is swapped in is raised once the hashes stand too".
    It is, only if the rest of the publication takes less than the stop's deadline: the CLI's
    watcher ends the process STOP_DEADLINE_S (1.5 s) after the signal whatever runs, waiting
    ABANDON_WAIT_S (0.2 s) for the publication under way (cli._Stop.end,
    publish.abandon_staged), then os._exit. The hashes' publication fsyncs a file and a folder
    and sets every file's time before its swap; on a loaded disk that passes 1.7 s, and the stop
    leaves the new trace published without its hashes (the first night: no hashes at all; a
    later one: the previous night's), and says `stopped: nothing published; a publication was
    under way at the deadline and may be half done` beside the published trace (the
    publication's names are recorded only once it ends whole). A stop must leave a night's
    publication whole or rolled back: the slow steps done before the first swap (the swaps
    back to back), or a hard end rolling back the swaps of a publication it abandons."""
    out, hashes = tmp_path / "out", tmp_path / "hashes"
    night = night_args(tmp_path, tiny_tokenizer, out)
    night += ["--emit-block-hashes", str(hashes), "--hash-scheme", "dynamo"]
    stopped = kvtrace_child(*night, prelude=_STOP_WHILE_THE_HASHES_SYNC_SLOWLY, timeout=120)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    published = (out / "manifest.json").is_file(), (hashes / "manifest.json.sha256").is_file()
    assert published in {(True, True), (False, False)}, (published, stopped.stderr[-600:])
