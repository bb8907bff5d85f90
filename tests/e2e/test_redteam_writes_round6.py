"""Red team round 6, the write protocol, stops and readers: reproducers of holes left after the
fifth round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A stop is injected as a terminal sends it: SIGINT to the process itself, at a chosen moment of
the run (a prelude wraps one of kvtrace's own steps and signals right before or after it); the
CLI's own handler then does what it does for a Ctrl-C at that moment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, chat, kvtrace_child, write_jsonl

pytestmark = pytest.mark.slow
ROUND6 = "red team round 6"
NOTHING = "stopped: nothing published"
TRACE = [
    {
        "timestamp": 1000 * i + 37 * (i % 3),
        "input_length": 4 * (2 + i % 3) - 1,
        "output_length": 3,
        "hash_ids": [1, 2 + i % 2] + [100 + 10 * i + j for j in range(i % 3)],
    }
    for i in range(12)
]


def _said(done: subprocess.CompletedProcess) -> list[str]:
    """What the run said on stderr, its progress log (INFO lines, transformers') aside."""
    return [
        line
        for line in done.stderr.splitlines()
        if " INFO " not in line and "PyTorch was not found" not in line
    ]


def _night(tmp_path: Path, tokenizer: str, n: int, start_ms: int = 0) -> list[str]:
    """An anonymize run's arguments on a log of n chats (from start_ms) and two lines that are
    dead letters."""
    src = write_jsonl(
        tmp_path / f"in{n}.jsonl",
        [chat(i, start_ms + 1000 * i) for i in range(n)] + [b"{broken", b"[]"],
    )
    salt = tmp_path / "salt"
    salt.write_text("round-six-salt-of-thirty-two-by!")
    return [
        "--input",
        str(src),
        "--tokenizer",
        tokenizer,
        "--block-size",
        "4",
        "--salt-file",
        str(salt),
        "--processes",
        "1",
    ]


# Ctrl-C once the trace is published, while the run tidies up (the first thing anonymize does
# after its work returns is remove its staging folder: that is where the signal lands).
_STOP_WHILE_TIDYING_UP = """
import os, signal, time
from kvtrace.pipelines import anonymize_night
from kvtrace.transforms import storage
_published = []
_publish = anonymize_night.publish_folder
def _publish_and_note(*args, **kwargs):
    _publish(*args, **kwargs)
    _published.append(True)
anonymize_night.publish_folder = _publish_and_note
_remove = storage.remove_folder
def _stop_then_remove(path):
    if _published:
        _published.clear()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    _remove(path)
storage.remove_folder = _stop_then_remove
"""


def test_a_stop_once_the_output_is_published_never_loses_its_dead_letters(tiny_tokenizer, tmp_path):
    """A Ctrl-C that lands after anonymize published its output, in the finally block that
    removes the staging folder (kvtrace/commands/anonymize.py run: `storage.remove_folder(
    config.staging)`), skips the rest of that block, so `letters.settle` never runs; the CLI
    then ends the process through _Stop.end, whose publish.abandon_staged removes every staging
    name the run made up, the letters' staging folder included. The published output still
    carries its run mark naming those letters, but they are gone: the next run settles the
    mark, finds nothing, and the night's two rejected records are neither exported nor
    dead-lettered (and the run said "stopped: nothing published"). Before abandon_staged, the
    letters stayed staged and the next run published them (settle_marked_letters).
    Found at steps 33-34 of a stop at every step (and past the deadline at the same steps)."""
    night = _night(tmp_path, tiny_tokenizer, 6)
    out, dead = tmp_path / "out", tmp_path / "out-rejected"
    stopped = kvtrace_child(
        "anonymize", *night, "--output", str(out), prelude=_STOP_WHILE_TIDYING_UP
    )
    assert stopped.returncode == 130, stopped.stderr[-2000:]
    assert (out / "manifest.json").is_file()  # the stopped run's output stands, published
    again = kvtrace_child("anonymize", *night, "--output", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    letters = sorted(dead.glob("rejected-*.jsonl"))
    # One file per run that published the night: the stopped run's and the rerun's.
    assert len(letters) == 2, [p.name for p in letters]


# Ctrl-C right after a publication's renames (as a signal arriving during the last rename is
# raised when the call returns).
_STOP_AFTER_PUBLISHING = """
import os, signal, time
from kvtrace.transforms.write import publish
_publish = publish.publish_in_place
def _publish_then_stop(*args, **kwargs):
    _publish(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(1)
publish.publish_in_place = _publish_then_stop
"""


@pytest.mark.parametrize("command", ["anonymize", "analyze", "convert", "export"])
def test_a_stop_after_the_output_is_published_never_says_nothing_was(
    tiny_tokenizer, tmp_path, command
):
    """The CLI says "stopped: nothing published" for every stop unless the command set
    args.stop_leaves, which only anonymize does, and only once its run has returned
    (kvtrace/cli.py _Stop.end, STOPPED; anonymize.py `args.stop_leaves = ... published`). A
    Ctrl-C after the publication's renames and before that line (while the previous output is
    removed, the staging folder tidied, the letters settled, the lock let go, a summary
    printed) exits 130 with "stopped: nothing published" beside a freshly published output:
    an operator told nothing was published re-runs, or ships the old one's copy believing it
    current. Seen on every command, naturally too (a Ctrl-C timed at the manifest's arrival,
    --engine beam: "stopped: nothing published", the output and its letters published)."""
    trace = write_jsonl(tmp_path / "t.jsonl", TRACE)
    if command == "anonymize":
        night = _night(tmp_path, tiny_tokenizer, 6)
        args, out = ["anonymize", *night, "--output", str(tmp_path / "out")], tmp_path / "out"
    elif command == "analyze":
        out = tmp_path / "out"
        args = ["analyze", str(trace), "--block-size", "4", "--output", str(out)]
    elif command == "convert":
        bailian = write_jsonl(
            tmp_path / "b.jsonl",
            [
                {
                    "chat_id": i,
                    "parent_chat_id": -1,
                    "timestamp": float(i),
                    "input_length": 32,
                    "output_length": 5,
                    "hash_ids": [1, 2 + i],
                }
                for i in range(3)
            ],
        )
        out = tmp_path / "out"
        args = ["convert", "-o", str(out), str(bailian)]
    else:
        out = tmp_path / "out.jsonl"
        args = ["export", str(trace), "--to", "dynamo", "--block-size", "4", "--overwrite"]
        args += ["-o", str(out)]
    stopped = kvtrace_child(*args, prelude=_STOP_AFTER_PUBLISHING)
    assert stopped.returncode == 130, stopped.stderr[-2000:]
    assert out.exists()  # published whole by the stopped run
    assert NOTHING not in _said(stopped), _said(stopped)


# Ctrl-C during the n-th atomic swap of a publication: the swap is made, and the signal is
# raised as the call returns (CPython runs a handler when a call returns to the eval loop).
_STOP_DURING_SWAP = """
import os, signal, time
from kvtrace.transforms.write import publish
_exchange = publish._exchange
_calls = []
def _exchange_then_stop(first, second):
    swapped = _exchange(first, second)
    _calls.append(second)
    if len(_calls) == {n}:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    return swapped
publish._exchange = _exchange_then_stop
"""


@pytest.mark.parametrize("swap", [1, 2], ids=["during-the-outputs-swap", "during-the-reports"])
def test_a_stop_during_a_publication_publishes_the_output_and_its_report_together(tmp_path, swap):
    """`analyze T --output DIR --json R` publishes DIR and R together (publish_in_place: each
    move swapped in, then recorded in `done` so a failure puts every recorded one back). A
    KeyboardInterrupt raised as a swap's call returns (_swap_in returned, `done.append` not
    yet run) unwinds through `except BaseException` with that move unrecorded: it is never
    put back. Stopped during the output's swap: DIR new, R the previous run's. During the
    report's: DIR is put back to the previous output but R stays new: the report, which a
    reader takes for the mark that its output is whole, describes an output that was never
    published. Both times the CLI says "stopped: nothing published" (exit 130). Both or
    neither, whatever the moment of the stop."""
    first = write_jsonl(tmp_path / "first.jsonl", TRACE[:7])
    second = write_jsonl(tmp_path / "second.jsonl", TRACE)
    out, report = tmp_path / "out", tmp_path / "report.json"
    flags = ["--block-size", "4", "--output", str(out), "--json", str(report)]
    assert kvtrace_child("analyze", str(first), *flags).returncode == 0
    before = (report.read_bytes(), (out / "analysis.json").read_bytes())
    stopped = kvtrace_child(
        "analyze", str(second), *flags, prelude=_STOP_DURING_SWAP.format(n=swap)
    )
    assert stopped.returncode == 130, stopped.stderr[-2000:]
    report_new = report.read_bytes() != before[0]
    output_new = (out / "analysis.json").read_bytes() != before[1]
    assert report_new == output_new, f"report new: {report_new}, output new: {output_new}"


def test_a_file_output_by_a_lock_name_never_lets_two_runs_write_one_output(tmp_path):
    """Round 5 refused kvtrace's lock names for folder outputs (check_written: a folder there
    would stop every run) but keeps them for file outputs: "a file there is taken as it stands
    (it locks all the same)". It does not: a file output is published by renaming a new file
    over the name, and flock(2) locks an inode, not a name. While a run of OUT holds
    .OUT.kvtrace-lock, `export T -o .OUT.kvtrace-lock --overwrite` (or any --json report by
    that name) renames a new inode there; the next run of OUT opens and locks that one, finds
    nobody holding it, and runs beside the first: "one run per output at a time" gone (its
    restore_interrupted then clears the first run's staging folder as a killed run's)."""
    from kvtrace.cli import main
    from kvtrace.transforms.write.publish import output_lock

    trace = write_jsonl(tmp_path / "t.jsonl", TRACE)
    out = tmp_path / "OUT"
    with output_lock(str(out)):  # a run of OUT, under way
        lock = tmp_path / ".OUT.kvtrace-lock"
        code = main(
            ["export", str(trace), "--to", "dynamo", "--block-size", "4"]
            + ["-o", str(lock), "--overwrite"]
        )
        assert code in (0, 2)
        second = kvtrace_child("analyze", str(trace), "--block-size", "4", "--output", str(out))
        assert second.returncode != 0 and "another kvtrace run is writing" in second.stderr, _said(
            second
        )


def test_beam_synthesize_publishes_every_row_whatever_the_outputs_name(tmp_path):
    """`synthesize T -o 'syn[ab].jsonl' --engine beam` says "output: .../syn[ab].jsonl
    (valid)" (exit 0) and publishes an EMPTY trace, where the local engine publishes its 12
    rows: pipelines/synthesize_beam.py gathers the parts its pipeline wrote with
    storage.match(storage.join(parts_dir, "*.jsonl")), a glob of a folder named after the
    output (its staging name + ".parts"), so `[ab]` in the output's name makes it match
    nothing (a bracket is a class, not itself). The rows are lost, the engines differ, and the
    summary (its "after" analysis of the empty staged file) calls it valid."""
    from kvtrace.cli import main

    trace = write_jsonl(tmp_path / "t.jsonl", TRACE)
    common = ["synthesize", str(trace), "--block-size", "4", "--seed", "1"]
    assert main([*common, "-o", str(tmp_path / "local")]) == 0
    name = "syn[ab]"  # a derived trace's folder at block size 4
    done = kvtrace_child(*common, "-o", str(tmp_path / name), "--engine", "beam")
    assert done.returncode == 0, done.stderr[-2000:]
    for part in ("trace-00000-of-00001.jsonl", "manifest.json"):
        assert (tmp_path / name / part).read_bytes() == (tmp_path / "local" / part).read_bytes()


# The disk fills as the --json report is written (its staged copy's bytes).
_FULL_DISK_AT_THE_REPORT = """
import errno, os
from kvtrace.transforms.write import publish
_write = publish.StagedFile.write
def _write_or_fill(self, data):
    if self.output.endswith("report.json"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    _write(self, data)
publish.StagedFile.write = _write_or_fill
"""


@pytest.mark.parametrize("command", ["export", "render"])
def test_an_export_or_render_and_its_json_report_are_published_together(
    tiny_tokenizer, tmp_path, command
):
    """Round 2 made synthesize and analyze stage their --json report and publish it with the
    output (file_output's report); export and render still publish the output first and only
    then write the report as a second publication (kvtrace/commands/replay.py export / run:
    `write_json_report(args.json, ...)` after run_export / run_render returned). A full disk
    (or a stop, or a kill) while the report is written: "error: the job failed: [Errno 28] No
    space left on device" (exit 1), and yet the new output is published beside the previous
    run's report, which describes other rows. Both or neither."""
    first = write_jsonl(tmp_path / "first.jsonl", TRACE[:7])
    second = write_jsonl(tmp_path / "second.jsonl", TRACE)
    out, report = tmp_path / "out.jsonl", tmp_path / "report.json"
    if command == "export":
        flags = ["--to", "dynamo", "--block-size", "4", "--overwrite"]
    else:
        flags = ["--tokenizer", tiny_tokenizer, "--block-size", "4", "--no-verify"]
    flags += ["-o", str(out), "--json", str(report)]
    assert kvtrace_child(command, str(first), *flags).returncode == 0
    before = (out.read_bytes(), report.read_bytes())
    failed = kvtrace_child(command, str(second), *flags, prelude=_FULL_DISK_AT_THE_REPORT)
    assert failed.returncode == 1 and "No space left" in failed.stderr, failed.stderr[-2000:]
    assert (out.read_bytes(), report.read_bytes()) == before, "the output was published alone"


@pytest.mark.parametrize("command", ["analyze", "reuse", "synthesize"])
def test_beams_trace_commands_read_an_input_whose_name_is_not_utf8(tmp_path, command):
    """Round 5 carried names that are not UTF-8 through Beam's anonymize (--input) and
    synthesize (-o); the trace readers of analyze, reuse and synthesize on --engine beam still
    put the input names in a PCollection (transforms/stats/steps.py ReadTraceFiles:
    `beam.Create(list(enumerate(self._files)))`, encoded as UTF-8): `analyze b'in\\xff.jsonl'
    --engine beam` exits 2 with "error: 'utf-8' codec can't encode character '\\udcff' ...:
    surrogates not allowed" where the local engine reads the same file. Same input, same
    result, whatever the engine."""
    trace = write_jsonl(tmp_path / "t.jsonl", TRACE)
    odd = os.fsencode(str(tmp_path)) + b"/in\xff.jsonl"
    Path(os.fsdecode(odd)).write_bytes(trace.read_bytes())
    args = [command, odd, "--block-size", "4", "--engine", "beam"]
    if command == "synthesize":
        args += ["-o", str(tmp_path / "s")]
    done = subprocess.run(
        [sys.executable, "-m", "kvtrace.cli", *args],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONIOENCODING": "utf-8", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]


# A kill (SIGKILL, power cut) right after the plan made its rename-proof folder.
_KILL_WHILE_PLANNING = """
import os
from kvtrace.transforms.write import publish
_mkdir = os.mkdir
def _mkdir_then_die(path, *args, **kwargs):
    _mkdir(path, *args, **kwargs)
    if publish.STAGING_MARK in os.fsdecode(path):
        os._exit(137)
publish.os.mkdir = _mkdir_then_die
"""


def test_a_run_killed_while_planning_leaves_nothing_its_reruns_do_not_clear(tmp_path):
    """prove_folder_rename proves a folder can be renamed "in the nearest existing folder on
    its way" by making and renaming a staging folder named after the first missing name: for
    `--output K/a/b/out` with K/a missing, K/.a.kvtrace-staging-ID. Its docstring: "one a
    killed run leaves is cleared as any staging leftover"; but leftovers are cleared only by
    a run of the output that name stems from (restore_interrupted of K/a), never by a run of
    K/a/b/out, whose lock sits in K/a/b. Killed there, every rerun of the same command
    succeeds and the hidden folder stays in K for good (the crash-point harness never sees
    it: its outputs' parents exist)."""
    trace = write_jsonl(tmp_path / "t.jsonl", TRACE)
    work = tmp_path / "K"
    work.mkdir()
    args = ["analyze", str(trace), "--block-size", "4", "--output", str(work / "a" / "b" / "out")]
    killed = kvtrace_child(*args, prelude=_KILL_WHILE_PLANNING)
    assert killed.returncode == 137, killed.stderr[-2000:]
    for _ in range(2):
        assert kvtrace_child(*args).returncode == 0
    left = [str(p.relative_to(work)) for p in work.rglob("*") if ".kvtrace-staging-" in p.name]
    assert left == []


def test_an_id_map_whose_folder_name_has_a_bracket_is_continued_by_the_next_night(
    tiny_tokenizer, tmp_path
):
    """transforms/ids/id_map.py lists a map's versions and segments with storage.match, a
    glob, of a path that starts with the map's own folder: `--id-map 'maps/m[1]'` makes
    `[1]` a character class that matches "1", not itself. Night 1 commits version 1 whole;
    night 2 then finds no version and refuses the map: "error: the id map .../m[1] has lost
    committed versions (versions/000001.json missing): its ids cannot be continued safely.
    Restore versions/ and CURRENT from a backup" (exit 2). The map is whole; no night on it
    ever runs again, and the operator is sent to restore a backup of nothing lost."""
    id_map = tmp_path / "m[1]"
    for n in (1, 2):  # two nights, two logs (a night run again leaves the map unchanged)
        night = _night(tmp_path, tiny_tokenizer, 5 + n, start_ms=100_000 * n)  # nights follow
        done = kvtrace_child(
            "anonymize", *night, "--output", str(tmp_path / f"out{n}"), "--id-map", str(id_map)
        )
        assert done.returncode == 0, _said(done)
    assert (id_map / "versions" / "000002.json").is_file()
