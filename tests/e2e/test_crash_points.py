"""Crash-point harness for the commit protocols: a night's id map version (of text or of engine
captures), output folder and dead letters, and every other command that writes (render,
synthesize on both engines, convert to a file and to a folder, export, report, analyze
--output). Every durable filesystem step of a run (crashpoints.py) is, in turn, the point where
the process is killed or the disk is full; then:

- what a reader sees is whole: the output is the previous run's or the new one, byte for byte,
  and the map's published version is the old one or the new one;
- the rerun gives exactly the bytes of an uninterrupted run (output, map and letters, run ids
  aside) and leaves nothing behind (no staging folder, no temp file, no abandoned segment).

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

from helpers import ROOT, TESTS, chat, dynamo_request_end, kvtrace_token_ids, write_jsonl
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
            data = re.sub(
                r"(segments/\d{6})-[0-9a-f]+", r"\1", json.dumps(record, sort_keys=True)
            ).encode()
        files[name] = data
    return files


@pytest.fixture(scope="module")
def night(tiny_tokenizer, tmp_path_factory):
    """A map and an output after night 1; night 2's logs; the state an uninterrupted night 2
    leaves (output and map)."""
    base = tmp_path_factory.mktemp("crash")
    args = ["--tokenizer", tiny_tokenizer, "--block-size", "4"]
    return _nights(base, [_chats(day) for day in (1, 2)], args)


@pytest.fixture(scope="module")
def capture_night(tiny_tokenizer, tmp_path_factory):
    """The same for nights of engine hash captures (the same chats as Dynamo's request trace
    logs them) and their map."""
    base = tmp_path_factory.mktemp("crash-capture")
    logs = []
    for day in (1, 2):
        chats = _chats(day)
        logs.append(
            [
                dynamo_request_end(r["timestamp"], ids, 4, r["output_length"], r["session_id"])
                for r, ids in zip(chats, kvtrace_token_ids(tiny_tokenizer, chats))
            ]
        )
    return _nights(base, logs, ["--capture", "dynamo-request-trace", "--block-size", "4"])


def _chats(day: int) -> list[dict]:
    return [
        chat(
            i + 5 * day, day * 86_400_000 + 1_000 + 577 * i, f"u{day}-{i % 4}", rotate=(i + day) % 5
        )
        for i in range(20)
    ]


def _nights(base: Path, records: list[list], settings: list[str]):
    (base / "salt").write_text(SALT)
    logs = [
        write_jsonl(base / f"night{day}.jsonl", [*night, b"{broken"])
        for day, night in enumerate(records, 1)
    ]
    args = [*settings, "--hash-shards", "2", "--salt-file", str(base / "salt")]
    assert (
        main(
            [
                "anonymize",
                "--input",
                str(logs[0]),
                "--output",
                str(base / "out"),
                "--id-map",
                str(base / "map"),
                *args,
            ]
        )
        == 0
    )
    shutil.copytree(base / "out", base / "previous-out")
    shutil.copytree(base / "map", base / "previous-map")
    expected = base / "expected"
    # Each copy of the map gets its own copy of its marks: a copy is the same map (its id names
    # its mark), so one copy extended under the shared marks would make the others rollbacks.
    shutil.copytree(base / "salt.id-map-marks", base / "previous-marks")
    shutil.copytree(base / "previous-out", expected / "out")
    shutil.copytree(base / "previous-map", expected / "map")
    shutil.copytree(base / "previous-marks", expected / "marks")
    night2 = ["anonymize", "--input", str(logs[1]), *args]
    assert (
        main(
            [
                *night2,
                "--output",
                str(expected / "out"),
                "--id-map",
                str(expected / "map"),
                "--id-map-marks",
                str(expected / "marks"),
            ]
        )
        == 0
    )
    return base, night2, expected


def _letters(folder: Path) -> list[list[str]]:
    """Each published file's dead letters (every file a run's, nothing hidden beside them)."""
    files = sorted(folder.iterdir())
    assert all(re.fullmatch(r"rejected-[0-9a-f]{12}\.jsonl", p.name) for p in files), files
    return [sorted(p.read_text().splitlines()) for p in files]


def _crash(
    night2: list[str], work: Path, point: int, mode: str, engine: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(TESTS / "crashpoints.py"),
            str(point),
            mode,
            *night2,
            "--output",
            str(work / "out"),
            "--id-map",
            str(work / "map"),
            "--id-map-marks",
            str(work / "marks"),
            "--engine",
            engine,
        ],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])},
    )


def _points(night, engine: str, work: Path) -> int:
    base, night2, _ = night
    shutil.copytree(base / "previous-out", work / "out")
    shutil.copytree(base / "previous-map", work / "map")
    shutil.copytree(base / "previous-marks", work / "marks")
    done = _crash(night2, work, 0, "kill", engine)
    assert done.returncode == 0, done.stderr
    return int(re.search(r"steps: (\d+)", done.stderr).group(1))


def _check_every_point(night, tmp_path, mode: str, engine: str, every: int = 1) -> int:
    base, night2, expected = night
    # A folder of its own: the same map path restored to night 1 would be a rollback.
    steps = _points(night, engine, tmp_path / "count")
    assert steps > 10
    for point in range(1, steps + 1, every):
        work = tmp_path / f"{mode}-{point}"
        shutil.copytree(base / "previous-out", work / "out")
        shutil.copytree(base / "previous-map", work / "map")
        shutil.copytree(base / "previous-marks", work / "marks")
        crashed = _crash(night2, work, point, mode, engine)
        assert crashed.returncode != 0, f"step {point} was never reached"
        if mode == "enospc":  # a failure, not a kill: one line, no traceback
            assert "Traceback" not in crashed.stderr and "error:" in crashed.stderr, crashed.stderr
        seen = _tree(work / "out")
        assert seen in (_tree(base / "previous-out"), _tree(expected / "out")), f"step {point}"
        night_published = seen == _tree(expected / "out")  # by the killed run
        assert (
            main(
                [
                    *night2,
                    "--output",
                    str(work / "out"),
                    "--id-map",
                    str(work / "map"),
                    "--id-map-marks",
                    str(work / "marks"),
                    "--engine",
                    engine,
                ]
            )
            == 0
        ), f"rerun after step {point}"
        assert _tree(work / "out") == _tree(expected / "out"), f"output after step {point}"
        assert _tree(work / "map") == _tree(expected / "map"), f"map after step {point}"
        assert sorted(p.name for p in work.iterdir()) == ["map", "marks", "out", "out-rejected"], (
            f"left after {point}"
        )
        # The night's letters once per run that published it: the rerun, and the killed run if
        # it had published its output (its letters are kept with it, never lost).
        assert _letters(work / "out-rejected") == _letters(expected / "out-rejected") * (
            1 + night_published
        ), f"letters after step {point}"
        shutil.rmtree(work)
    return steps


@pytest.mark.parametrize("mode", ["kill", "enospc"])
def test_every_step_of_a_local_night(night, tmp_path, mode):
    _check_every_point(night, tmp_path, mode, "local")


@pytest.mark.parametrize("mode", ["kill", "enospc"])
def test_every_fourth_step_of_a_beam_night(night, tmp_path, mode):
    _check_every_point(night, tmp_path, mode, "beam", every=4)


@pytest.mark.parametrize("mode", ["kill", "enospc"])
def test_every_step_of_a_local_capture_night(capture_night, tmp_path, mode):
    """A night of engine captures extends its map by the same protocol as a text night."""
    _check_every_point(capture_night, tmp_path, mode, "local")


@pytest.mark.beam  # its reruns run Beam in this process
def test_every_eighth_step_of_a_beam_capture_night(capture_night, tmp_path):
    _check_every_point(capture_night, tmp_path, "kill", "beam", every=8)


def test_a_failed_nights_letters_are_dropped_by_the_rerun_when_every_settle_fails(
    night, tmp_path, monkeypatch
):
    """The double-failure point: a night refused by --max-rejected-fraction (before it writes
    a trace file, so its staged folder is empty) whose letters cannot be dropped by either of
    the settle's attempts (their folder gone read-only). Its pointer stands, so its staged
    folder outlives its failure; the rerun settles the pointer (the folder still staged: the
    letters dropped) and publishes the night as an uninterrupted one: nothing left staged,
    the letters once, the night's counts its own."""
    base, night2, expected = night
    work = tmp_path / "work"
    for name in ("out", "map", "marks"):
        shutil.copytree(base / f"previous-{name}", work / name)
    places = ["--output", str(work / "out"), "--id-map", str(work / "map")]
    places += ["--id-map-marks", str(work / "marks")]
    remove = os.remove

    def read_only_letters(path, *args, **kwargs):
        if str(path).startswith(str(work / "out-rejected")) and str(path).endswith("publishes"):
            raise OSError(30, "Read-only file system", str(path))
        return remove(path, *args, **kwargs)

    monkeypatch.setattr(os, "remove", read_only_letters)
    assert main([*night2, *places, "--max-rejected-fraction", "0"]) == 1
    monkeypatch.undo()
    assert _tree(work / "out") == _tree(base / "previous-out")
    assert main([*night2, *places]) == 0
    assert _tree(work / "out") == _tree(expected / "out")
    assert sorted(p.name for p in work.iterdir()) == ["map", "marks", "out", "out-rejected"]
    assert _letters(work / "out-rejected") == _letters(expected / "out-rejected")
    stats = json.loads((work / "out" / "stats.json").read_bytes())
    assert stats == json.loads((expected / "out" / "stats.json").read_bytes())


