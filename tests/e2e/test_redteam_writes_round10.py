"""Red team round 10, writes, stops and crashes: reproducers of holes left after the ninth
round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A stop or a crash is injected as an operator (or the OOM killer) sends it: a prelude wraps one of
kvtrace's own steps (or a library's) and signals right before or after it; the CLI's own handlers
then do what they do."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, chat, write_jsonl

pytestmark = pytest.mark.slow
ROUND10 = "red team round 10"
_MAIN = "import sys\nfrom kvtrace.cli import main\nsys.exit(main(sys.argv[1:]))"
# How long a process that ends with its run is given to be gone (it is, at once, once fixed).
GONE_S = 5


def _night(tmp_path: Path, tokenizer: str, out: Path, *extra: str) -> list[str]:
    """An anonymize run's arguments on a log of 12 chats and one dead letter."""
    src = tmp_path / "in.jsonl"
    if not src.exists():
        write_jsonl(src, [chat(i, 1000 * i) for i in range(12)] + [b"{broken"])
        (tmp_path / "salt").write_text("round-ten-salt-of-thirty-two-byt")
    return [
        "anonymize",
        "--input",
        str(src),
        "--tokenizer",
        tokenizer,
        "--block-size",
        "4",
        "--salt-file",
        str(tmp_path / "salt"),
        "--output",
        str(out),
        *extra,
    ]


def _gone(pid: int, within_s: float) -> bool:
    """Whether the process ends within within_s (waited on its pidfd: no polling)."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([handle], [], [], within_s)[0])
    finally:
        os.close(handle)


def _end_orphans(pids: Path, mark: str) -> None:
    """SIGKILL to the recorded processes still running that are this test's (their environment
    holds its mark)."""
    if not pids.exists():
        return
    for pid in {int(p) for p in pids.read_text().split()}:
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if mark.encode() not in environ.read():
                    continue
            os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass


# The OOM killer (or `kill -9`, a scheduler's hard timeout) ends the CLI once the Beam engine's
# child has started an SDK worker process (--direct_running_mode multi_processing): the child,
# right after Beam's Popen of the worker, notes the worker's pid and kills the CLI.
_KILL_THE_CLI_ONCE_AN_SDK_WORKER_RUNS = """
import os, signal, subprocess
_cli = os.getpid()
_init = subprocess.Popen.__init__
def _start_then_kill_the_cli(self, args, *rest, **kwargs):
    _init(self, args, *rest, **kwargs)
    if os.getpid() != _cli and "sdk_worker_main" in str(args):
        with open(os.environ["ROUND10_PIDS"], "a") as pids:
            pids.write(f"{self.pid}\\n")
        os.kill(_cli, signal.SIGKILL)
subprocess.Popen.__init__ = _start_then_kill_the_cli
"""


@pytest.mark.beam
@pytest.mark.xfail(strict=True, reason=ROUND10)
def test_a_killed_beam_run_leaves_no_sdk_worker_running(tiny_tokenizer, tmp_path):
    """Round 9 made every process kvtrace starts end with its run (processes.end_with_parent:
    PR_SET_PDEATHSIG), but only those multiprocessing starts: the local engine's workers,
    render's verifier, the Beam engine's child. With --direct_running_mode multi_processing the
    child has Beam start its SDK workers (runner.SDK_WORKER_COMMAND, through subprocess.Popen:
    `sh -c "trap '' INT; exec python -m ...sdk_worker_main"`), and nothing ends them with it.
    The CLI killed (SIGKILL: the OOM killer, a hard timeout), the child goes with it (its
    PDEATHSIG), and each SDK worker is left running, reparented to init, for good (its control
    channel gone, it waits on), holding whatever records it was given. "A killed run cannot end
    them: each process kvtrace starts ends itself with the run": a killed run must leave no
    process."""
    out, pids, mark = tmp_path / "out", tmp_path / "pids", f"ROUND10_{tmp_path.name}"
    night = _night(tmp_path, tiny_tokenizer, out, "--engine", "beam")
    night += ["--direct_running_mode", "multi_processing"]
    try:
        with open(tmp_path / "killed.err", "wb") as said:  # the orphan holds pipes open
            killed = subprocess.run(
                [sys.executable, "-c", f"{_KILL_THE_CLI_ONCE_AN_SDK_WORKER_RUNS}\n{_MAIN}", *night],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=said,
                timeout=120,
                check=False,
                env={
                    **os.environ,
                    "PYTHONPATH": str(ROOT),
                    "HF_HUB_OFFLINE": "1",
                    "ROUND10_PIDS": str(pids),
                    mark: "1",
                },
            )
        assert killed.returncode == -signal.SIGKILL, (tmp_path / "killed.err").read_text()
        workers = [int(p) for p in pids.read_text().split()]
        assert workers
        assert all(_gone(pid, GONE_S) for pid in workers)
    finally:
        _end_orphans(pids, mark)
