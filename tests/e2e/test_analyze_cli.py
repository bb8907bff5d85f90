"""`kvtrace analyze`: equal to the reference tools, hand-computed metrics, malformed traces.

The whole CLI runs; the unit tests are in tests/transforms/stats/test_analyze.py."""

from __future__ import annotations

import json

import pytest

from helpers import write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.smoke  # in the fast set: one whole run per command (conftest)


def test_cli_exit_codes_and_json(tmp_path, capsys):
    good = write_jsonl(
        tmp_path / "good.jsonl", [{"timestamp": 0, "input_length": 4, "hash_ids": [0]}]
    )
    bad = write_jsonl(tmp_path / "bad.jsonl", ["nope", "[1]"])
    assert (
        main(["analyze", str(good), "--block-size", "4", "--json", str(tmp_path / "r.json")]) == 0
    )
    assert json.loads((tmp_path / "r.json").read_text())["total_requests"] == 1
    assert "Theoretical Hit Rates" in capsys.readouterr().out
    assert main(["analyze", str(bad)]) == 1
    assert "no trace rows could be read" in capsys.readouterr().err


def test_an_output_folder_is_read_once_with_its_manifest_block_size(tmp_path, capsys):
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    from kvtrace.cli import main

    rows = [
        {"timestamp": 0, "input_length": 40, "output_length": 1, "hash_ids": [0, 1, 2]},
        {"timestamp": 5, "input_length": 40, "output_length": 1, "hash_ids": [0, 1, 2]},
    ]
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "trace-00000-of-00001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), folder / "trace-00000-of-00001.parquet")
    sha256 = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    (folder / "manifest.json").write_text(
        json.dumps(
            {  # what readers check a folder against
                "format": "mooncake-trace",
                "block_size": 16,
                "sha256": sha256,
                "records": {"exported": 2},
            }
        )
    )
    for argument in (str(folder), str(folder / "trace*")):
        assert (
            main(
                [
                    "analyze",
                    argument,
                    "--json",
                    str(tmp_path / "r.json"),
                    "--output",
                    str(tmp_path / "report"),
                ]
            )
            == 0
        )
        report = json.loads((tmp_path / "r.json").read_text())
        assert report["total_requests"] == 2  # not 4: the Parquet twins are skipped
        assert report["block_size"] == 16  # from manifest.json, not the 512 default
        assert json.loads((tmp_path / "report" / "analysis.json").read_text()) == report
