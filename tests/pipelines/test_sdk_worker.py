"""Beam's SDK worker, started through kvtrace's launcher, ends with the process that started it
(processes.end_with), however that ends."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import ROOT

# What the module the launcher runs reports: its death signal (PR_GET_PDEATHSIG).
_REPORT = """
import ctypes, signal
got = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(got))
print(got.value, flush=True)
"""


def _launch(tmp_path, starter: int) -> subprocess.CompletedProcess[str]:
    (tmp_path / "report_death_signal.py").write_text(_REPORT)
    return subprocess.run(
        [sys.executable, "-m", "kvtrace.pipelines.sdk_worker", str(starter)]
        + ["report_death_signal"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])},
    )


def test_the_worker_runs_with_the_death_signal_of_its_starter(tmp_path):
    done = _launch(tmp_path, os.getpid())
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["9"]  # SIGKILL: the kernel ends it with this process


def test_a_worker_whose_starter_is_gone_runs_nothing(tmp_path):
    """Its starter died before it asked (it was reparented): no signal would come, so it ends."""
    done = _launch(tmp_path, os.getpid() + 10**7)  # never this process's parent
    assert done.returncode == 1 and done.stdout == "", done.stderr
