"""kvtrace synthesize --engine beam: the local engine's bytes, from shards."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import shared_path, write_jsonl
from kvtrace.pipelines.synthesize_local import SynthesizeConfig, run_synthesize
from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.read.trace_io import read_trace
from kvtrace.transforms.synth.output import jsonl_bytes
from kvtrace.transforms.synth.parts import RowParts
from kvtrace.transforms.synth.reshape import Knobs
from kvtrace.transforms.synth.shards import VISIT, shared_counts, split_file, unit_keys
from kvtrace.transforms.synth.synthesize import SynthConfig, synthesize

BLOCK = 16


def visit(prefix: int, unit: int, rowkey: int) -> tuple:
    return (0, prefix, unit, rowkey)


def test_a_prefix_is_shared_when_two_conversations_visit_it_not_one_twice():
    table = np.array(
        [
            visit(1, 7, 10),
            visit(1, 7, 11),  # one conversation, two turns
            visit(2, 7, 10),
            visit(2, 8, 12),  # two conversations
            visit(3, 9, 13),
        ],
        dtype=VISIT,
    )
    counts = shared_counts(table)
    assert counts["rowkey"].tolist() == [10, 12] and counts["shared"].tolist() == [1, 1]
    assert counts["unit"].tolist() == [7, 8]
    assert len(shared_counts(np.empty(0, dtype=VISIT))) == 0


def conversations(tmp_path) -> list[str]:
    """Two files: sessions whose turns span both, requests without a session, a shared system
    prompt and a partial last block shared by two rows (FAST'25)."""
    rng = np.random.default_rng(3)
    rows, next_id = [], 100
    for s in range(8):
        ids = [0, 1, 2] if s % 3 else [0, 5]
        for turn in range(3):
            ids = ids + list(range(next_id, next_id + int(rng.integers(1, 4))))
            next_id += 4
            rows.append(
                {
                    "timestamp": 700 * s + 4000 * turn,
                    "input_length": len(ids) * BLOCK - 3,
                    "output_length": int(rng.integers(1, 90)),
                    "hash_ids": ids,
                    "session_id": f"c{s}" if s < 6 else None,
                }
            )
    rows += [
        {"timestamp": 9_000, "input_length": 40, "output_length": 4, "hash_ids": [0, 1, 9]}
    ] * 2
    rows.sort(key=lambda r: r["timestamp"])
    first = write_jsonl(tmp_path / "a.jsonl", rows[::2])
    second = write_jsonl(
        tmp_path / "b.jsonl", [{k: v for k, v in r.items() if v is not None} for r in rows[1::2]]
    )
    return [str(first), str(second)]


def test_per_shard_shared_counts_sum_to_the_local_ones(tmp_path):
    trace = read_trace(conversations(tmp_path))
    _, visits = split_file(trace, 1)
    for shards in (1, 3):
        summed = np.zeros(len(trace), dtype=np.int64)
        keys = (trace.file_index.astype(np.int64) << 40) | trace.line
        for s in range(shards):
            part = shared_counts(visits[visits["lo"] % np.uint64(shards) == s])
            np.add.at(summed, np.searchsorted(keys, part["rowkey"]), part["shared"])
        assert summed.tolist() == RowParts.of(trace, BLOCK).shared.tolist()
    assert len(set(unit_keys(trace).tolist())) == 6 + 6 + 2  # sessions, then lone requests


@pytest.mark.beam
@pytest.mark.parametrize(
    "config,shards",
    [
        (SynthConfig(), 3),
        (
            SynthConfig(
                Knobs(1.7, 0.6, 3),
                speedup_ratio=2.5,
                osl_multiplier=1.3,
                max_isl=90,
                min_osl=5,
                seed=4,
            ),
            2,
        ),
        (SynthConfig(Knobs(0.5, 2.0, 5), min_isl=30, seed=1), 1),
    ],
)
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_the_pipeline_writes_the_local_engines_bytes(tmp_path, config, shards):
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that

    from kvtrace.pipelines.synthesize_beam import build

    files = conversations(tmp_path)
    expected = jsonl_bytes(synthesize(read_trace(files), BLOCK, config))
    parts_dir = str(tmp_path / "parts")
    with TestPipeline() as pipeline:
        paths = build(pipeline, tuple(files), parts_dir, BLOCK, config, shards)
        assert_that(paths, lambda written: len(written) >= 1 or pytest.fail("no part written"))
    written = sorted((tmp_path / "parts").iterdir())
    assert b"".join(path.read_bytes() for path in written) == expected


@pytest.mark.beam
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_run_on_the_real_trace_gives_the_same_file_and_summary(tmp_path):
    from kvtrace.pipelines.synthesize_beam import run_synthesize_beam

    trace = str(shared_path("traces", "synthetic_trace.jsonl"))
    config = SynthConfig(Knobs(1.5, 0.8, 2), speedup_ratio=2, seed=9)
    summary = run_synthesize_beam(
        SynthesizeConfig((trace,), str(tmp_path / "out.jsonl"), 512, config), []
    )
    assert (tmp_path / "out.jsonl").read_bytes() == jsonl_bytes(
        synthesize(read_trace([trace]), 512, config)
    )
    assert not (tmp_path / "out.jsonl.parts").exists()
    assert summary["before"]["requests"] == 3993
    assert not any(summary["after"]["problems"].values())


@pytest.mark.beam
def test_sampling_new_requests_stays_local(tmp_path):
    from kvtrace.pipelines.synthesize_beam import run_synthesize_beam

    with pytest.raises(ConfigError, match="--engine local"):
        run_synthesize_beam(
            SynthesizeConfig(
                ("x.jsonl",), str(tmp_path / "o.jsonl"), 16, SynthConfig(num_requests=5)
            ),
            [],
        )


@pytest.mark.beam
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_an_empty_trace_gives_an_empty_output(tmp_path):
    from kvtrace.pipelines.synthesize_beam import run_synthesize_beam

    (tmp_path / "empty.jsonl").write_text("")
    summary = run_synthesize_beam(
        SynthesizeConfig(
            (str(tmp_path / "empty.jsonl"),), str(tmp_path / "out.jsonl"), 16, SynthConfig()
        ),
        [],
    )
    assert (tmp_path / "out.jsonl").read_bytes() == b""
    assert summary["before"]["requests"] == summary["after"]["requests"] == 0


@pytest.mark.beam
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_a_folder_output_is_the_local_engines_folder(tmp_path):
    from kvtrace.pipelines.synthesize_beam import run_synthesize_beam

    trace = str(shared_path("traces", "synthetic_trace.jsonl"))
    config = SynthConfig(Knobs(1.5, 0.8, 2), speedup_ratio=2, seed=9)
    run_synthesize_beam(SynthesizeConfig((trace,), str(tmp_path / "beam"), 16, config), [])
    run_synthesize(SynthesizeConfig((trace,), str(tmp_path / "local"), 16, config))
    for name in ("manifest.json", "trace-00000-of-00001.jsonl"):
        assert (tmp_path / "beam" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["beam", "local"]


@pytest.mark.beam
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_rows_of_one_time_come_out_alike_however_the_files_hold_them(tmp_path):
    """Rows sharing a time (sessions' turns, lone requests, rows alike in everything) in two
    files, shuffled and split otherwise: the pipeline writes the local engine's bytes of the
    whole, which rank_bucket would not by row key (file position)."""
    from apache_beam.testing.test_pipeline import TestPipeline

    from kvtrace.pipelines.synthesize_beam import build

    rng = np.random.default_rng(8)
    rows = [
        {
            "timestamp": int(rng.integers(0, 3)) * 1000,
            "input_length": 3 * BLOCK - 2,
            "output_length": int(rng.integers(1, 4)),
            "hash_ids": [0, int(rng.integers(1, 3)), int(rng.integers(3, 6))],
            **({"session_id": f"s{rng.integers(0, 3)}"} if rng.random() < 0.5 else {}),
        }
        for _ in range(24)
    ]
    rows += rows[:4]  # rows alike in everything
    config = SynthConfig(Knobs(1.5, 0.7, 2), speedup_ratio=2.0, seed=2)
    whole = [str(write_jsonl(tmp_path / "whole.jsonl", rows))]
    expected = jsonl_bytes(synthesize(read_trace(whole), BLOCK, config))
    shuffled = [rows[i] for i in rng.permutation(len(rows))]
    files = [
        str(write_jsonl(tmp_path / "b.jsonl", shuffled[11:])),
        str(write_jsonl(tmp_path / "a.jsonl", shuffled[:11])),
    ]
    for shards in (1, 3):
        parts_dir = tmp_path / f"parts{shards}"
        with TestPipeline() as pipeline:
            build(pipeline, tuple(files), str(parts_dir), BLOCK, config, shards)
        written = sorted(parts_dir.iterdir())
        assert b"".join(path.read_bytes() for path in written) == expected, shards
