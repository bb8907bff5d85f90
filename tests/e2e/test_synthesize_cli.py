"""kvtrace synthesize: every knob does what it says, and every output row stays valid.

The whole CLI runs; the unit tests are in tests/transforms/synth/test_synthesize.py."""

from __future__ import annotations

import json

import pytest

from helpers import shared_path
from kvtrace.cli import main

pytestmark = pytest.mark.smoke  # in the fast set: one whole run per command (conftest)


def test_the_same_seed_gives_the_same_bytes(tmp_path):
    trace = str(shared_path("traces", "synthetic_trace.jsonl"))
    common = ["synthesize", trace, "--prefix-root-multiplier", "3", "--num-requests", "500"]
    for name, seed in (("a", "7"), ("b", "7"), ("c", "8")):
        assert main([*common, "-o", str(tmp_path / f"{name}.jsonl"), "--seed", seed]) == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert (tmp_path / "a.jsonl").read_bytes() != (tmp_path / "c.jsonl").read_bytes()


def test_cli_prints_before_and_after_and_refuses_bad_values(tmp_path, capsys):
    trace = str(shared_path("traces", "synthetic_trace.jsonl"))
    summary = tmp_path / "summary.json"
    assert (
        main(
            [
                "synthesize",
                trace,
                "-o",
                str(tmp_path / "out.jsonl"),
                "--speedup-ratio",
                "2",
                "--json",
                str(summary),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| requests / minute (mean) | 221.8 | 443.7 |" in out and "(valid, block size 512" in out
    numbers = json.loads(summary.read_text())
    assert numbers["after"]["requests"] == numbers["before"]["requests"] == 3993
    for ratio in ("0", "-1", "nan", "inf"):  # one line, before any work: nothing written
        assert (
            main(["synthesize", trace, "-o", str(tmp_path / "x.jsonl"), "--speedup-ratio", ratio])
            == 2
        )
        assert capsys.readouterr().err.startswith("error: --speedup-ratio must be a number in")
        assert not (tmp_path / "x.jsonl").exists()
    assert (
        main(
            [
                "synthesize",
                trace,
                "-o",
                str(tmp_path / "x.jsonl"),
                "--min-isl",
                "9",
                "--max-isl",
                "3",
            ]
        )
        == 2
    )
