"""Red team round 9, writes, stops and crashes: reproducers of holes left after the eighth
round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A stop or a crash is injected as an operator (or the OOM killer) sends it: a prelude wraps one of
kvtrace's own steps and signals right before or after it; the CLI's own handlers then do what
they do."""

from __future__ import annotations

import hashlib
import os
import pty
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, kvtrace_child, night_args

pytestmark = pytest.mark.slow
ROUND9 = "red team round 9"
NOTHING = "stopped: nothing published"
_MAIN = "import sys\nfrom kvtrace.cli import main\nsys.exit(main(sys.argv[1:]))"


def _said(done: subprocess.CompletedProcess) -> list[str]:
    """What the run said on stderr, its progress log (INFO lines, transformers') aside."""
    return [
        line
        for line in done.stderr.splitlines()
        if " INFO " not in line and "PyTorch was not found" not in line
    ]


def _spools(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("kvtrace-stdin-"))


# The OOM killer (or `kill -9`, a scheduler's hard timeout) ends the CLI while its local engine's
# worker encodes: the worker, once started, kills its parent, and notes its own pid so that the
# test can end it.
_KILL_PARENT_FROM_THE_WORKER = """
import os, signal
from kvtrace.pipelines import anonymize_local
_parent = os.getpid()
_encode = anonymize_local.RangeEncoding.encode
def _encode_then_orphaned(self, *args, **kwargs):
    if os.getpid() != _parent:
        with open(os.environ["ROUND9_PIDS"], "a") as pids:
            pids.write(f"{os.getpid()}\\n")
        os.kill(_parent, signal.SIGKILL)
    return _encode(self, *args, **kwargs)
anonymize_local.RangeEncoding.encode = _encode_then_orphaned
"""


def _end_orphans(pids: Path) -> None:
    """SIGKILL to the recorded workers still running (this test's alone: their command line is
    the prelude's)."""
    if not pids.exists():
        return
    for pid in {int(p) for p in pids.read_text().split()}:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if b"_encode_then_orphaned" not in cmdline.read():
                    continue
            os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            pass


def test_a_killed_run_leaves_no_worker_holding_its_output_locked(tiny_tokenizer, tmp_path):
    """The local engine forks its workers (local_workers._start_pool: ProcessPoolExecutor, fork)
    after the output's lock is taken (publish.output_lock: flock on an O_CLOEXEC descriptor,
    which a fork inherits all the same). Unlike the Beam engine's child
    (child_process._end_with_parent: PR_SET_PDEATHSIG), a worker is not ended with its parent:
    the CLI killed (SIGKILL: the OOM killer, a hard timeout) leaves its worker running forever
    (it finishes its ranges, then waits on the pool's queue, which it holds open itself), with
    the private log's text in memory and the lock's descriptor open. Every later run of that
    output is refused ("another kvtrace run is writing ...; one run per output at a time"),
    night after night, until someone finds and kills the orphan. "The lock file goes with the
    run (one a killed run leaves is taken by the next)": a killed run must leave no process."""
    out, pids = tmp_path / "out", tmp_path / "pids"
    night = night_args(tmp_path, tiny_tokenizer, out)
    try:
        # Its streams to a file: the orphan holds them open, so pipes would never end.
        with open(tmp_path / "killed.err", "wb") as said:
            killed = subprocess.run(
                [sys.executable, "-c", f"{_KILL_PARENT_FROM_THE_WORKER}\n{_MAIN}", *night],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=said,
                timeout=120,
                check=False,
                env={**os.environ, "PYTHONPATH": str(ROOT), "ROUND9_PIDS": str(pids)},
            )
        assert killed.returncode == -signal.SIGKILL, (tmp_path / "killed.err").read_text()
        rerun = kvtrace_child(*night, timeout=120)
    finally:
        _end_orphans(pids)
    assert rerun.returncode == 0, _said(rerun)
    assert (out / "manifest.json").is_file()


# A terminal hung up (an ssh session dropped, a closed tmux pane) or `kill -HUP PID`, right after
# standard input was copied to its spool.
_HANG_UP_AFTER_THE_SPOOL = """
import os, signal
from kvtrace.transforms.read import decompress
_spool = decompress._spool
def _spool_then_hang_up(*args, **kwargs):
    spooled = _spool(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGHUP)
    return spooled
decompress._spool = _spool_then_hang_up
"""


