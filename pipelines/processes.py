"""The processes this one started, and theirs, found in /proc: a stopped run ends them all, so
that none outlives it (the local engine's workers, Beam's SDK workers, a job server Beam
launched, multiprocessing's helpers), whichever library started them. A killed run cannot end
them: each process kvtrace starts ends itself with the run (end_with_parent). And the one list
of the signals that stop a run."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import threading
import time

from kvtrace.transforms.encode.native_stderr import QUIET_ATTRIBUTE

PROC = "/proc"
# Time a process is given to end on SIGTERM before SIGKILL (one that ignores SIGTERM, such as
# multiprocessing's resource tracker, waits this long).
END_GRACE_S = 0.3
POLL_S = 0.02
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# What stops a run, in every process that handles or holds them: Ctrl-C, a stop from outside
# (kill, a scheduler), and a hang-up (a closed terminal, a dropped ssh session), whose default
# action would end the process past every finally block and the hard end's cleanup.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Of those, the ones a terminal sends its whole process group: a worker leaves them to its
# parent, which stops the run (and its workers with it).
GROUP_STOP_SIGNALS = (signal.SIGINT, signal.SIGHUP)


def end_with_parent() -> None:
    """First thing in every process kvtrace starts (multiprocessing's: the local engine's
    workers, render's verifier, the Beam engine's child): it ends when the process that started
    it does, however that ends (SIGKILL, the OOM killer, a hard timeout), so none goes on
    holding the run's input, its output's lock or its work for a run that is gone.

    A forked process is killed by the kernel with its parent (PR_SET_PDEATHSIG), unless the
    parent died before the call, which the parent's pid then tells (no signal would come). One
    a server forked (forkserver) has that server for its parent, which lives on while any of
    its children does: it watches its starter's sentinel instead (a pipe the starter holds open,
    read as closed once it is gone) and ends itself then."""
    starter = multiprocessing.parent_process()
    if starter is None:  # not started by multiprocessing: nothing to end with
        return
    if not end_with(starter.pid):  # a server's child, or its parent died before the call
        watcher = threading.Thread(
            target=_end_once_gone, args=(starter,), name="end-with-parent", daemon=True
        )
        watcher.start()
        quiet_thread(watcher)  # it waits holding no lock


def end_with(parent: int) -> bool:
    """The kernel's death signal (SIGKILL) for this process once the process that started it
    ends (PR_SET_PDEATHSIG; strictly, once the thread that started it does:
    multiprocessing's waits on its process for its life). Returns whether parent is still this
    process's parent: if not, it died before the call (or another started this one), and no
    signal will come."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: a stopped parent still ends its children
        pass
    return os.getppid() == parent


def _end_once_gone(starter: multiprocessing.process.BaseProcess) -> None:
    starter.join()  # returns once the starter's end of its sentinel is closed: it is gone
    os.kill(os.getpid(), signal.SIGKILL)  # as the kernel ends a forked one


def quiet_thread(thread: threading.Thread) -> None:
    """Mark a started thread as one that waits holding no lock (the CLI's signal watcher): a
    fork copies none of its locks held, so it leaves forking safe (busy_threads)."""
    setattr(thread, QUIET_ATTRIBUTE, True)


def busy_threads() -> int:
    """Threads beside this one whose locks a fork could copy held (quiet ones aside: those marked
    by quiet_thread, and native_stderr's relay, which marks itself)."""
    return sum(
        thread is not threading.current_thread() and not getattr(thread, QUIET_ATTRIBUTE, False)
        for thread in threading.enumerate()
    )


def _parent_and_state(pid: str) -> tuple[int, str] | None:
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # the name, in (), may hold spaces
    except (OSError, IndexError):
        return None  # gone meanwhile
    return int(fields[1]), fields[0].decode()


def descendants(pid: int | None = None) -> list[int]:
    """Every living process below pid (default: this one), parents before their children;
    empty where there is no /proc."""
    if not os.path.isdir(PROC):
        return []
    children: dict[int, list[int]] = {}
    for entry in os.listdir(PROC):
        found = _parent_and_state(entry) if entry.isdigit() else None
        if found and found[1] != "Z":  # a zombie has ended; its parent has yet to reap it
            children.setdefault(found[0], []).append(int(entry))
    below, frontier = [], [os.getpid() if pid is None else pid]
    while frontier:
        frontier = [child for parent in frontier for child in children.get(parent, [])]
        below += frontier
    return below


def _alive(pid: int) -> bool:
    found = _parent_and_state(str(pid))
    return found is not None and found[1] != "Z"


def terminate_descendants() -> list[int]:
    """SIGTERM to every descendant, without waiting (fit for a signal handler); their pids."""
    pids = descendants()
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    return pids


def end_descendants() -> None:
    """SIGTERM to every descendant, then SIGKILL to any still running after END_GRACE_S."""
    pids = terminate_descendants()
    deadline = time.monotonic() + END_GRACE_S
    while pids and time.monotonic() < deadline:
        time.sleep(POLL_S)
        pids = [pid for pid in pids if _alive(pid)]
    for pid in pids:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:  # ended meanwhile
        pass
