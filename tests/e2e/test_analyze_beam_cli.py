"""The Beam engine of `kvtrace analyze` gives the local engine's numbers.

The whole CLI runs; the unit tests are in tests/pipelines/test_analyze_beam.py."""

from __future__ import annotations

import json

from helpers import write_jsonl

from kvtrace.cli import main


def test_cli_beam_engine(tmp_path, capsys):
    trace = write_jsonl(tmp_path / "t.jsonl", [
        {"timestamp": i, "input_length": 8, "output_length": 1, "hash_ids": [0, i + 1]} for i in range(4)
    ])
    assert main(["analyze", str(trace), "--block-size", "4", "--engine", "beam",
                 "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["hit_rates"]["block_weighted"] == 3 / 8
    assert main(["analyze", str(trace), "--direct_num_workers", "2"]) == 2
    assert "unknown options for the local engine" in capsys.readouterr().err
