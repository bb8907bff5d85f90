"""kvtrace validate: a clean trace passes; doctored ones fail on the rule they break.

The whole CLI runs; the unit tests are in tests/transforms/stats/test_validate.py."""

from __future__ import annotations

import json

from helpers import write_jsonl
from kvtrace.cli import main

CLEAN = [
    {"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [0, 1, 2]},
    {"timestamp": 5, "input_length": 33, "output_length": 3, "hash_ids": [0, 1, 3]},
    {"timestamp": 9, "input_length": 16, "output_length": 3, "hash_ids": [0]},
]


def test_the_cli_exit_code_report_and_json(tmp_path, capsys):
    path = write_jsonl(tmp_path / "t.jsonl", CLEAN)
    assert (
        main(["validate", str(path), "--block-size", "16", "--json", str(tmp_path / "r.json")]) == 0
    )
    assert capsys.readouterr().out.strip().endswith("valid")
    assert json.loads((tmp_path / "r.json").read_text())["valid"] is True
    assert main(["validate", str(path), "--block-size", "64"]) == 1
    assert "NOT VALID" in capsys.readouterr().out
    (tmp_path / "manifest.json").write_text(json.dumps({"block_size": 8}))
    # Only the manifest of the kvtrace output whose rows are read declares a block size (the
    # one pinned with its shards: test_published_folders); t.jsonl is no output's shard.
    assert main(["validate", str(path)]) == 0
