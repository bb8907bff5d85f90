"""kvtrace validate: a clean trace passes; doctored ones fail on the rule they break.

The whole CLI runs; the unit tests are in tests/transforms/stats/test_validate.py."""

from __future__ import annotations

import json

import pytest

from helpers import anonymize, chat, write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.smoke  # in the fast set: one whole run per command (conftest)

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


def test_a_block_size_against_the_outputs_declared_one_is_refused_in_one_line(
    tiny_tokenizer, tmp_path, capsys
):
    """As every reader refuses it (analyze, reuse, ...): an output's hash_ids are blocks of the
    size its manifest declares, so another --block-size is an error, not a failed check."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(3)])
    assert anonymize(tiny_tokenizer, [src], tmp_path / "out", "--block-size", "4") == 0
    capsys.readouterr()
    assert main(["validate", str(tmp_path / "out"), "--block-size", "4"]) == 0
    assert main(["validate", str(tmp_path / "out"), "--block-size", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --block-size 8, but") and "declares 4" in err
    assert "\n" not in err
