"""Where each engine cuts a night's trace shards: at published minutes (ms from the origin, as
the rows publish them), the cuts the gate recomputes from the rows it reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import anonymize, assert_same_output, chat, kvtrace_child, write_jsonl
from kvtrace.transforms.ids.buckets import BUCKET_MS
from kvtrace.transforms.stats import audit as gate
from kvtrace.transforms.trace_format import (
    MANIFEST,
    canonical_json,
    columns_of_jsonl,
    jsonl_bytes,
    parquet_bytes,
    shard_name,
)
from kvtrace.transforms.write import shards
from kvtrace.transforms.write.manifest import set_content_times
from kvtrace.transforms.write.publish import sha256_of

pytestmark = pytest.mark.slow  # Beam runs: over a second

# 30 s into an absolute minute: minutes counted from the epoch would cut elsewhere.
ORIGIN = 1_700_000_010_000


def night(folder: Path) -> list[Path]:
    """Requests 25 s apart over five minutes, so each published minute holds two or three."""
    return [
        write_jsonl(
            folder / "night.jsonl",
            [chat(i, ORIGIN + 25_000 * i, session=f"s{i % 2}") for i in range(12)],
        )
    ]


SMALL_SHARDS = "from kvtrace.transforms.write import shards\nshards.MAX_BLOCKS_PER_SHARD = 30"


@pytest.mark.parametrize("coarse", [(), ("--timestamp-granularity-ms", "7000")])
def test_engines_cut_at_published_minutes_and_the_gate_recomputes_the_cuts(
    tiny_tokenizer, tmp_path, monkeypatch, coarse
):
    [log] = night(tmp_path)
    for engine in ("local", "beam"):
        # In a process of its own, several shards of a small night: the Beam engine's child is
        # forked there and sees the smaller bound (one started clean, as from a test worker
        # that loaded gRPC, would not).
        done = kvtrace_child(
            *("anonymize", "--input", str(log), "--output", str(tmp_path / engine)),
            *("--tokenizer", tiny_tokenizer, "--block-size", "4", "--engine", engine, *coarse),
            prelude=SMALL_SHARDS,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    assert_same_output(tmp_path / "local", tmp_path / "beam")
    files = sorted((tmp_path / "local").glob("trace-*.jsonl"))
    assert len(files) >= 3
    minutes = [
        {json.loads(line)["timestamp"] // BUCKET_MS for line in f.read_text().splitlines()}
        for f in files
    ]
    assert all(max(a) < min(b) for a, b in zip(minutes, minutes[1:]))  # never inside a minute
    # 7000 ms is no round step: the gate passes it only as the operator confirms it.
    settings = {"timestamp_ms": int(coarse[1])} if coarse else None
    monkeypatch.setattr(shards, "MAX_BLOCKS_PER_SHARD", 30)  # the gate cuts as the runs did
    report = gate.audit(str(tmp_path / "local"), tiny_tokenizer, settings=settings)
    assert report["publishable"], report["flags"]


def test_a_cut_moved_by_one_row_is_flagged(tiny_tokenizer, tmp_path, monkeypatch):
    """As many shards as kvtrace writes, every file kvtrace's bytes for its rows, the manifest
    agreeing: only the cut is elsewhere (shard 1's first row at the end of shard 0)."""
    monkeypatch.setattr(shards, "MAX_BLOCKS_PER_SHARD", 30)
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, night(tmp_path), out, "--block-size", "4") == 0
    assert len(list(out.glob("trace-*.jsonl"))) == 4
    first, second = (out / shard_name(i, 4, ".jsonl") for i in (0, 1))
    lines = [
        first.read_bytes().splitlines(keepends=True),
        second.read_bytes().splitlines(keepends=True),
    ]
    moved = [b"".join(lines[0] + lines[1][:1]), b"".join(lines[1][1:])]
    for shard, data in enumerate(moved):
        columns = columns_of_jsonl(data)
        (out / shard_name(shard, 4, ".jsonl")).write_bytes(jsonl_bytes(columns))
        (out / shard_name(shard, 4, ".parquet")).write_bytes(parquet_bytes(columns))
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["sha256"] = {name: sha256_of((out / name).read_bytes()) for name in manifest["files"]}
    (out / MANIFEST).write_bytes(canonical_json(manifest))
    set_content_times(str(out))
    assert gate.audit(str(out), tiny_tokenizer)["flags"] == [
        "trace shard 0 is not cut where kvtrace cuts the rows (consecutive published minutes up "
        "to 30 blocks each)"
    ]
