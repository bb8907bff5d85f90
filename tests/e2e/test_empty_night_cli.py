"""A night whose input holds no record publishes nothing, as one whose every record is rejected:
exit 1 with one line naming the inputs, no output or letters folder, no id map version; on
either engine, for text logs and engine captures alike (the gate both engines pass)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import SALT, anonymize_night, chat, write_jsonl
from kvtrace.cli import main


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _check_nothing_to_publish(run: list[str], out: Path, capsys, inputs: str) -> None:
    assert main([*run, "--output", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err == f"error: no records read from --input ({inputs}): nothing to publish\n"
    assert not out.exists() and not Path(f"{out}-rejected").exists()


def _engines() -> list:
    return ["local", pytest.param("beam", marks=[pytest.mark.beam, pytest.mark.slow])]


@pytest.mark.parametrize("engine", _engines())
def test_an_empty_night_of_an_id_map_is_nothing_to_publish(
    tiny_tokenizer, tmp_path, capsys, engine
):
    (tmp_path / "salt").write_text(SALT)
    mapped = ["--id-map", str(tmp_path / "map"), "--salt-file", str(tmp_path / "salt")]
    first = write_jsonl(tmp_path / "first.jsonl", [chat(i, 1_000 * i) for i in range(3)])
    assert anonymize_night(tiny_tokenizer, [first], tmp_path / "n1", *mapped) == 0
    capsys.readouterr()
    before = _files(tmp_path / "map")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "blank.jsonl").write_bytes(b"\n \n")
    run = ["anonymize", "--tokenizer", tiny_tokenizer, "--block-size", "4", "--engine", engine]
    run += ["--input", str(tmp_path / "empty.jsonl"), "--input", str(tmp_path / "blank.jsonl")]
    _check_nothing_to_publish([*run, *mapped], tmp_path / "n2", capsys, "2 files, 3 bytes")
    assert _files(tmp_path / "map") == before  # no version recorded, nothing staged left


@pytest.mark.parametrize("engine", _engines())
def test_an_empty_capture_is_nothing_to_publish(tmp_path, capsys, engine):
    (tmp_path / "capture.jsonl").write_bytes(b"")
    run = ["anonymize", "--capture", "dynamo-request-trace", "--block-size", "4"]
    run += ["--engine", engine, "--input", str(tmp_path / "capture.jsonl")]
    _check_nothing_to_publish(run, tmp_path / "out", capsys, "1 file, 0 bytes")
