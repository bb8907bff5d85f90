"""The Beam engine's boundary between processes (child_process.run_in_child: the child stages
the output, the CLI's process publishes it), crashed on either side (crashpoints.BOUNDARY):
the output is the previous whole one or the new whole one, the line the run printed tells which,
and a rerun publishes exactly an uninterrupted run's bytes and leaves nothing beside them.

The step harness (test_crash_points.py) runs the Beam job in one process, so no crash there
crosses this boundary. Slow (a Beam run per point): run by .ci/run."""

from __future__ import annotations

import filecmp
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, TESTS, chat, write_jsonl
from kvtrace.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.beam]
SALT = "boundary-crash-harness-salt-32by"
NOTHING = "stopped: nothing published"
# Per point: the crashed run's exit code, whether it published, and what it must say (None:
# it was killed, so says nothing of its own).
POINTS = {
    "child-dies-before-its-word": (1, False, "error: a worker process died with exit code 137"),
    "child-dies-after-its-word": (0, True, None),
    "parent-dies-at-the-word": (137, False, None),
    "parent-stopped-at-the-word": (143, False, NOTHING),
}


@pytest.fixture(scope="module")
def nights(tiny_tokenizer, tmp_path_factory):
    """Night 1's output (the previous one), night 2's arguments, and night 2's uninterrupted
    output."""
    base = tmp_path_factory.mktemp("boundary")
    (base / "salt").write_text(SALT)
    logs = [
        write_jsonl(
            base / f"night{day}.jsonl",
            [chat(i + 5 * day, day * 86_400_000 + 577 * i) for i in range(12)] + [b"{broken"],
        )
        for day in (1, 2)
    ]
    common = ["--tokenizer", tiny_tokenizer, "--block-size", "4", "--salt-file", str(base / "salt")]
    common += ["--engine", "beam"]
    previous = base / "previous" / "out"
    assert main(["anonymize", "--input", str(logs[0]), "--output", str(previous), *common]) == 0
    night2 = ["anonymize", "--input", str(logs[1]), *common]
    expected = base / "expected" / "out"
    shutil.copytree(previous, expected)
    assert main([*night2, "--output", str(expected)]) == 0
    return previous, night2, expected


def _same(left: Path, right: Path) -> bool:
    names = sorted(p.name for p in left.iterdir())
    if names != sorted(p.name for p in right.iterdir()):
        return False
    _, mismatch, errors = filecmp.cmpfiles(left, right, names, shallow=False)
    return not mismatch and not errors


def _letter_files(work: Path, staged_too: bool = False) -> list[str]:
    """The published letters; staged_too: with what a killed run left staged (the next run
    settles it), else nothing but published ones beside them."""
    folder = work / "out-rejected"
    files = sorted(p.name for p in folder.iterdir()) if folder.exists() else []
    published = [n for n in files if re.fullmatch(r"rejected-[0-9a-f]{12}\.jsonl", n)]
    assert staged_too or published == files, files
    return published


@pytest.mark.parametrize("point", sorted(POINTS))
def test_whole_or_nothing_and_the_line_tells_the_truth(nights, tmp_path, point):
    previous, night2, expected = nights
    code, publishes, said = POINTS[point]
    work = tmp_path / "work"
    shutil.copytree(previous, work / "out")
    crashed = subprocess.run(
        [sys.executable, str(TESTS / "crashpoints.py"), "0", point, *night2, "--output"]
        + [str(work / "out")],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])},
    )
    assert crashed.returncode == code, crashed.stderr[-2000:]
    assert _same(work / "out", expected if publishes else previous), point
    assert len(_letter_files(work, staged_too=True)) == publishes  # with the output alone
    lines = [line for line in crashed.stderr.splitlines() if " INFO " not in line]
    if said is not None:
        assert said in lines, lines
    assert not any("Traceback" in line or "published" in line for line in lines if line != said)

    assert main([*night2, "--output", str(work / "out")]) == 0
    assert _same(work / "out", expected)
    assert len(_letter_files(work)) == 1 + publishes
    assert sorted(p.name for p in work.iterdir()) == ["out", "out-rejected"]
