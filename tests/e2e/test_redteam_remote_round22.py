"""Red team round 22, remote runners (Beam on a real local Flink cluster): reproducers of the
holes found, each asserting the promised behaviour (fixed in round 22). They need the cluster:
deploy/flink/local-cluster.sh start, then KVTRACE_FLINK=1 deploy/flink/local-cluster.sh python
-m pytest -m slow tests/e2e/test_redteam_remote_round22.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ON_FLINK, ROOT, SALT, chat, write_jsonl

pytestmark = [pytest.mark.slow, *ON_FLINK]
FLINK = ("--config", str(ROOT / "configs" / "flink-local.yaml"))
CLUSTER = ROOT / "deploy" / "flink" / "local-cluster.sh"


def night_with_a_letter(folder: Path) -> Path:
    """A few chats and one record that is no request: the night has a dead letter to write."""
    return write_jsonl(
        folder / "night.jsonl",
        [chat(i, 1_000 * i, session=f"s{i % 3}") for i in range(8)] + [{"broken": True}],
    )


def test_a_night_refused_by_its_gate_on_flink_says_so_in_one_line(tiny_tokenizer, tmp_path):
    """Too much input rejected: the gate (PassGate, a pipeline step) refuses the night. Flink
    restarts the job on that deterministic refusal (its restart strategy: 20 attempts), and each
    attempt's worker prints its traceback: dozens of tracebacks before kvtrace's line."""
    salt_file = tmp_path / "salt"
    salt_file.write_text(SALT)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from kvtrace.cli import main; sys.exit(main())",
            "anonymize",
            *FLINK,
            "--input",
            str(night_with_a_letter(tmp_path)),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
            "--salt-file",
            str(salt_file),
            "--max-rejected-fraction",
            "0.01",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={name: value for name, value in os.environ.items() if name != "KVTRACE_SALT"},
        timeout=600,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("error: too much input rejected")
    assert not (tmp_path / "out").exists()
    assert "Traceback" not in done.stderr, done.stderr[:2000]


def test_a_parallelism_the_cluster_cannot_seat_ends_with_one_line(tiny_tokenizer, tmp_path):
    """--parallelism 8 on a cluster of 2 slots: the job is submitted and waits for slots it
    never gets, RUNNING with no task started, and the launcher waits with it, silent, for good
    (Flink's slot request times out after minutes, then its restart strategy tries 20 times
    more); a stop cannot cancel it (Beam's Flink job server drops the launcher's cancel)."""
    salt_file = tmp_path / "salt"
    salt_file.write_text(SALT)
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from kvtrace.cli import main; sys.exit(main())",
            "anonymize",
            *FLINK,
            "--parallelism",
            "8",
            "--input",
            str(night_with_a_letter(tmp_path)),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            tiny_tokenizer,
            "--salt-file",
            str(salt_file),
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={name: value for name, value in os.environ.items() if name != "KVTRACE_SALT"},
    )
    try:
        try:
            _, stderr = launcher.communicate(timeout=90)  # a night here takes ~60 s
        except subprocess.TimeoutExpired:
            launcher.terminate()
            _, stderr = launcher.communicate(timeout=60)
            pytest.fail(f"still waiting for slots after 90 s: {stderr[-300:]}")
    finally:
        # The job outlives its launcher: cancelled here, else it holds the cluster's slots.
        subprocess.run([str(CLUSTER), "cancel-jobs"], check=True, capture_output=True, timeout=60)
    assert launcher.returncode == 2
    assert stderr.splitlines()[-1].startswith("error: ")
    assert "Traceback" not in stderr