TRACE = [
    {
        "timestamp": 1000 * i + 37 * (i % 3),
        "input_length": 4 * (2 + i % 3) - 1,
        "output_length": 3,
        "hash_ids": [1, 2 + i % 2] + [100 + 10 * i + j for j in range(i % 3)],
    }
    for i in range(12)
]
BAILIAN = [
    {
        "chat_id": i,
        "parent_chat_id": i - 1 if i % 3 else -1,
        "timestamp": 1.5 * i,
        "input_length": 16 * (1 + i % 3),
        "output_length": 4,
        "type": "text",
        "turn": 1,
        "hash_ids": list(range(i, i + 1 + i % 3)),
    }
    for i in range(9)
]
# Each command that writes, as (name, arguments before the input, its output's name, arguments
# after); INPUT is replaced by the trace (or Bailian file) of a run.
COMMANDS = {
    "render": (
        ["render", "INPUT", "--block-size", "4", "--tokenizer", "TOKENIZER", "--no-verify"],
        "out.jsonl",
    ),
    # A derived trace at block size 4 is a folder with its manifest (a bare .jsonl is refused).
    "synthesize": (["synthesize", "INPUT", "--block-size", "4", "--seed", "1"], "out"),
    "synthesize-beam": (["synthesize", "INPUT", "--block-size", "4", "--engine", "beam"], "out"),
    "convert-folder": (["convert", "BAILIAN"], "out"),
    "export": (
        ["export", "INPUT", "--to", "dynamo", "--block-size", "4", "--overwrite"],
        "out.jsonl",
    ),
    "report": (
        [
            "report",
            "INPUT",
            "--block-size",
            "4",
            "--capacity",
            "8,32",
            "--policy",
            "lru",
            "--overwrite",
        ],
        "out.html",
    ),
    "analyze": (["analyze", "INPUT", "--block-size", "4", "--output"], "out"),
}


