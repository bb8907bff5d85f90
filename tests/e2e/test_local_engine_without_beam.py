"""The local engine never imports Beam, with or without an id map: whole `kvtrace anonymize
--engine local` runs in a fresh process, its modules looked at after each (Beam's import costs
seconds, and docs/ANONYMIZE.md promises the local engine does without it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import ROOT, chat, write_jsonl

# Runs the CLI once per argument list, saying after each which Beam modules are imported.
PROBE = """
import json, sys
from kvtrace.cli import main
for flags in json.loads(sys.argv[1]):
    assert main(flags) == 0
    print(json.dumps(sorted(m for m in sys.modules
                            if m == "apache_beam" or m.startswith("apache_beam."))))
"""


# Two runs in a fresh interpreter, ~10 s of a loaded run (CI runs it): that no module the local
# engine reaches imports Beam is checked fast, from the source, by tests/test_layout.py
# (test_only_beam_drivers_import_beam).
@pytest.mark.slow
def test_local_runs_with_and_without_an_id_map_import_no_beam(tiny_tokenizer, tmp_path):
    inputs = write_jsonl(
        tmp_path / "in.jsonl", [chat(i, 1_000 + i, session=f"s{i % 2}") for i in range(6)]
    )
    (tmp_path / "salt").write_bytes(b"a salt of at least thirty-two bytes, kept" * 2)

    def flags(output: str, *more: str) -> list[str]:
        return [
            "anonymize",
            "--engine",
            "local",
            "--input",
            str(inputs),
            "--output",
            str(tmp_path / output),
            "--tokenizer",
            tiny_tokenizer,
            "--block-size",
            "4",
            "--salt-file",
            str(tmp_path / "salt"),
            *more,
        ]

    runs = [flags("plain"), flags("mapped", "--id-map", str(tmp_path / "map"))]
    run = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(runs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert [json.loads(line) for line in run.stdout.splitlines() if line.startswith("[")] == [
        [],
        [],
    ]
    assert (tmp_path / "map" / "CURRENT").exists()  # the map was opened, extended, committed
    assert (tmp_path / "mapped" / "manifest.json").exists()
