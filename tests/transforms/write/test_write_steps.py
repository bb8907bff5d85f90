"""write/steps.py: WriteShard in a pipeline writes each shard named by the plan's count, its
coarsened rows, and its block hashes owner-only where asked."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from kvtrace.transforms.trace_format import NO_RESPONSE_MS, NO_SESSION, columns_of_jsonl
from kvtrace.transforms.write.coarsen import Coarsening
from kvtrace.transforms.write.rows import ROW, RowBatch

pytestmark = pytest.mark.beam  # imports Beam: its tests share one worker

ORIGIN = 1_000_000


def _batch(ms: list[int]) -> RowBatch:
    rows = np.zeros(len(ms), dtype=ROW)
    rows["timestamp_ms"], rows["input_length"], rows["output_length"] = ms, 8, 149
    rows["session_id"], rows["response_ms"], rows["num_ids"] = NO_SESSION, NO_RESPONSE_MS, 1
    ids = np.arange(len(ms), dtype=np.int64)
    return RowBatch(rows, ids, ids.astype(np.uint64) + np.uint64(99))


def test_each_shard_is_written_under_the_plans_count_coarsened_with_its_hashes(tmp_path):
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.write.steps import WriteShard

    out, hashes = tmp_path / "out", tmp_path / "hashes"
    plan = np.array([0, 5, 9])  # three shards; shard 1 gets only the None that marks shard 0
    elements = [
        (0, [None, _batch([ORIGIN + 40, ORIGIN + 260])]),
        (1, []),
        (2, [_batch([ORIGIN + 9 * 60_000])]),
    ]
    with TestPipeline() as pipeline:
        written = (
            pipeline
            | beam.Create(elements)
            | beam.ParDo(
                WriteShard(str(out), Coarsening(100, 100), str(hashes)), plan, ORIGIN, object()
            )
        )
        assert_that(
            written | beam.MapTuple(lambda path, sha: os.path.basename(path)),
            equal_to(
                [
                    f"trace-0000{s}-of-00003.{kind}"
                    for s in range(3)
                    for kind in ("jsonl", "parquet")
                ]
            ),
        )
    first = columns_of_jsonl((out / "trace-00000-of-00003.jsonl").read_bytes())
    assert first.timestamp.tolist() == [0, 300] and first.output_length.tolist() == [100, 100]
    assert (out / "trace-00001-of-00003.jsonl").read_bytes() == b""
    names = sorted(os.listdir(hashes))
    assert names == [f"block-hashes-0000{s}-of-00003.parquet" for s in range(3)]
    assert all(stat.S_IMODE(os.stat(hashes / n).st_mode) & 0o077 == 0 for n in names)
