"""The Beam engine of `kvtrace analyze` gives the local engine's numbers.

The whole CLI runs; the unit tests are in tests/pipelines/test_analyze_beam.py."""

from __future__ import annotations

import json

import pytest

from helpers import write_jsonl
from kvtrace.cli import main


# Starting Beam takes ~9 s of a loaded run (CI runs it): the engines giving the same numbers is
# checked fast in tests/pipelines/test_analyze_beam.py
# (test_engines_agree_on_a_multi_file_trace_with_every_kind_of_problem), the local engine's
# refusal of Beam flags in tests/e2e/test_local_engine_cli.py.
@pytest.mark.slow
def test_cli_beam_engine(tmp_path, capsys):
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"timestamp": i, "input_length": 8, "output_length": 1, "hash_ids": [0, i + 1]}
            for i in range(4)
        ],
    )
    assert (
        main(
            [
                "analyze",
                str(trace),
                "--block-size",
                "4",
                "--engine",
                "beam",
                "--json",
                str(tmp_path / "r.json"),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "r.json").read_text())["hit_rates"]["block_weighted"] == 3 / 8
    assert main(["analyze", str(trace), "--direct_num_workers", "2"]) == 2
    assert "unknown options for the local engine" in capsys.readouterr().err
