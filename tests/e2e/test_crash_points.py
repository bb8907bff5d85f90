"""Crash-point harness for the two commit protocols of a night: the id map's version and the
output folder's publication. Every durable filesystem step of a night (crashpoints.py) is, in
turn, the point where the process is killed or the disk is full; then:

- what a reader sees is whole: the output folder is the previous night's or the new one, byte
  for byte, and the map's published version is the old one or the new one;
- the rerun gives exactly the bytes of an uninterrupted run (output and map, run ids aside) and
  leaves nothing behind (no staging folder, no temp file, no abandoned segment).

Slow (a process per crash point): run by .ci/run, not by the README's test command."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TESTS, chat, write_jsonl

from kvtrace.cli import main

pytestmark = pytest.mark.slow
SALT = "crash-point-harness-salt-32bytes"


def _tree(folder: Path) -> dict[str, bytes]:
    """A folder's files by relative path, run ids and the version's self-checksum taken out."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_dir():
            continue
        name = re.sub(r"(segments/\d{6})-[0-9a-f]+", r"\1", str(path.relative_to(folder)))
        data = path.read_bytes()
        if name.startswith("versions/"):
            record = json.loads(data)
            record.pop("mac")
            data = re.sub(r"(segments/\d{6})-[0-9a-f]+", r"\1",
                          json.dumps(record, sort_keys=True)).encode()
        files[name] = data
    return files


@pytest.fixture(scope="module")
def night(tiny_tokenizer, tmp_path_factory):
    """A map and an output after night 1; night 2's logs; the state an uninterrupted night 2
    leaves (output and map)."""
    base = tmp_path_factory.mktemp("crash")
    (base / "salt").write_text(SALT)
    logs = [write_jsonl(base / f"night{day}.jsonl",
                        [chat(i + 5 * day, day * 86_400_000 + 1_000 + 577 * i, f"u{day}-{i % 4}",
                              rotate=(i + day) % 5) for i in range(20)] + [b"{broken"])
            for day in (1, 2)]
    args = ["--tokenizer", tiny_tokenizer, "--block-size", "4", "--hash-shards", "2",
            "--salt-file", str(base / "salt")]
    assert main(["anonymize", "--input", str(logs[0]), "--output", str(base / "out"),
                 "--id-map", str(base / "map"), *args]) == 0
    shutil.copytree(base / "out", base / "previous-out")
    shutil.copytree(base / "map", base / "previous-map")
    expected = base / "expected"
    shutil.copytree(base / "previous-out", expected / "out")
    shutil.copytree(base / "previous-map", expected / "map")
    night2 = ["anonymize", "--input", str(logs[1]), *args]
    assert main([*night2, "--output", str(expected / "out"), "--id-map", str(expected / "map")]) == 0
    return base, night2, expected


def _crash(night2: list[str], work: Path, point: int, mode: str, engine: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TESTS / "crashpoints.py"), str(point), mode, *night2,
         "--output", str(work / "out"), "--id-map", str(work / "map"), "--engine", engine],
        cwd=TESTS, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])})


def _points(night, engine: str) -> int:
    base, night2, _ = night
    work = base / f"count-{engine}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base / "previous-out", work / "out")
    shutil.copytree(base / "previous-map", work / "map")
    done = _crash(night2, work, 0, "kill", engine)
    assert done.returncode == 0, done.stderr
    return int(re.search(r"steps: (\d+)", done.stderr).group(1))


def _check_every_point(night, tmp_path, mode: str, engine: str, every: int = 1) -> int:
    base, night2, expected = night
    steps = _points(night, engine)
    assert steps > 10
    for point in range(1, steps + 1, every):
        work = tmp_path / f"{mode}-{point}"
        shutil.copytree(base / "previous-out", work / "out")
        shutil.copytree(base / "previous-map", work / "map")
        crashed = _crash(night2, work, point, mode, engine)
        assert crashed.returncode != 0, f"step {point} was never reached"
        if mode == "enospc":  # a failure, not a kill: one line, no traceback
            assert "Traceback" not in crashed.stderr and "error:" in crashed.stderr, crashed.stderr
        seen = _tree(work / "out")
        assert seen in (_tree(base / "previous-out"), _tree(expected / "out")), f"step {point}"
        assert main([*night2, "--output", str(work / "out"), "--id-map", str(work / "map"),
                     "--engine", engine]) == 0, f"rerun after step {point}"
        assert _tree(work / "out") == _tree(expected / "out"), f"output after step {point}"
        assert _tree(work / "map") == _tree(expected / "map"), f"map after step {point}"
        assert sorted(p.name for p in work.iterdir()) == [".out.kvtrace-lock", "map", "out",
                                                          "out-rejected"], f"left after {point}"
        shutil.rmtree(work)
    return steps


@pytest.mark.parametrize("mode", ["kill", "enospc"])
def test_every_step_of_a_local_night(night, tmp_path, mode):
    _check_every_point(night, tmp_path, mode, "local")


@pytest.mark.parametrize("mode", ["kill", "enospc"])
def test_every_fourth_step_of_a_beam_night(night, tmp_path, mode):
    _check_every_point(night, tmp_path, mode, "beam", every=4)
