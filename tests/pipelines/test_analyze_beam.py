"""The Beam engine of `kvtrace analyze` gives the local engine's numbers."""

from __future__ import annotations

import json
import math

import pytest

from helpers import shared_path, write_jsonl
from kvtrace.pipelines.analyze_local import AnalyzeConfig, analyze_local

pytestmark = pytest.mark.beam  # imports Beam: its tests share one worker


def assert_same(beam, local, path="") -> None:
    if isinstance(local, dict):
        assert set(beam) == set(local), path
        for key in local:
            assert_same(beam[key], local[key], f"{path}.{key}")
    elif isinstance(local, (int, float)) and not isinstance(local, bool):
        assert math.isclose(beam, local, rel_tol=1e-9, abs_tol=1e-12), (path, beam, local)
    else:
        assert beam == local, path


def both(config: AnalyzeConfig) -> tuple[dict, dict]:
    # Through JSON, as the CLI writes them.
    from kvtrace.pipelines.analyze_beam import analyze_beam

    return (
        json.loads(json.dumps(analyze_beam(config, []))),
        json.loads(json.dumps(analyze_local(config))),
    )


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_engines_agree_on_a_multi_file_trace_with_every_kind_of_problem(tmp_path):
    first = write_jsonl(
        tmp_path / "a.jsonl",
        [
            {
                "timestamp": 0,
                "input_length": 9,
                "output_length": 1,
                "hash_ids": [0, 1],
                "session_id": "a",
            },
            {
                "timestamp": 50,
                "input_length": 8,
                "output_length": 2,
                "hash_ids": [0, 2],
                "session_id": "b",
            },
            {
                "timestamp": 40,
                "input_length": 8,
                "output_length": 3,
                "hash_ids": [1, 0],
                "session_id": "a",
            },
            "garbage",
        ],
    )
    second = write_jsonl(
        tmp_path / "b.jsonl",
        [
            {"timestamp": 30, "input_length": 4, "output_length": 1, "hash_ids": [0]},
            {"timestamp": 60, "input_length": 0, "output_length": 1, "hash_ids": []},
            {
                "timestamp": 60,
                "input_length": 12,
                "output_length": 5,
                "hash_ids": [0, 2, 3],
                "session_id": "c",
            },
        ],
    )
    beam, local = both(AnalyzeConfig((str(first), str(second)), block_size=4, shards=3))
    assert local["problems"]["timestamps_backwards"]["count"] == 2  # within a file and across
    assert_same(beam, local)


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_engines_agree_on_the_synthetic_trace():
    path = str(shared_path("traces", "synthetic_trace.jsonl"))
    assert_same(*both(AnalyzeConfig((path,), block_size=512, shards=8)))