def _snapshot(path: Path) -> dict[str, bytes] | None:
    if not path.exists():
        return None
    return _tree(path) if path.is_dir() else {"": path.read_bytes()}


def _command(name: str, inputs: Path, run: str, tokenizer: str, work: Path) -> list[str]:
    args, output = COMMANDS[name]
    given = {
        "INPUT": str(inputs / f"{run}.jsonl"),
        "BAILIAN": str(inputs / f"{run}-bailian.jsonl"),
        "TOKENIZER": tokenizer,
    }
    args = [given.get(a, a) for a in args]
    return (
        [*args, str(work / output)] if args[-1] == "--output" else [*args, "-o", str(work / output)]
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """A previous and a new input of every kind: their outputs differ."""
    folder = tmp_path_factory.mktemp("inputs")
    write_jsonl(folder / "previous.jsonl", TRACE[:7])
    write_jsonl(folder / "new.jsonl", TRACE)
    write_jsonl(folder / "previous-bailian.jsonl", BAILIAN[:4])
    write_jsonl(folder / "new-bailian.jsonl", BAILIAN)
    return folder


@pytest.mark.parametrize("mode", ["kill", "enospc"])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_step_of_every_command_that_writes(name, mode, inputs, tiny_tokenizer, tmp_path):
    """Killed or out of disk at any step, the output is the previous whole one or the new whole
    one; the rerun publishes the new one and leaves only it and its lock."""
    output = COMMANDS[name][1]

    def run(work: Path, run: str, point: int | None = None) -> subprocess.CompletedProcess | int:
        args = _command(name, inputs, run, tiny_tokenizer, work)
        if point is None:
            return main(args)
        return subprocess.run(
            [sys.executable, str(TESTS / "crashpoints.py"), str(point), mode, *args],
            cwd=TESTS,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])},
        )

    previous, expected = tmp_path / "previous", tmp_path / "expected"
    assert run(previous, "previous") == 0 and run(expected, "new") == 0
    shutil.copytree(previous, tmp_path / "count")
    counted = run(tmp_path / "count", "new", 0)
    assert counted.returncode == 0, counted.stderr
    steps = int(re.search(r"steps: (\d+)", counted.stderr).group(1))
    assert steps >= 3  # at least: the file written, renamed into place, its folder synced
    before, after = _snapshot(previous / output), _snapshot(expected / output)
    assert before != after
    for point in range(1, steps + 1):
        work = tmp_path / f"{mode}-{point}"
        shutil.copytree(previous, work)
        crashed = run(work, "new", point)
        assert crashed.returncode != 0, f"step {point} was never reached"
        if mode == "enospc":
            assert "Traceback" not in crashed.stderr and "error:" in crashed.stderr, crashed.stderr
        assert _snapshot(work / output) in (before, after), f"partial output at step {point}"
        assert run(work, "new") == 0, f"rerun after step {point}"
        assert _snapshot(work / output) == after, f"output after step {point}"
        assert sorted(p.name for p in work.iterdir()) == sorted(
            p.name for p in expected.iterdir()
        ), f"left after step {point}"
        shutil.rmtree(work)
