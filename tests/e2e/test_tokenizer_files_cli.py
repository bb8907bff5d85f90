"""A tokenizer's identity is the files kvtrace loads from its folder: each a regular file within
its bound, read once, hashed from the bytes loaded; nothing else in the folder is read or named.

The whole CLI runs; the unit tests are in tests/transforms/encode/test_tokenizer_files.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from helpers import anonymize, chat, write_jsonl
from kvtrace.transforms.encode.fast_tokenizer import TOKENIZER_FILE


@pytest.fixture
def folder(tiny_tokenizer, tmp_path) -> Path:
    copy = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, copy)
    return copy


def test_a_folder_without_tokenizer_json_is_refused_in_one_line(folder, tmp_path, capsys):
    (folder / TOKENIZER_FILE).unlink()
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)])
    assert anonymize(str(folder), [src], tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert TOKENIZER_FILE in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_fifo_in_the_folder_is_one_line_for_the_cli(folder, tmp_path, capsys):
    (folder / "special_tokens_map.json").unlink(missing_ok=True)
    os.mkfifo(folder / "special_tokens_map.json")
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0)])
    assert anonymize(str(folder), [src], tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "not a regular file" in err and "Traceback" not in err
