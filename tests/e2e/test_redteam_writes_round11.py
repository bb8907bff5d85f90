"""Red team round 11, writes, stops and crashes: reproducers of holes left after the tenth
round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A stop is injected as an operator sends it (a prelude wraps one of kvtrace's own steps and
signals right before or after it); the CLI's own handlers then do what they do. Where the test
must act at that moment (close the reader of the run's stderr), the prelude and the test meet
on pipes, never on time."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

import pytest

from helpers import ROOT, kvtrace_child, night_args

pytestmark = pytest.mark.slow
_MAIN = "import sys\nfrom kvtrace.cli import main\nsys.exit(main(sys.argv[1:]))"
# How long a stopped run is given to end: its deadline (cli.STOP_DEADLINE_S, 1.5 s) and more.
ENDED_S = 10


# Ctrl-C (SIGINT) as the night's trace is about to be published. The prelude first tells the
# test it is there (READY) and waits for the test's word (GO), so that the test can close the
# reader of the run's stderr first: `kvtrace ... 2>&1 | tee night.log`, where the terminal's
# Ctrl-C ends tee (the same process group) at once. With STALL, the publication then waits
# on a disk that does not answer (a hung NFS server: the test's HOLD pipe, closed by the test
# once it has seen whether the run ended by its deadline).
_STOP_AS_THE_TRACE_IS_PUBLISHED = """
import os, select, signal
from kvtrace.transforms.write import publish
_publish_folder = publish.publish_folder
def _stop_then_publish(*args, **kwargs):
    os.write(int(os.environ["ROUND11_READY"]), b"r")
    select.select([int(os.environ["ROUND11_GO"])], [], [])
    os.kill(os.getpid(), signal.SIGINT)
    if os.environ.get("ROUND11_STALL"):
        select.select([int(os.environ["ROUND11_HOLD"])], [], [])
    return _publish_folder(*args, **kwargs)
publish.publish_folder = _stop_then_publish
"""


def _stopped_with_its_stderr_gone(night: list[str], stall: bool) -> tuple[int | None, bool]:
    """The night run with stderr into a pipe whose reader leaves as the stop comes; its exit
    code (None: still running ENDED_S after the stop) and whether it was still running."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    hold_r, hold_w = os.pipe()
    said_r, said_w = os.pipe()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "ROUND11_READY": str(ready_w),
        "ROUND11_GO": str(go_r),
        "ROUND11_HOLD": str(hold_r),
        **({"ROUND11_STALL": "1"} if stall else {}),
    }
    run = subprocess.Popen(
        [sys.executable, "-c", f"{_STOP_AS_THE_TRACE_IS_PUBLISHED}\n{_MAIN}", *night],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=said_w,
        stderr=said_w,
        env=env,
        pass_fds=(ready_w, go_r, hold_r),
    )
    for end in (said_w, ready_w, go_r, hold_r):
        os.close(end)
    try:
        while ready_r not in select.select([said_r, ready_r], [], [])[0]:
            os.read(said_r, 1 << 16)  # the log, read as tee reads it
        os.close(said_r)  # tee is gone: the same Ctrl-C ended it
        os.write(go_w, b"g")
        try:
            return run.wait(timeout=ENDED_S), False
        except subprocess.TimeoutExpired:
            return None, True
    finally:
        os.close(hold_w)  # the stalled disk answers: a run still there goes on
        for end in (ready_r, go_w):
            os.close(end)
        if run.poll() is None:
            run.kill()
        run.wait()


def test_a_stop_ends_by_its_deadline_when_its_stderr_is_gone(tiny_tokenizer, tmp_path):
    """cli._Stop: a stop is "bounded": past STOP_DEADLINE_S the watcher thread ends the process
    whatever the main thread waits on (_Stop.end: the publication put back, the leftovers
    removed, a line said, os._exit). The line comes before os._exit, unguarded: where stderr
    cannot be written, the print raises (BrokenPipeError: `kvtrace ... 2>&1 | tee log`, whose
    tee the same Ctrl-C ended; EIO: the terminal of a dropped ssh session, which sends the
    SIGHUP), the watcher thread dies of it and os._exit never runs. The run then waits on for
    as long as the wait that the deadline exists for (a stalled NFS write: forever), holding
    its output's lock, so that the next night is refused too ("another kvtrace run is writing
    OUT"). With the terminal alive the same run ends at the deadline (exit 130); the deadline
    must not depend on stderr being writable."""
    out = tmp_path / "out"
    code, running = _stopped_with_its_stderr_gone(night_args(tmp_path, tiny_tokenizer, out), True)
    assert not running, f"still running {ENDED_S} s after its stop"
    assert code == 128 + signal.SIGINT
    assert not out.exists()


