"""Red team round 6 (rt6-det): the id map. Each test asserts a promise the map once broke."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, anonymize_night, under_rlimit, write_jsonl

pytestmark = pytest.mark.slow

SALT = b"keyed-map-test-salt-of-32-bytes!"
ZERO = 1_700_000_000_000


def _request(folder: Path, name: str, prompt: str, day: int = 0) -> Path:
    return write_jsonl(
        folder / f"{name}.jsonl",
        [
            {
                "timestamp": ZERO + day * 86_400_000,
                "output_length": 5,
                "messages": [{"role": "user", "content": prompt}],
            }
        ],
    )


def _cli(*args: str, cap: bool = False) -> subprocess.CompletedProcess | None:
    """The CLI in a child process; None when it is still running after 45 s (a hang)."""
    command = [sys.executable, "-m", "kvtrace.cli", *args]
    try:
        return subprocess.run(
            under_rlimit(command, "RLIMIT_AS", 2 << 30) if cap else command,  # a shared machine
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=45,
        )
    except subprocess.TimeoutExpired:
        return None


def _fifo_in_place_of(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize(
    "command, which",
    [
        ("anonymize", "CURRENT"),
        ("anonymize", "segment index"),
        ("anonymize", "mark"),
        ("audit", "CURRENT"),
        ("id-map rebind", "CURRENT"),
        ("id-map rebind", "mark"),
    ],
)
def test_a_fifo_in_the_id_map_is_one_line_not_a_hang(tiny_tokenizer, tmp_path, which, command):
    """Promise: bad input gets 'a one-line error ..., never a hang'; docs/BOUNDS.md: any local
    path is read as 'a regular file ... (storage.open_regular, the one place kvtrace opens a
    local file to read) ... FIFO, device, socket: refused in one line'; docs/ID_MAP.md: with
    the map's files only, damage is noticed and refused in one line. But the id map's files
    are opened with storage.open_read (a plain open(path, 'rb')): id_map._current_hint reads
    CURRENT, segments.read_index the .index.npz files, anchor._read_keyed the marks. Whoever
    can write the map (the threat the marks exist for) puts a FIFO in CURRENT's place and
    every night, `kvtrace audit --id-map` and `kvtrace id-map rebind|upgrade` block in open()
    forever (storage.match lists regular files only, so a FIFO in a version's place is told
    in one line: the mechanism exists, these reads skip it)."""
    salt = tmp_path / "salt"
    salt.write_bytes(SALT)
    map_dir, marks = tmp_path / "map", tmp_path / "marks"
    common = ["--id-map", str(map_dir), "--id-map-marks", str(marks), "--salt-file", str(salt)]
    night = _request(tmp_path, "night0", "the quick brown fox jumps over the lazy dog")
    assert anonymize_night(tiny_tokenizer, [night], tmp_path / "out0", *common) == 0
    if which == "CURRENT":
        _fifo_in_place_of(map_dir / "CURRENT")
    elif which == "segment index":
        _fifo_in_place_of(next(map_dir.glob("segments/*/*.index.npz")))
    else:
        _fifo_in_place_of(next(marks.glob("map-*.json")))
    if command == "anonymize":
        later = _request(tmp_path, "night1", "the quick brown fox jumps over the lazy dog", 1)
        args = ["anonymize", "--input", str(later), "--output", str(tmp_path / "out1")]
        args += ["--tokenizer", tiny_tokenizer, "--block-size", "4", *common]
    elif command == "audit":
        args = ["audit", str(tmp_path / "out0"), "--id-map", str(map_dir), "--salt-file", str(salt)]
    else:
        args = ["id-map", "rebind", str(map_dir), "--id-map-marks", str(marks)]
        args += ["--salt-file", str(salt)]
    done = _cli(*args)
    assert done is not None, f"`kvtrace {command}` hung on a FIFO in place of the map's {which}"
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["anonymize", "audit", "id-map upgrade"])
def test_a_version_file_named_far_ahead_is_refused_before_memory_is_spent(
    tiny_tokenizer, tmp_path, command
):
    """Promise: 'every resource is bounded before it is spent'; docs/ID_MAP.md: deleting or
    adding files in the map is noticed in one line ('missing versions'). A version is at most
    999,999 (map_record.MAX_VERSION: six digits), but id_map.current_version_number takes any
    digits name in versions/ as a version and spends memory on the versions below it before
    deciding: `set(range(1, number + 1))`. One empty file, versions/999999999999.json, written
    by anyone who can write the map (no salt), makes every night, the gate's --id-map and
    `id-map upgrade|rebind` build a set of 10^12 ints: MemoryError under a 2 GiB cap, the
    machine's memory without one."""
    salt = tmp_path / "salt"
    salt.write_bytes(SALT)
    map_dir, marks = tmp_path / "map", tmp_path / "marks"
    common = ["--id-map", str(map_dir), "--id-map-marks", str(marks), "--salt-file", str(salt)]
    night = _request(tmp_path, "night0", "the quick brown fox jumps over the lazy dog")
    assert anonymize_night(tiny_tokenizer, [night], tmp_path / "out0", *common) == 0
    (map_dir / "versions" / "999999999999.json").write_bytes(b"")
    if command == "anonymize":
        later = _request(tmp_path, "night1", "hello world again", day=1)
        args = ["anonymize", "--input", str(later), "--output", str(tmp_path / "out1")]
        args += ["--tokenizer", tiny_tokenizer, "--block-size", "4", *common]
    elif command == "audit":
        args = ["audit", str(tmp_path / "out0"), "--id-map", str(map_dir), "--salt-file", str(salt)]
    else:
        args = ["id-map", "upgrade", str(map_dir), "--id-map-marks", str(marks)]
        args += ["--salt-file", str(salt)]
    done = _cli(*args, cap=True)
    assert done is not None, f"`kvtrace {command}` still running after 45 s"
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "MemoryError" not in said, said[-300:]


