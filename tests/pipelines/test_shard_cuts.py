"""Where each engine cuts a night's trace shards: at published minutes (ms from the origin, as
the rows publish them), the cuts the gate recomputes from the rows it reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import anonymize, assert_same_output, chat, write_jsonl

from transforms.ids.buckets import BUCKET_MS
from transforms.stats import audit as gate
from transforms.write import shards

pytestmark = pytest.mark.slow  # Beam runs: over a second

# 30 s into an absolute minute: minutes counted from the epoch would cut elsewhere.
ORIGIN = 1_700_000_010_000


def night(folder: Path) -> list[Path]:
    """Requests 25 s apart over five minutes, so each published minute holds two or three."""
    return [write_jsonl(folder / "night.jsonl",
                        [chat(i, ORIGIN + 25_000 * i, session=f"s{i % 2}") for i in range(12)])]


@pytest.mark.parametrize("coarse", [(), ("--timestamp-granularity-ms", "7000")])
def test_engines_cut_at_published_minutes_and_the_gate_recomputes_the_cuts(
        tiny_tokenizer, tmp_path, monkeypatch, coarse):
    monkeypatch.setattr(shards, "MAX_BLOCKS_PER_SHARD", 30)  # several shards of a small night
    inputs = night(tmp_path)
    for engine in ("local", "beam"):
        assert anonymize(tiny_tokenizer, inputs, tmp_path / engine, "--block-size", "4",
                         "--engine", engine, *coarse) == 0
    assert_same_output(tmp_path / "local", tmp_path / "beam")
    files = sorted((tmp_path / "local").glob("trace-*.jsonl"))
    assert len(files) >= 3
    minutes = [{json.loads(line)["timestamp"] // BUCKET_MS for line in f.read_text().splitlines()}
               for f in files]
    assert all(max(a) < min(b) for a, b in zip(minutes, minutes[1:]))  # never inside a minute
    report = gate.audit(str(tmp_path / "local"), tiny_tokenizer)
    assert report["publishable"], report["flags"]
