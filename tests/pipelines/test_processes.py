"""The processes a run started, and theirs, found and ended, even one that ignores SIGTERM (run
in a process of its own: ending the test process's descendants would end other fixtures'); and
the threads that make forking unsafe."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

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
