"""The processes a run started, and theirs, found and ended, even one that ignores SIGTERM (run
in a process of its own: ending the test process's descendants would end other fixtures'); and
the threads that make forking unsafe; and a process kvtrace starts ending with the one that
started it, however that one ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from helpers import ROOT
from kvtrace.pipelines.processes import busy_threads, quiet_thread

# Starts a child that ignores SIGTERM, which starts a grandchild; reports what descendants()
# finds, ends them, and reports what is left and whether the child was killed.
SCRIPT = """
import json, signal, subprocess, sys
from kvtrace.pipelines.processes import descendants, end_descendants
grandchild = "import time; print('up', flush=True); time.sleep(60)"
child = subprocess.Popen([sys.executable, "-c", f'''
import signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
g = subprocess.Popen([sys.executable, "-c", {grandchild!r}], stdout=subprocess.PIPE)
g.stdout.readline()
print(g.pid, flush=True)
g.wait()
'''], stdout=subprocess.PIPE)
grand = int(child.stdout.readline())
found = descendants()
end_descendants()
child.wait(timeout=5)
print(json.dumps({"child": child.pid, "grandchild": grand, "found": found,
                  "left": descendants(), "child_signal": -child.returncode}))
"""


def test_descendants_are_found_parents_first_and_all_ended():
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["found"] == [report["child"], report["grandchild"]]
    assert report["left"] == []
    assert report["child_signal"] == 9  # it ignored SIGTERM: killed after the grace period


def test_only_threads_not_marked_quiet_make_forking_unsafe():
    release = threading.Event()
    quiet, busy = (threading.Thread(target=release.wait, daemon=True) for _ in range(2))
    before = busy_threads()
    try:
        quiet.start()
        quiet_thread(quiet)
        assert busy_threads() == before
        busy.start()
        assert busy_threads() == before + 1
    finally:
        release.set()
        quiet.join()
        busy.join()


# A pool's one worker started as `method` starts it (end_with_parent first, as kvtrace's are);
# its pid said, then the parent waits for its end, which the test brings (SIGKILL).
ORPHANED = """
import multiprocessing, os, signal, sys
from concurrent.futures import ProcessPoolExecutor
from kvtrace.pipelines.processes import end_with_parent
if __name__ == "__main__":
    context = multiprocessing.get_context(sys.argv[1])
    pool = ProcessPoolExecutor(1, context, initializer=end_with_parent)
    print(pool.submit(os.getpid).result(), flush=True)
    signal.pause()
"""
GONE_BOUND_S = 10.0  # a killed process ends at once; generous for a loaded machine


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _gone_in_time(pid: int) -> bool:
    deadline = time.monotonic() + GONE_BOUND_S
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)  # polling a condition, bounded
    return not _running(pid)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_worker_ends_when_the_process_that_started_it_is_killed(method):
    """SIGKILL (the OOM killer, a hard timeout) gives the run no chance to end its workers: each
    ends itself (end_with_parent). A forked one by the kernel's death signal; one a server
    forked (forkserver) outlives its parent's death signal, the server living on while any
    of its children does, so it watches its starter. Without it, either waits forever on a
    queue it holds open itself."""
    parent = subprocess.Popen(
        [sys.executable, "-c", ORPHANED, method], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    worker = None
    try:
        worker = int(parent.stdout.readline())
        parent.kill()
        parent.wait(GONE_BOUND_S)
        assert _gone_in_time(worker), f"the {method} worker outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
        if worker is not None and _running(worker):
            os.kill(worker, signal.SIGKILL)


# The race: the parent is gone before its child calls end_with_parent (no death signal will
# come); the child says its pid, waits until it is orphaned, and only then makes the call.
ORPHANED_FIRST = """
import multiprocessing, os, signal, sys, time
from kvtrace.pipelines.processes import end_with_parent
def child(parent):
    print(os.getpid(), flush=True)
    while os.getppid() == parent:
        time.sleep(0.01)
    end_with_parent()
    signal.pause()
if __name__ == "__main__":
    multiprocessing.get_context("fork").Process(target=child, args=(os.getpid(),)).start()
    signal.pause()
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_process_whose_parent_died_before_it_could_ask_to_end_with_it_ends_too():
    parent = subprocess.Popen(
        [sys.executable, "-c", ORPHANED_FIRST], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    child = None
    try:
        child = int(parent.stdout.readline())
        parent.kill()
        parent.wait(GONE_BOUND_S)
        assert _gone_in_time(child), "the orphaned child lived on"
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
        if child is not None and _running(child):
            os.kill(child, signal.SIGKILL)
