"""Ctrl-C and SIGTERM stop a run on any engine within 2 seconds: exit 130 (Ctrl-C) or 143
(SIGTERM), one line, nothing published, and no process of the run left running (the local
engine's workers, Beam's SDK workers). Ctrl-C is sent as a terminal sends it, to the whole
process group; SIGTERM as a supervisor sends it, to the launcher alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, chat
from kvtrace.cli import STOPPED
from kvtrace.pipelines.processes import descendants

STOP_BOUND_S = 2.0  # the promise
START_BOUND_S = 180.0  # imports, the tokenizer, Beam's pipeline: generous for a loaded machine
LOG_MB = 24  # seconds of work on either engine once its workers run: a stop lands mid-run


def _request_log(path: Path) -> Path:
    """Chats of ~1 KB until the log holds LOG_MB."""
    lines = []
    for i in range(LOG_MB * 1000):
        record = chat(i, i, rotate=i % 10)
        record["messages"][1]["content"] = (record["messages"][1]["content"] + " ") * 25
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def request_log(tmp_path_factory) -> Path:
    return _request_log(tmp_path_factory.mktemp("log") / "requests.jsonl")


def _stat(pid: int) -> list[str] | None:
    """A process's /proc stat fields after its name (state first), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _running_in_group(group: int) -> list[int]:
    """Processes of a process group that still run (a zombie has ended)."""
    found = []
    for entry in os.listdir("/proc"):
        fields = _stat(int(entry)) if entry.isdigit() else None
        if fields and fields[0] != "Z" and int(fields[2]) == group:
            found.append(int(entry))
    return found


def _wait_until(condition, what: str, proc: subprocess.Popen, stderr: Path) -> None:
    deadline = time.monotonic() + START_BOUND_S
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}: {stderr.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"no {what} within {START_BOUND_S} s"
        time.sleep(0.05)  # polling the condition, not timing the test


def _stop_mid_run(
    tmp_path: Path,
    tokenizer: str,
    log: Path,
    signum: int,
    to_group: bool,
    workers: int,
    *flags: str,
) -> None:
    out, stderr = tmp_path / "out", tmp_path / "stderr"
    with open(stderr, "w") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvtrace.cli",
                "anonymize",
                "--input",
                str(log),
                "--output",
                str(out),
                "--tokenizer",
                tokenizer,
                *flags,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    try:
        # Started: the staging folder made (the tokenizer loaded, encoding begun), the workers up.
        _wait_until(
            lambda: list(tmp_path.glob(".out.kvtrace-staging-*")), "staging folder", proc, stderr
        )
        _wait_until(
            lambda: len(descendants(proc.pid)) >= workers, f"{workers} workers", proc, stderr
        )
        before = stderr.read_text()
        stopped_at = time.monotonic()
        if to_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        proc.wait(timeout=STOP_BOUND_S + 5)
        took = time.monotonic() - stopped_at
        left = _running_in_group(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = stderr.read_text()
    assert proc.returncode == 128 + signum, said[-2000:]
    assert took <= STOP_BOUND_S
    assert said[len(before) :].splitlines() == [STOPPED]
    assert "Traceback" not in said
    assert proc.stdout.read() == b""
    assert not out.exists() and not list(tmp_path.glob(".out.kvtrace-staging-*"))
    assert left == []


@pytest.mark.slow  # a run of ~10 s: .ci/run runs the slow set
@pytest.mark.parametrize(
    "signum, to_group", [(signal.SIGINT, True), (signal.SIGTERM, False)], ids=["ctrl-c", "sigterm"]
)
def test_the_local_engine_and_its_workers_stop(
    tiny_tokenizer, tmp_path, request_log, signum, to_group
):
    _stop_mid_run(tmp_path, tiny_tokenizer, request_log, signum, to_group, 2, "--processes", "2")


@pytest.mark.slow
def test_the_local_engine_in_one_process_stops(tiny_tokenizer, tmp_path, request_log):
    _stop_mid_run(tmp_path, tiny_tokenizer, request_log, signal.SIGINT, True, 0, "--processes", "1")


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, to_group", [(signal.SIGINT, True), (signal.SIGTERM, False)], ids=["ctrl-c", "sigterm"]
)
def test_beam_and_its_child_stop(tiny_tokenizer, tmp_path, request_log, signum, to_group):
    """Its workers are threads of the child (multi_processing, whose SDK worker processes report
    to no one, is refused)."""
    _stop_mid_run(
        tmp_path,
        tiny_tokenizer,
        request_log,
        signum,
        to_group,
        1,
        "--engine",
        "beam",
        "--direct_num_workers",
        "2",
        "--direct_running_mode",
        "multi_threading",
    )