def test_a_hang_up_is_a_stop_that_removes_what_the_run_made(tiny_tokenizer, tmp_path):
    """The CLI handles SIGINT and SIGTERM as stops (cli.STOP_SIGNALS), not SIGHUP, the signal an
    operator's closed terminal or dropped ssh session sends: its default action ends the process
    at once, past every finally block and the hard end's cleanup registry
    (storage.remove_leftovers). The whole private log's copy stays in $TMPDIR
    (kvtrace-stdin-*/, "removed when the run ends (a stop's hard end included)"), the lock file
    beside the output too, and the run says nothing (exit 129, no "stopped:" line); with the
    local engine's workers, a hang-up sent to the CLI alone orphans them as SIGKILL does."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    args = night_args(tmp_path, tiny_tokenizer, tmp_path / "out")
    args[args.index("--input") + 1] = "-"
    with open(tmp_path / "in.jsonl", "rb") as log:
        hung_up = kvtrace_child(
            *args,
            prelude=_HANG_UP_AFTER_THE_SPOOL,
            stdin=log,
            timeout=120,
            env={"TMPDIR": str(tmp)},
        )
    assert _spools(tmp) == []
    assert NOTHING in _said(hung_up), _said(hung_up)
    assert hung_up.returncode == 128 + signal.SIGHUP, hung_up.stderr[-2000:]


_KILL_AFTER_THE_SPOOL = """
import os, signal
from kvtrace.transforms.read import decompress
_spool = decompress._spool
def _spool_then_die(*args, **kwargs):
    spooled = _spool(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
    return spooled
decompress._spool = _spool_then_die
"""


def test_a_killed_runs_copy_of_standard_input_is_not_left_for_good(tiny_tokenizer, tmp_path):
    """`--input -` copies the whole private log to $TMPDIR/kvtrace-stdin-*/ under a name
    (decompress.spooled_standard_input), removed in a finally block or by the hard end's registry:
    a run killed (SIGKILL: the OOM killer, which large inputs invite) runs neither, and no later
    run looks for it. Every kill leaves one more full copy of a night's prompts on the disk for
    good (the staging and lock leftovers, by contrast, are cleared by the next run of the
    output). A killed run and its rerun must leave nothing behind, as the crash-point harness
    holds every other file to (an unnamed spool, O_TMPFILE or unlinked once open, goes with the
    process whatever ends it)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    args = night_args(tmp_path, tiny_tokenizer, tmp_path / "out")
    args[args.index("--input") + 1] = "-"
    for prelude in (_KILL_AFTER_THE_SPOOL, ""):
        with open(tmp_path / "in.jsonl", "rb") as log:
            done = kvtrace_child(
                *args, prelude=prelude, stdin=log, timeout=120, env={"TMPDIR": str(tmp)}
            )
    assert done.returncode == 0, _said(done)
    assert _spools(tmp) == []


# SIGTERM landing while the trace output is being swapped in: the publication defers it to its
# end (interrupts.stops_deferred), "so that a publication is whole".
_TERM_WHILE_THE_OUTPUT_IS_PUBLISHED = """
import os, signal
from kvtrace.transforms.write import publish
_swap_in = publish._swap_in
def _swap_in_and_stop(staged, output):
    previous = _swap_in(staged, output)
    if os.path.basename(output) == "out":
        os.kill(os.getpid(), signal.SIGTERM)
    return previous
publish._swap_in = _swap_in_and_stop
"""


def test_a_stop_while_the_trace_is_published_publishes_its_block_hashes_too(
    tiny_tokenizer, tmp_path
):
    """anonymize_night.publish_staged publishes the trace (publish_folder) and then its block
    hashes (shards.publish_block_hashes) as two publications, each its own stops_deferred
    section. A stop landing while the trace is swapped in is deferred to the end of the first
    and raised there: the trace and its letters are published, the block hashes never are (no
    --emit-block-hashes folder at all; their staging removed), exit 143. docs/BLOCK_HASHES.md
    accepts that window for a kill, which nothing can defer; a stop can be, and the promise is
    that a stop never splits a publication: the night's trace and the hashes that belong to it
    both, or neither."""
    out, hashes = tmp_path / "out", tmp_path / "hashes"
    args = night_args(
        tmp_path, tiny_tokenizer, out, "--hash-scheme", "dynamo", "--emit-block-hashes", str(hashes)
    )
    stopped = kvtrace_child(*args, prelude=_TERM_WHILE_THE_OUTPUT_IS_PUBLISHED, timeout=120)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    assert (out / "manifest.json").is_file()  # the stop came once the trace was swapped in
    belongs = hashes / "manifest.json.sha256"
    assert belongs.is_file(), sorted(p.name for p in tmp_path.iterdir())
    digest = hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    assert belongs.read_text().split()[0] == digest


# SIGTERM landing right after the id map's commit (versions/NNNNNN.json created), on the local
# engine: before the mark of the map's published version moves and before the trace publishes.
_TERM_AFTER_THE_MAP_COMMIT = """
import os, signal
from kvtrace.transforms.ids import id_map
_publish = id_map.publish
def _commit_then_stop(*args, **kwargs):
    record = _publish(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    return record
id_map.publish = _commit_then_stop
"""


def test_a_stop_after_the_local_id_map_commit_never_says_nothing_was_published(
    tiny_tokenizer, tmp_path
):
    """Known open: a Beam id-map commit made in the child is not named after a stop. The local
    engine commits in the process that reports, yet its commit is no publication either
    (id_map.publish_night runs outside publish.publication, so published_here never records
    it, and no stop is deferred across commit -> anchor mark -> cleanup): a SIGTERM right after
    the commit says "stopped: nothing published" (exit 143) beside a map extended by a
    version (versions/000001.json) whose mark (--id-map-marks) never moved. An operator who
    believes the line may feed the map another night first; the line must name the map's
    version, as it names every output a stop leaves published."""
    out = tmp_path / "out"
    args = night_args(tmp_path, tiny_tokenizer, out, "--id-map", str(tmp_path / "map"))
    stopped = kvtrace_child(*args, prelude=_TERM_AFTER_THE_MAP_COMMIT, timeout=120)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    assert (tmp_path / "map" / "versions" / "000001.json").is_file()  # committed
    assert NOTHING not in _said(stopped), _said(stopped)
    assert f"published version 1 of the id map {tmp_path / 'map'} before the stop" in stopped.stderr


def test_a_run_refused_for_a_terminal_on_standard_input_makes_no_id_map_folder(
    tiny_tokenizer, tmp_path
):
    """Round 8 moved every check before the id map is opened ("a refused run leaves nothing
    behind": _open_id_map makes the map's folder). Standard input being a terminal is still
    checked after it, when it is spooled (decompress.spooled_standard_input, under the output's
    lock): `--input -` from a terminal is refused in one line, exit 2, and leaves a new, empty,
    owner-only id map folder behind (so does a run refused because another holds the output's
    lock, exit 1)."""
    args = night_args(tmp_path, tiny_tokenizer, tmp_path / "out", "--id-map", str(tmp_path / "map"))
    args[args.index("--input") + 1] = "-"
    terminal, typed_into = pty.openpty()
    try:
        refused = kvtrace_child(*args, stdin=typed_into, timeout=120)
    finally:
        os.close(terminal)
        os.close(typed_into)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "which is a terminal" in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "salt"]


