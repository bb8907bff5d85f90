"""A job run whole in a child process (the Beam engine's run): native code never runs in the
process that reports, so the child's death is that process's one-line error, and whatever the
job raises is raised there as it was."""

from __future__ import annotations

import faulthandler
import functools
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from helpers import ROOT
from kvtrace.pipelines import child_process
from kvtrace.pipelines.child_process import run_in_child
from kvtrace.transforms import storage
from kvtrace.transforms.errors import ConfigError, JobStopped
from kvtrace.transforms.write import publish

GONE_BOUND_S = 10.0  # a killed process is reaped at once; generous for a loaded machine


@pytest.fixture(params=["forked", "started clean"])
def start(request, monkeypatch):
    """Either way a child starts: forked where no other thread runs, else from a clean server."""
    busy = 0 if request.param == "forked" else 1
    monkeypatch.setattr(child_process, "busy_threads", lambda: busy)
    return request.param


def _write_pid(path: str) -> None:
    with open(path, "w") as handle:
        handle.write(str(os.getpid()))


def _refuse() -> None:
    raise ConfigError("a refusal the job makes")


class _HoldsALock(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.lock = threading.Lock()  # no pickle takes it


def _raise_unpicklable() -> None:
    raise _HoldsALock("the job failed holding a lock")


def _abort() -> None:
    """As the Rust tokenizer does when an allocation fails."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left behind
    faulthandler.disable()  # pytest's, inherited: it would print this child's stack
    os.write(2, b"memory allocation of 8 bytes failed\n")
    os.abort()


def test_the_job_runs_in_another_process(start, tmp_path):
    run_in_child(functools.partial(_write_pid, str(tmp_path / "pid")))
    assert int((tmp_path / "pid").read_text()) != os.getpid()


def test_the_jobs_value_is_returned_here(start):
    """What the Beam job's child staged comes back whole, for this process to publish."""
    assert run_in_child(functools.partial(dict, staged=[1, 2])) == {"staged": [1, 2]}


def test_a_job_that_dies_after_its_work_returns_nothing(tmp_path):
    """A child gone before its outcome is sent: its death, never a value taken for success."""
    with pytest.raises(JobStopped, match="died by SIGKILL"):
        run_in_child(functools.partial(_work_then_die, str(tmp_path / "pid")))
    assert (tmp_path / "pid").is_file()  # its work was done: only the word was missing


def _work_then_die(path: str) -> dict:
    _write_pid(path)
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


@pytest.mark.parametrize(
    ("written", "said"),
    [
        (None, ""),  # killed before its step: nothing stands
        (b"the record", "version 1 of the map"),  # killed once its step stands
        (b"another run's record", ""),  # the path holds what it did not intend
    ],
)
def test_a_child_killed_inside_a_publication_is_told_by_what_its_step_left(
    start, monkeypatch, tmp_path, written, said
):
    """The child tells its step before taking it (publish.intend); killed at any point after,
    it is named here exactly when the path holds the bytes it intended, never otherwise."""
    monkeypatch.setattr(publish, "_PUBLISHED_HERE", publish._Published())
    job = functools.partial(_intend_then_die, str(tmp_path / "record"), written, settle=False)
    with pytest.raises(JobStopped, match="died by SIGKILL"):
        run_in_child(job)
    assert publish.published_here() == said


def test_a_step_the_child_settled_is_named_once(start, monkeypatch, tmp_path):
    """A publication that ended in the child told its names: its intended step is settled, so
    a death after it does not name it again."""
    monkeypatch.setattr(publish, "_PUBLISHED_HERE", publish._Published())
    job = functools.partial(_intend_then_die, str(tmp_path / "record"), b"the record", settle=True)
    with pytest.raises(JobStopped, match="died by SIGKILL"):
        run_in_child(job)
    assert publish.published_here() == "version 1 of the map"


def _intend_then_die(path: str, written: bytes | None, settle: bool) -> None:
    with publish.publication() as published:
        publish.intend("version 1 of the map", path, b"the record")
        if written is not None:
            with open(path, "wb") as handle:
                handle.write(written)
        if not settle:
            os.kill(os.getpid(), signal.SIGKILL)
        published.append("version 1 of the map")
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("ending", ["fails", "dies"])
def test_a_folder_the_child_made_goes_with_a_run_that_publishes_nothing(start, tmp_path, ending):
    """The child tells each folder it makes before making it (storage.forward_folders): a run
    that raises removes it as its own, however the child ended; one already there stays."""
    (tmp_path / "there").mkdir()
    nested = tmp_path / "there" / "maps" / "m"
    with pytest.raises(JobStopped if ending == "dies" else ConfigError), storage.run_folders():
        run_in_child(functools.partial(_make_then_end, str(nested), ending))
    assert nested.is_dir() is False
    assert [p.name for p in tmp_path.iterdir()] == ["there"]
    assert list((tmp_path / "there").iterdir()) == []


def test_a_folder_the_child_made_stays_with_a_run_that_publishes(start, tmp_path):
    nested = tmp_path / "maps" / "m"
    with storage.run_folders():
        run_in_child(functools.partial(storage.make_folder, str(nested)))
    assert nested.is_dir()


def _make_then_end(path: str, ending: str) -> None:
    storage.make_folder(path)
    if ending == "dies":
        os.kill(os.getpid(), signal.SIGKILL)
    raise ConfigError("the night failed after making its folders")


def test_the_jobs_error_is_raised_here_as_it_was_with_its_traceback_noted(start):
    with pytest.raises(ConfigError, match="a refusal the job makes") as raised:
        run_in_child(_refuse)
    assert "_refuse" in "\n".join(raised.value.__notes__)  # seen with --verbose


def test_an_error_that_cannot_travel_is_said_in_its_words():
    with pytest.raises(RuntimeError) as raised:
        run_in_child(_raise_unpicklable)
    assert str(raised.value) == "_HoldsALock: the job failed holding a lock"


def test_an_abort_is_a_one_line_stop_and_this_process_lives_to_say_it():
    with pytest.raises(JobStopped) as stopped:
        run_in_child(_abort)
    message = JobStopped.message_in(stopped.value)
    assert message is not None and message.startswith("a worker process died by SIGABRT")
    assert "\n" not in message


def _state(pid: int) -> str | None:
    """A process's state letter (Z: ended, not yet reaped); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0].decode()
    except OSError:
        return None


def _wait_until(condition, bound_s: float = GONE_BOUND_S) -> bool:
    deadline = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)  # polling a condition, bounded
    return True


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_the_child_ends_when_its_parent_is_killed(tmp_path):
    """SIGKILL (the OOM killer, a scheduler) gives the parent no chance to end its child: the
    kernel does (PR_SET_PDEATHSIG), so no job goes on publishing for a process that is gone."""
    pid_file = tmp_path / "pid"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import functools, signal, sys\n"
            "from kvtrace.pipelines.child_process import run_in_child\n"
            "def job(path):\n"
            "    open(path + '.tmp', 'w').write(str(__import__('os').getpid()))\n"
            "    __import__('os').rename(path + '.tmp', path)\n"
            "    signal.pause()\n"
            "run_in_child(functools.partial(job, sys.argv[1]))\n",
            str(pid_file),
        ],
        cwd=ROOT,
    )
    try:
        assert _wait_until(pid_file.exists, 120.0), "the child never started"
        child = int(pid_file.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait(GONE_BOUND_S)
        assert _wait_until(lambda: _state(child) in (None, "Z")), "the child outlived its parent"
    finally:
        parent.kill()
        parent.wait()


def test_a_scratch_folder_nobody_holds_is_cleared_and_a_held_one_stays(tmp_path):
    """A killed run's scratch folder (its finally block never ran) is the next run's to clear;
    a living run's is held (storage.held), in whatever PID namespace it runs."""
    left = tmp_path / f"{child_process.SCRATCH_PREFIX}abc"
    (left / "beam-temp").mkdir(parents=True)
    (tmp_path / "kvtrace-jobs-not-ours").mkdir()
    living = functools.partial(tempfile.mkdtemp, prefix=child_process.SCRATCH_PREFIX, dir=tmp_path)
    with storage.held(living) as scratch:
        child_process._clear_scratch(str(tmp_path))
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [os.path.basename(scratch), "kvtrace-jobs-not-ours"]
        )


def _environment_variable(name: str) -> str | None:
    return os.environ.get(name)


def test_the_job_sees_this_process_s_environment_as_it_is_now(start, monkeypatch):
    """A clean start comes from a server that took this process's environment when it started
    (an earlier job's): a salt given in the environment since must reach the job too."""
    child_process.run_in_child(functools.partial(_environment_variable, "HOME"))  # server up
    monkeypatch.setenv("KVTRACE_TEST_SET_LATER", "set-later")
    job = functools.partial(_environment_variable, "KVTRACE_TEST_SET_LATER")
    assert child_process.run_in_child(job) == "set-later"
