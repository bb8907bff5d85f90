"""kvtrace convert: Bailian usage traces become Mooncake rows with sessions.

The whole CLI runs; the unit tests are in tests/transforms/read/test_bailian.py."""

from __future__ import annotations

import json

from helpers import read_jsonl, write_jsonl
from kvtrace.cli import main


def bailian(chat, parent, ts, isl, ids, turn=1) -> dict:
    return {
        "chat_id": chat,
        "parent_chat_id": parent,
        "timestamp": ts,
        "input_length": isl,
        "output_length": 5,
        "type": "text",
        "turn": turn,
        "hash_ids": ids,
    }


ROWS = [
    bailian(159, -1, 61.114, 40, [1, 2, 3]),
    bailian(160, 159, 62.5, 70, [1, 2, 3, 4, 5], 2),
    bailian(161, 160, 64.0, 90, [1, 2, 3, 4, 5, 6], 3),
    bailian(170, 99, 60.0, 17, [7, 8], 3),  # parent not in this subset
    bailian(171, 99, 63.0, 17, [7, 9], 3),
    bailian(300, -1, 65.25, 10, [10]),
]


def test_the_cli_writes_a_folder_the_other_commands_read(tmp_path, capsys):
    src = write_jsonl(tmp_path / "bailian.jsonl", ROWS)
    assert main(["convert", str(src), "-o", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["block_size"] == 16
    assert len(read_jsonl(next((tmp_path / "out").glob("trace-*.jsonl")))) == len(ROWS)
    assert main(["validate", str(tmp_path / "out")]) == 0
    capsys.readouterr()


def test_a_bare_jsonl_is_refused_as_it_would_forget_its_block_size(tmp_path, capsys):
    src = write_jsonl(tmp_path / "bailian.jsonl", ROWS)
    assert main(["convert", str(src), "-o", str(tmp_path / "one.jsonl")]) == 2
    error = capsys.readouterr().err
    assert "block size 512" in error and "-o DIR" in error and len(error.splitlines()) == 1
    assert not (tmp_path / "one.jsonl").exists()