def test_a_stop_exits_130_when_its_stderr_is_gone(tiny_tokenizer, tmp_path):
    """The same stop without the stalled disk: the run unwinds in its main thread, whose line
    and whose exit's flush of the gone stderr fail (Python's exit code for that is 120). A
    stop's exit code says the stop, whatever the stream's state. (The stop came inside the
    publication, which defers it to its end: the trace is published whole.)"""
    out = tmp_path / "out"
    code, running = _stopped_with_its_stderr_gone(night_args(tmp_path, tiny_tokenizer, out), False)
    assert not running, f"still running {ENDED_S} s after its stop"
    assert code == 128 + signal.SIGINT
    assert (out / "manifest.json").is_file()


# A Beam night that waits, once its job's child has started (its scratch folder made), for the
# test's word: another run starts meanwhile.
_WAIT_ONCE_THE_JOB_STARTED = """
import os, select
from kvtrace.pipelines import anonymize_beam
_cli = os.getpid()
_run_here = anonymize_beam._run_here
def _wait_then_run(*args, **kwargs):
    if os.getpid() != _cli:
        os.write(int(os.environ["ROUND11_READY"]), b"r")
        select.select([int(os.environ["ROUND11_GO"])], [], [])
    return _run_here(*args, **kwargs)
anonymize_beam._run_here = _wait_then_run
"""

# A Beam run whose job fails at once (any run that gets as far as starting its job's child).
_FAIL_THE_JOB = """
from kvtrace.pipelines import anonymize_beam
def _fail(*args, **kwargs):
    raise ValueError("round 11: this run's job ends here")
anonymize_beam._run_here = _fail
"""