def _as_format_3(record_path: Path) -> None:
    """A keyed record rewritten as format 3 (its own sha256, no MAC): no salt needed."""
    import json

    from kvtrace.transforms.ids.map_record import TIMES, keyless_checksum

    record = json.loads(record_path.read_bytes())
    for name in ("mac", "map_id", "previous_sha256", *TIMES, "timestamp_kind"):
        record.pop(name)
    record["format_version"] = 3
    record["history"] = [
        {k: entry[k] for k in ("version", "added", "compacted")} for entry in record["history"]
    ]
    record["sha256"] = keyless_checksum(record)
    record_path.write_text(json.dumps(record, sort_keys=True))


def test_upgrade_refuses_a_keyed_map_rolled_back_and_rewritten_as_format_3(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/ID_MAP.md 'Rollback'): with the map's files only, 'a rollback to an older
    version ... or a keyed record rewritten as format 3 is refused'; a place bound to a map
    refuses any other map found there 'until the operator rebinds the place on purpose'.
    Whoever can write the map rolls it back to version 1 (versions/000002.json and its
    segments deleted, CURRENT 1) and rewrites version 1 as format 3 (fields copied, its sha256
    recomputed: no salt). The night is refused, and its message sends the operator to
    `kvtrace id-map upgrade` ('If this map was built before keying, key it once'). upgrade_map
    checks the anchor only for a keyed newest record (a format-3 map 'has no id to find its
    mark by yet'): it keys the rolled-back map under a new id (keyed_map_id), and
    advance_anchor rebinds the place, bound to the keyed map, to it. The next night numbers
    from version 1's next_id again: block ids night 2 published for other blocks."""
    import json

    salt = tmp_path / "salt"
    salt.write_bytes(SALT)
    map_dir, marks = tmp_path / "map", tmp_path / "marks"
    common = ["--id-map", str(map_dir), "--id-map-marks", str(marks), "--salt-file", str(salt)]
    prompts = [
        "the quick brown fox jumps",
        "hello world this is a prompt about caching blocks",
        "What is the capital of France ?",
    ]
    for day in range(2):
        night = _request(tmp_path, f"night{day}", prompts[day], day)
        assert anonymize_night(tiny_tokenizer, [night], tmp_path / f"out{day}", *common) == 0
    (map_dir / "versions" / "000002.json").unlink()
    for folder in map_dir.glob("segments/000002-*"):
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
    (map_dir / "CURRENT").write_text('{"version": 1}\n')
    _as_format_3(map_dir / "versions" / "000001.json")

    from kvtrace.cli import main

    upgraded = main(
        ["id-map", "upgrade", str(map_dir), "--id-map-marks", str(marks), "--salt-file", str(salt)]
    )
    night = _request(tmp_path, "night2", prompts[2], 2)
    code = anonymize_night(tiny_tokenizer, [night], tmp_path / "out2", *common)
    published = {
        i
        for day in range(2)
        for line in next((tmp_path / f"out{day}").glob("trace-*.jsonl")).read_text().splitlines()
        for i in json.loads(line)["hash_ids"]
    }
    reused = []
    if code == 0:
        rows = next((tmp_path / "out2").glob("trace-*.jsonl")).read_text().splitlines()
        reused = sorted({i for line in rows for i in json.loads(line)["hash_ids"]} & published)
    assert upgraded != 0 and code != 0, (
        f"upgrade keyed the rolled-back map (exit {upgraded}) and night 3 published block ids "
        f"{reused} that nights 1-2 published for other blocks"
    )


def _cd(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """`cd folder` as a shell does it: the kernel's working folder, and $PWD as spelled."""
    monkeypatch.chdir(folder)
    monkeypatch.setenv("PWD", str(folder))


def test_a_map_named_from_a_working_folder_reached_through_a_link_is_bound_to_it(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise (docs/ID_MAP.md 'Rollback'): 'When links in the path lead there, the path as the
    run spells it (absolute, its links kept) is bound ...: a link repointed (to an empty
    folder, or another map) leads that spelling to another place, where it finds no map or
    another, and is refused ..., never taken for a new map numbering from 0' (round 5's
    repointed link, fixed for an absolute --id-map). A job that runs in its release folder
    (`cd /srv/current && kvtrace anonymize --id-map map ...`, /srv/current a link to the
    release) spells the map relative to a working folder reached through a link: anchor.
    map_spelling joins os.getcwd(), which the kernel gives resolved, so the spelling bound is
    the link's target, never the link. Repoint the link to an empty folder (whoever can write
    /srv, not the map nor the marks): the next night's spelling and place are both the empty
    folder's, bound to nothing; it starts a new map from id 0, reusing ids nights 1-2
    published for other blocks."""
    import json

    salt = tmp_path / "salt"
    salt.write_bytes(SALT)
    common = ["--id-map", "map", "--id-map-marks", str(tmp_path / "marks"), "--salt-file"]
    common.append(str(salt))
    (tmp_path / "release-1").mkdir()
    (tmp_path / "empty").mkdir()
    current = tmp_path / "current"
    current.symlink_to(tmp_path / "release-1")
    prompts = ["the quick brown fox jumps", "hello world this is a prompt about caching blocks"]
    for day in range(2):
        _cd(monkeypatch, current)
        night = _request(tmp_path, f"night{day}", prompts[day], day)
        assert anonymize_night(tiny_tokenizer, [night], tmp_path / f"out{day}", *common) == 0
    current.unlink()
    current.symlink_to(tmp_path / "empty")
    _cd(monkeypatch, current)
    night = _request(tmp_path, "night2", "What is the capital of France ?", 2)
    code = anonymize_night(tiny_tokenizer, [night], tmp_path / "out2", *common)
    ids = []
    if code == 0:
        rows = next((tmp_path / "out2").glob("trace-*.jsonl")).read_text().splitlines()
        ids = [i for line in rows for i in json.loads(line)["hash_ids"]]
    assert code != 0, f"night 3 started a new map behind the repointed link: block ids {ids}"


def test_a_format_3_map_at_a_place_bound_to_a_keyed_map_is_keyed_only_once_rebound(
    tiny_tokenizer, tmp_path, capsys
):
    """The way out the refusal above names: an operator who put a format-3 map there on
    purpose rebinds the place (freed: a format-3 map has no id yet), then upgrade keys it."""
    from kvtrace.cli import main

    salt = tmp_path / "salt"
    salt.write_bytes(SALT)
    map_dir, marks = tmp_path / "map", tmp_path / "marks"
    common = ["--id-map", str(map_dir), "--id-map-marks", str(marks), "--salt-file", str(salt)]
    night = _request(tmp_path, "night0", "the quick brown fox jumps")
    assert anonymize_night(tiny_tokenizer, [night], tmp_path / "out0", *common) == 0
    _as_format_3(map_dir / "versions" / "000001.json")
    capsys.readouterr()
    maintained = [str(map_dir), "--id-map-marks", str(marks), "--salt-file", str(salt)]
    assert main(["id-map", "upgrade", *maintained]) == 2
    refusal = capsys.readouterr().err.strip()
    assert "not the map last published there" in refusal and "\n" not in refusal
    assert main(["id-map", "rebind", *maintained]) == 0
    assert "its place freed" in capsys.readouterr().out
    assert main(["id-map", "upgrade", *maintained]) == 0
    assert "keyed version(s) 1" in capsys.readouterr().out
