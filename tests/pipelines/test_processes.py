"""The processes a run started, and theirs, found and ended, even one that ignores SIGTERM. Run
in a process of its own: ending the test process's descendants would end other fixtures'."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT

# Starts a child that ignores SIGTERM, which starts a grandchild; reports what descendants()
# finds, ends them, and reports what is left and whether the child was killed.
SCRIPT = """
import json, signal, subprocess, sys
from pipelines.processes import descendants, end_descendants
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
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["found"] == [report["child"], report["grandchild"]]
    assert report["left"] == []
    assert report["child_signal"] == 9  # it ignored SIGTERM: killed after the grace period
