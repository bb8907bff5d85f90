"""kvtrace validate: a clean trace passes; doctored ones fail on the rule they break."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import shared_path, write_jsonl
from kvtrace.transforms.read.trace_io import Trace, read_trace
from kvtrace.transforms.stats.validate import block_size_fit, validate

CLEAN = [
    {"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [0, 1, 2]},
    {"timestamp": 5, "input_length": 33, "output_length": 3, "hash_ids": [0, 1, 3]},
    {"timestamp": 9, "input_length": 16, "output_length": 3, "hash_ids": [0]},
]


def failing(report: dict) -> dict:
    return {c["rule"]: c["count"] for c in report["checks"] if c["count"]}


def check(tmp_path, rows, block_size=16) -> dict:
    return validate(
        read_trace([str(write_jsonl(tmp_path / "t.jsonl", rows))]), block_size, "--block-size"
    )


def test_a_clean_trace_is_valid(tmp_path):
    report = check(tmp_path, CLEAN)
    assert report["valid"] and not failing(report)
    assert report["block_size"]["inferred"]["low"] == 16  # 16 tokens in one id
    assert report["block_size"]["inferred"]["high"] == 16  # (33 - 1) // 2


def test_ids_made_at_another_block_size_are_caught(tmp_path):
    # Every row also has ceil(L / 64) ids, so only the inference sees the block size is wrong.
    rows = [
        {"timestamp": 0, "input_length": 500, "output_length": 1, "hash_ids": [0, 1, 2, 3]},
        {"timestamp": 1, "input_length": 400, "output_length": 1, "hash_ids": [0, 1, 2, 4]},
    ]
    report = check(tmp_path, rows, block_size=16)
    assert failing(report) == {"hash_ids_length_mismatch": 2, "block_size": 1}
    assert report["block_size"]["inferred"]["best"] == 128


@pytest.mark.parametrize(
    "doctor,rule",
    [
        (lambda rows: rows[1].update(hash_ids=[0, 1]), "hash_ids_length_mismatch"),  # short
        (lambda rows: rows[1].update(hash_ids=[0, 2, 3]), "ids_at_several_positions"),
        (lambda rows: rows[1].update(hash_ids=[5, 1, 3]), "ids_behind_several_parents"),
        (lambda rows: rows[0].update(timestamp=-3), "negative_timestamps"),
        (lambda rows: rows[2].update(timestamp=1), "timestamps_backwards"),
        (lambda rows: rows.append('{"timestamp": 3, "input_length": "40"}'), "malformed_lines"),
    ],
)
def test_a_doctored_trace_fails_on_its_rule(tmp_path, doctor, rule):
    rows = [dict(r) for r in CLEAN]
    doctor(rows)
    report = check(tmp_path, rows)
    assert not report["valid"] and rule in failing(report)


def test_the_published_trace_is_valid_at_512_only():
    trace = read_trace([str(shared_path("traces", "synthetic_trace.jsonl"))])
    fit = block_size_fit(trace)
    assert (fit.low, fit.high) == (512, 512)
    assert validate(trace, 512, "flag")["valid"] and not validate(trace, 256, "flag")["valid"]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 600), st.lists(st.integers(1, 5000), min_size=1, max_size=30))
def test_the_block_size_a_trace_was_made_with_always_fits(block_size, lengths):
    isl = np.array(lengths, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(-(-isl // block_size))])
    trace = Trace(
        np.arange(len(isl), dtype=np.float64),
        isl,
        np.ones_like(isl),
        offsets,
        np.arange(offsets[-1]),
        None,
        np.arange(1, len(isl) + 1),
        np.zeros(len(isl), np.int32),
        ["h"],
    )
    fit = block_size_fit(trace)
    assert fit.fits_all(block_size) and fit.best_rows == len(lengths)
    assert validate(trace, block_size, "flag")["valid"]


HOSTILE = [
    '{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [0, 1]}',
    '{"timestamp": 1, "input_length": -5, "output_length": 2, "hash_ids": [0]}',
    '{"timestamp": 2, "input_length": 20, "output_length": 2, "hash_ids": ["a", 1]}',
    '{"timestamp": 3, "input_length": 20, "output_length": 2, "hash_ids": [[0], 1]}',
    '{"timestamp": NaN, "input_length": 20, "output_length": 2, "hash_ids": [0, 1]}',
    '{"timestamp": 4, "input_length": 20, "output_length": 2, "hash_ids": [1180591620717411303424, 1]}',
    '{"timestamp": 5, "input_length": 1e30, "output_length": 2, "hash_ids": [0, 1]}',
    "[1, 2, 3]",
    "null",
    '"str"',
    '{"timestamp": 6}',
    '{"timestamp": 7, "input_length": 20, "output_length": 2, "hash_ids": [0, 1], "session_id": {"x": 1}}',
]


def test_hostile_lines_are_counted_as_malformed_and_good_ones_kept(tmp_path):
    report = check(tmp_path, HOSTILE)
    assert report["rows"] == 1 and failing(report) == {"malformed_lines": len(HOSTILE) - 1}


def test_a_parquet_trace_with_sessions_of_any_type_is_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": [0, 1],
                "input_length": [20, 20],
                "output_length": [1, 1],
                "hash_ids": [[0, 1], [0, 2]],
                "session_id": [[1, 2], [1, 2]],
            }
        ),
        path,
    )
    trace = read_trace([str(path)])
    assert trace.session.tolist() == ["[1, 2]", "[1, 2]"]  # one conversation, by its JSON text
    assert validate(trace, 16, "flag")["valid"]