# Where standard input's copy is, and its mode, as the run's own spool made it.
_NOTE_THE_SPOOL = """
import os
from kvtrace.transforms.read import decompress
_spool = decompress._spool
def _spool_and_note(*args, **kwargs):
    spooled = _spool(*args, **kwargs)
    with open(os.environ["ROUND9_SPOOL"], "w") as noted:
        noted.write(oct(os.stat(spooled).st_mode & 0o777))
    return spooled
decompress._spool = _spool_and_note
"""


def test_standard_inputs_copy_is_owner_only_from_its_first_byte(tiny_tokenizer, tmp_path):
    """storage: "private files are owner-only from their first byte (0600 in 0700 folders)".
    decompress._spool writes the copy of the private log with open(path, "wb"), the mode the
    umask leaves (0644; 0666 under umask 0), inside mkdtemp's 0700 folder: only the folder
    keeps others out. Every other private file kvtrace writes is 0600 whatever the umask
    (storage.create(private=True)); the spool, the largest and most private of them, is not."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    args = night_args(tmp_path, tiny_tokenizer, tmp_path / "out")
    args[args.index("--input") + 1] = "-"
    noted = tmp_path / "spool-mode"
    with open(tmp_path / "in.jsonl", "rb") as log:
        done = kvtrace_child(
            *args,
            prelude=_NOTE_THE_SPOOL,
            stdin=log,
            timeout=120,
            env={"TMPDIR": str(tmp), "ROUND9_SPOOL": str(noted)},
        )
    assert done.returncode == 0, _said(done)
    assert noted.read_text() == "0o600"


def test_a_race_lost_on_one_id_map_is_not_called_a_replaced_map(
    tiny_tokenizer, tmp_path, monkeypatch, capsys
):
    """Round 4 made a run told it lost a race check the map's version (check_not_extended)
    before its mark (check_anchor). The other run may commit between the two checks: the loser
    is then told the map "is not the map last published there ... it was replaced by another
    map ... run `kvtrace id-map rebind`", about a map that is whole, newest, and the one the
    marks name. An operator who follows the advice rebinds, turning off the one check that
    catches a map really replaced. A race lost must be told as such ("extended by another run
    ... one run per map at a time"), whichever check meets it first."""
    from kvtrace.cli import main
    from kvtrace.transforms.ids import id_map

    args = night_args(tmp_path, tiny_tokenizer, tmp_path / "oa", "--id-map", str(tmp_path / "map"))
    other = [a if a != str(tmp_path / "oa") else str(tmp_path / "ob") for a in args]
    real, raced = id_map.check_anchor, []

    def other_run_commits_between_the_checks(*check_args, **kwargs):
        if not raced:  # the other night commits once this one found the map not extended
            raced.append(None)  # the other run's own check passes straight through
            raced[0] = main(other)
        return real(*check_args, **kwargs)

    monkeypatch.setattr(id_map, "check_anchor", other_run_commits_between_the_checks)
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err
    assert raced == [0] and code != 0
    assert "rebind" not in err and "replaced by another map" not in err, err


# The OOM killer (SIGKILL) ends the run right after its trace was swapped in, before its letters
# are settled: the window docs/ANONYMIZE.md leaves to "the next run of that output".
_KILL_ONCE_THE_TRACE_IS_PUBLISHED = """
import os, signal
from kvtrace.transforms.write import publish
_publish_folder = publish.publish_folder
def _publish_then_die(staging, output, *args, **kwargs):
    _publish_folder(staging, output, *args, **kwargs)
    if os.path.basename(output) == "out":
        os.kill(os.getpid(), signal.SIGKILL)
publish.publish_folder = _publish_then_die
"""


def test_a_trace_published_whole_by_a_killed_run_passes_the_gate(tiny_tokenizer, tmp_path):
    """DeadLetterRun marks the output's staging folder with an extended attribute
    (user.kvtrace.run: run id, letters folder), which the swap publishes with it, and takes it
    off only after the letters are settled (settle_marked_letters -> _unmark). A run killed in
    between (docs: "completed by the next run of that output") leaves a whole trace, byte for
    byte what kvtrace writes, that `kvtrace audit` refuses: "FLAG the folder itself: extended
    attributes kvtrace does not set (user.kvtrace.run) ... NOT publishable", naming kvtrace's
    own mark as foreign. Nightly outputs are often dated (out-2026-11-27): a published night is
    not run again, so the night fails its gate for good, told something untrue. A folder
    kvtrace publishes should carry nothing the gate refuses from the moment it is published."""
    out = tmp_path / "out"
    killed = kvtrace_child(
        *night_args(tmp_path, tiny_tokenizer, out),
        prelude=_KILL_ONCE_THE_TRACE_IS_PUBLISHED,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (out / "manifest.json").is_file()  # published whole before the kill
    audited = kvtrace_child("audit", str(out), timeout=120)
    assert "extended attributes" not in audited.stdout + audited.stderr, audited.stdout[-2000:]
    assert audited.returncode == 0, audited.stdout[-2000:]


def test_a_run_refused_for_an_output_locked_by_another_makes_no_id_map_folder(
    tiny_tokenizer, tmp_path
):
    """The reproducer's other variant: another run holds the output's lock (taken after the
    map is opened), so the run is refused in one line; a new map's folder is made only by a
    run's first write into it (id_map.map_folder), so none is left."""
    from kvtrace.transforms.write.publish import output_lock

    out = tmp_path / "out"
    args = night_args(tmp_path, tiny_tokenizer, out, "--id-map", str(tmp_path / "map"))
    with output_lock(str(out)):
        refused = kvtrace_child(*args, timeout=120)
    assert refused.returncode == 1, refused.stderr[-2000:]
    assert "another kvtrace run is writing" in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "salt"]
