"""A night the id map refuses leaves the map's folder as it was: no segment folder of its own,
no file changed, whatever the refusal (time order, salt, tokenizer, block size)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from helpers import anonymize_night, chat, kvtrace_child, write_jsonl

SALT = "nightly-salt-kept-in-a-secret-manager"
DAY_MS = 86_400_000


def files_of(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    } | {str(p.relative_to(directory)) + "/": "" for p in directory.rglob("*") if p.is_dir()}


@pytest.fixture
def mapped(tiny_tokenizer, tmp_path, monkeypatch) -> tuple[Path, Path]:
    """A map holding one night (day 2), and the salt file it was keyed with."""
    monkeypatch.delenv("KVTRACE_SALT", raising=False)
    salt = tmp_path / "salt"
    salt.write_text(SALT)
    night = write_jsonl(
        tmp_path / "day2.jsonl", [chat(i, DAY_MS + 1_000 + 613 * i, f"u{i % 3}") for i in range(20)]
    )
    map_dir = tmp_path / "map"
    args = ["--id-map", str(map_dir), "--salt-file", str(salt)]
    assert anonymize_night(tiny_tokenizer, [night], tmp_path / "n1", *args) == 0
    return map_dir, salt


def other_tokenizer(tiny_tokenizer: str, tmp_path: Path) -> str:
    edited = tmp_path / "edited-tokenizer"
    shutil.copytree(tiny_tokenizer, edited)
    config = json.loads((edited / "tokenizer_config.json").read_text())
    config["chat_template"] = config.get("chat_template", "") + " "
    (edited / "tokenizer_config.json").write_text(json.dumps(config))
    return str(edited)


@pytest.mark.parametrize(
    "refusal",
    ["inside the map's nights", "before the origin", "other salt", "other tokenizer", "block size"],
)
def test_a_refused_night_leaves_the_map_folder_unchanged(
    tiny_tokenizer, tmp_path, mapped, refusal, capsys
):
    map_dir, salt = mapped
    before = files_of(map_dir)
    # New content (fresh blocks, so the night would add segment rows): inside the map's night
    # (at or before its published_to), or before its origin.
    start = 1_000 if refusal == "before the origin" else DAY_MS + 2_000
    older = write_jsonl(
        tmp_path / "older.jsonl", [chat(i + 50, start + 997 * i, f"v{i % 4}") for i in range(20)]
    )
    tokenizer, extra = tiny_tokenizer, ["--salt-file", str(salt)]
    if refusal == "other salt":
        (tmp_path / "other-salt").write_text("a-different-salt-of-enough-bytes")
        extra = ["--salt-file", str(tmp_path / "other-salt")]
    elif refusal == "other tokenizer":
        tokenizer = other_tokenizer(tiny_tokenizer, tmp_path)
    elif refusal == "block size":
        extra += ["--block-size", "8"]
    capsys.readouterr()
    code = anonymize_night(
        tokenizer, [older], tmp_path / "refused", "--id-map", str(map_dir), *extra
    )
    err = capsys.readouterr().err
    assert code in (1, 2) and err.startswith("error: ") and "Traceback" not in err
    assert files_of(map_dir) == before
    assert not (tmp_path / "refused" / "manifest.json").exists()


# The Beam job's child killed (SIGKILL: the OOM killer) right after it wrote a segment file of
# the map: nothing of the child runs again, so the parent owns the run's segment folder.
_KILL_CHILD_AFTER_A_SEGMENT = """
import os, signal
from kvtrace.transforms.ids import steps
_parent = os.getpid()
_write = steps.write_segment_shard
def _write_then_die(*args, **kwargs):
    written = _write(*args, **kwargs)
    if os.getpid() != _parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return written
steps.write_segment_shard = _write_then_die
"""


@pytest.mark.beam
@pytest.mark.slow  # a Beam run in a child process
def test_a_beam_night_whose_child_dies_after_writing_segments_leaves_the_map_unchanged(
    tiny_tokenizer, tmp_path, mapped
):
    map_dir, salt = mapped
    before = files_of(map_dir)
    later = write_jsonl(
        tmp_path / "day3.jsonl", [chat(i + 50, 2 * DAY_MS + 997 * i, f"v{i % 4}") for i in range(9)]
    )
    died = kvtrace_child(
        "anonymize",
        *("--input", str(later), "--output", str(tmp_path / "out"), "--engine", "beam"),
        *("--tokenizer", tiny_tokenizer, "--block-size", "4"),
        *("--id-map", str(map_dir), "--salt-file", str(salt)),
        prelude=_KILL_CHILD_AFTER_A_SEGMENT,
    )
    assert died.returncode == 1 and "died by SIGKILL" in died.stderr, died.stderr[-2000:]
    assert files_of(map_dir) == before