def _in_a_pid_namespace() -> list[str]:
    """The command prefix that runs a process in a PID namespace of its own (as a container
    does), sharing this one's file systems; skips the test where none can be made."""
    prefix = ["unshare", "--pid", "--fork", "--mount-proc"]
    if os.geteuid() != 0:
        prefix[1:1] = ["--user", "--map-root-user"]
    try:
        made = subprocess.run([*prefix, "true"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        made = None
    if made is None or made.returncode != 0:
        pytest.skip("no PID namespace can be made here")
    return prefix


@pytest.mark.beam
def test_a_run_never_removes_a_living_runs_job_folder(tiny_tokenizer, tmp_path):
    """child_process: the Beam engine's child keeps its temporary files in a folder named by
    its owner, kvtrace-job-PID-START-*, "removed ... by the next run if this process is killed
    (its name records its owner: pid and start time)", and "a living run's stay"
    (_clear_scratch). The owner is judged alive by /proc/PID/stat of the run that clears, so a
    run whose PID namespace is another (a container: Docker with `-v /tmp:/tmp`, a pod with a
    hostPath /tmp, a CI runner's job containers on one host, each run as the same user) is
    taken for dead: its pid is not there, or is another process. The next Beam run to start
    anywhere on the machine removes the living run's folder under it, and the living run
    fails (`error: [Errno 2] No such file or directory: '.../kvtrace-job-.../beam-pipeline-
    temp...'`, exit 2, as if refused before it started), its night lost. A run must remove only
    what it can tell is dead (its owner's pid visible and gone; a lock the owner holds, taken
    by the clearer only once released)."""
    tmp = tmp_path / "tmp"  # the /tmp both see
    tmp.mkdir()
    prefix = _in_a_pid_namespace()
    living, other = tmp_path / "living", tmp_path / "other"
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "TMPDIR": str(tmp),
        "ROUND11_READY": str(ready_w),
        "ROUND11_GO": str(go_r),
    }
    night = night_args(tmp_path, tiny_tokenizer, living, "--engine", "beam")
    run = subprocess.Popen(
        [*prefix, sys.executable, "-c", f"{_WAIT_ONCE_THE_JOB_STARTED}\n{_MAIN}", *night],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        pass_fds=(ready_w, go_r),
    )
    os.close(ready_w)
    os.close(go_r)
    try:
        assert os.read(ready_r, 1) == b"r"
        other_night = night_args(tmp_path, tiny_tokenizer, other, "--engine", "beam")
        failed = subprocess.run(
            [sys.executable, "-c", f"{_FAIL_THE_JOB}\n{_MAIN}", *other_night],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={k: v for k, v in env.items() if not k.startswith("ROUND11_")},
        )
        assert "round 11: this run's job ends here" in failed.stderr, failed.stderr[-1000:]
        os.write(go_w, b"g")
        _, said = run.communicate(timeout=120)
        assert run.returncode == 0, said.decode()[-1000:]
        assert (living / "manifest.json").is_file()
    finally:
        os.close(ready_r)
        os.close(go_w)
        if run.poll() is None:
            run.kill()
            run.wait()


# The folder of marks (`--id-map-marks`, often a small volume of its own, or the salt's) is full
# as the night's commit marks the map's new version: after the version's record was created.
_MARKS_FULL = """
import errno
from kvtrace.transforms.ids import anchor
def _full(path, data):
    raise OSError(errno.ENOSPC, "No space left on device")
anchor.replace_file = _full
"""


def test_a_night_that_fails_inside_its_id_map_commit_says_the_map_was_extended(
    tiny_tokenizer, tmp_path
):
    """NIGHTLY.md: "A failure after the commit ... says it too: `error: ...; published version
    N of the id map MAP before the failure`". Round 10 made a failure after the commit's
    publication say it (what the publication recorded once whole). A failure inside it, past
    the commit point, says nothing: the commit's publication is the record created
    (exclusive.create_exclusive), then CURRENT, the mark's advance (anchor.advance_anchor) and
    the cleanup; storage running out for the mark (or CURRENT) fails the publication, which
    records nothing when it fails (publish._publication notes names only once it ends whole;
    its standing, which reads the map, is read only by a hard end). The run says `error: the
    job failed: [Errno 28] No space left on device`, the line of a night that changed nothing,
    beside a map holding version 1 (readers follow committed versions past CURRENT) and no
    trace. What a failed publication leaves standing must be said as a hard end's is."""
    out, id_map = tmp_path / "out", tmp_path / "map"
    night = night_args(tmp_path, tiny_tokenizer, out)
    night += ["--id-map", str(id_map), "--id-map-marks", str(tmp_path / "marks")]
    failed = kvtrace_child(*night, prelude=_MARKS_FULL, timeout=120)
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert not out.exists()
    assert (id_map / "versions" / "000001.json").is_file()  # committed: the night is the map's
    said = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert said and f"version 1 of the id map {id_map}" in said[-1], said


# The output's disk fails as the night is published (EIO: a dying disk, a dropped NFS mount).
_DISK_FAILS_AS_THE_TRACE_IS_PUBLISHED = """
import errno
from kvtrace.transforms.write import publish
def _fail(*args, **kwargs):
    raise OSError(errno.EIO, "Input/output error")
publish.publish_folder = _fail
"""


def test_an_error_of_the_system_mid_job_is_a_job_that_stopped(tiny_tokenizer, tmp_path):
    """ANONYMIZE.md: "A job that fails for any other reason ... prints one line and exits 1";
    exit 2 is a run refused before it started. An OSError other than storage running out was
    exit 2 wherever it came, a night that had done all its work read as one refused by its
    checks. Once the run holds its output's lock every check is behind it."""
    out = tmp_path / "out"
    failed = kvtrace_child(
        *night_args(tmp_path, tiny_tokenizer, out),
        prelude=_DISK_FAILS_AS_THE_TRACE_IS_PUBLISHED,
        timeout=120,
    )
    assert failed.returncode == 1, failed.stderr[-2000:]
    said = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert said == ["error: the job failed: [Errno 5] Input/output error"], said
    assert not out.exists()
