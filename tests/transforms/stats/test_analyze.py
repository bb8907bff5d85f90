"""`kvtrace analyze`: equal to the reference tools, hand-computed metrics, malformed traces."""

from __future__ import annotations

import json
import math

import pytest

from helpers import shared_path, write_jsonl
from kvtrace.commands.analyze_text import ascii_table, compatible_table, rounded
from kvtrace.pipelines.analyze_local import AnalyzeConfig, analyze_local
from kvtrace.transforms.cache.capacity import percent


def analyze(path, block_size=4, warmup=0.5) -> dict:
    return analyze_local(AnalyzeConfig((str(path),), block_size, warmup))


def assert_close(ours, reference, path="") -> None:
    if isinstance(reference, dict):
        for key, value in reference.items():
            assert_close(ours[key], value, f"{path}.{key}")
    else:
        assert math.isclose(ours, reference, rel_tol=1e-9, abs_tol=0), (path, ours, reference)


def test_equals_aiperf_reference_on_synthetic_trace():
    report = analyze(shared_path("traces", "synthetic_trace.jsonl"), block_size=512)
    reference = json.loads(
        shared_path("traces", "reference_synthetic_aiperf_analyze.json").read_text()
    )
    assert_close(report, reference)


def test_prints_dynamo_reference_table_on_synthetic_trace():
    """Dynamo's table, each of its figures rounded as analyze prints them for people, its hit
    rates (Dynamo's fractions) in percent as every command prints them."""
    report = analyze(shared_path("traces", "synthetic_trace.jsonl"), block_size=512)
    text = shared_path("traces", "reference_synthetic_dynamo_datagen_analyze.txt").read_text()
    cells = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]
    header, *rows = cells
    *lengths, (hit_label, *hit_rates) = rows
    assert hit_label == "Theoretical Hit Rates"
    table = ascii_table(
        header,
        [[label, *map(rounded, map(float, r))] for label, *r in lengths]
        + [[hit_label, *map(percent, map(float, hit_rates))]],
    )
    assert compatible_table(report) == table
    assert "15325.476584022039" in text and " 15,325 " in table  # what people read instead


def test_figures_are_rounded_for_people():
    figures = [0.0, 10.0, 2677.841851494696, 44.666666666666664, 0.22874860857702703, 7.5, -0.5]
    assert list(map(rounded, figures)) == ["0", "10", "2,678", "44.67", "0.2287", "7.5", "-0.5"]


def test_cache_sizing_hit_rates_on_synthetic_trace_match_the_published_figures():
    rates = analyze(shared_path("traces", "synthetic_trace.jsonl"), block_size=512)["hit_rates"]
    # ../shared/traces/README.md: 0.423, 0.640, 0.651 and 0.863 after 50% warm-up.
    assert round(rates["per_request_mean"], 3) == 0.423
    assert round(rates["block_weighted"], 3) == 0.640
    assert round(rates["token_weighted"], 3) == 0.651
    assert round(rates["token_weighted_after_warmup"], 3) == 0.863


def test_hand_computed_tiny_trace(tmp_path):
    # block size 4; rows in file order; row 2 repeats row 0 exactly (partial block shared).
    rows = [
        {"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": [0, 1]},
        {"timestamp": 5, "input_length": 8, "output_length": 2, "hash_ids": [0, 2]},
        {"timestamp": 5, "input_length": 6, "output_length": 3, "hash_ids": [0, 1]},
        {"timestamp": 9, "input_length": 0, "output_length": 4, "hash_ids": []},
    ]
    report = analyze(write_jsonl(tmp_path / "t.jsonl", rows))
    # aiperf hit rate: row0 0/2, row1 1/2, row2 2/2; the empty row is skipped.
    assert report["cache_hit_rate"] == pytest.approx((0 + 0.5 + 1) / 3)
    # (pos, id) pairs: (0,0) x3, (1,1) x2, (1,2) x1 -> contexts 6 (all repeat), 4, 6, 0 (no ids)
    assert report["context_length_stats"]["max"] == 6 and report["context_length_stats"]["min"] == 0
    assert report["unique_prefixes"] == 3 and report["num_prefix_groups"] == 1
    assert report["prefix_reuse_ratio"] == pytest.approx(5 / 6)
    rates = report["hit_rates"]
    # tokens: row0 4+2 (all miss), row1 4 hit + 4 miss, row2 4+2 hit -> 10 hit of 20
    assert rates["token_weighted"] == pytest.approx(10 / 20)
    assert rates["block_weighted"] == pytest.approx(3 / 6)
    assert rates["per_request_mean"] == pytest.approx((0 + 0.5 + 1) / 3)
    # after the first 50% (2 of 4 rows): rows 2 and 3 -> 6 of 6 tokens hit
    assert rates["token_weighted_after_warmup"] == pytest.approx(1.0)
    assert rates["working_set"] == {"unique_blocks": 3, "unique_tokens": 10}


def test_equal_timestamps_break_ties_by_file_order(tmp_path):
    rows = [
        {"timestamp": 7, "input_length": 4, "output_length": 1, "hash_ids": [0]},
        {"timestamp": 7, "input_length": 4, "output_length": 1, "hash_ids": [0]},
    ]
    rates = analyze(write_jsonl(tmp_path / "t.jsonl", rows))["hit_rates"]
    assert rates["block_weighted"] == 0.5 and rates["per_request_mean"] == 0.5


def test_causal_order_follows_timestamps_not_file_order(tmp_path):
    rows = [
        {"timestamp": 9, "input_length": 8, "output_length": 1, "hash_ids": [0, 1]},
        {"timestamp": 1, "input_length": 4, "output_length": 1, "hash_ids": [0]},
    ]
    report = analyze(write_jsonl(tmp_path / "t.jsonl", rows))
    # The later row (file line 1) finds block 0 cached by the earlier one (line 2).
    assert report["hit_rates"]["token_weighted"] == pytest.approx(4 / 12)
    assert report["problems"]["timestamps_backwards"]["count"] == 1


def test_problems_are_reported_with_lines(tmp_path):
    lines = [
        {
            "timestamp": 0,
            "input_length": 9,
            "output_length": 1,
            "hash_ids": [0, 1],
        },  # 9 tokens need 3
        "not json",
        {
            "timestamp": 1,
            "input_length": 8,
            "output_length": 1,
            "hash_ids": [1, 0],
        },  # ids swap places
        {"timestamp": 2, "input_length": "x", "hash_ids": []},
    ]
    report = analyze(write_jsonl(tmp_path / "t.jsonl", lines))
    problems = report["problems"]
    assert report["total_requests"] == 2
    assert problems["hash_ids_length_mismatch"]["count"] == 1
    assert problems["hash_ids_length_mismatch"]["examples"][0]["line"] == 1
    assert problems["ids_at_several_positions"]["examples"] == [0, 1]
    assert problems["ids_behind_several_parents"]["count"] == 2
    assert [m["line"] for m in problems["malformed_lines"]["examples"]] == [2, 4]


def test_reads_parquet_written_by_anonymize_like_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"timestamp": i, "input_length": 5, "output_length": 1, "hash_ids": [0, i + 1]}
        for i in range(5)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    from_parquet = analyze(tmp_path / "t.parquet")
    from_jsonl = analyze(write_jsonl(tmp_path / "t.jsonl", rows))
    # Only the file names in the problem examples differ.
    assert from_parquet.pop("problems").keys() == from_jsonl.pop("problems").keys()
    assert from_parquet == from_jsonl


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_temporaries_change_no_number(tmp_path, monkeypatch, chunk):
    """Per-block work runs in chunks to bound memory; chunk edges must not show. The trace mixes
    chained rows, an id at two positions, an id behind two parents and timestamps out of order."""
    rows = [
        {
            "timestamp": t,
            "input_length": max(512 * len(ids) - 100, 0),
            "output_length": 3,
            "hash_ids": ids,
        }
        for t, ids in [
            (0, [0, 1, 2]),
            (5, [0, 1, 3, 4]),
            (3, [5, 0]),
            (9, [0, 6, 2]),
            (9, [7]),
            (12, [0, 1, 2, 8, 9, 10]),
            (11, [5, 0, 11]),
            (20, []),
        ]
    ]
    src = write_jsonl(tmp_path / "t.jsonl", rows)
    reference = analyze_local(AnalyzeConfig((str(src),)))
    monkeypatch.setattr("kvtrace.transforms.stats.trace_blocks.CHUNK_BLOCKS", chunk)
    assert analyze_local(AnalyzeConfig((str(src),))) == reference
    assert reference["problems"]["ids_at_several_positions"]["count"] > 0
    assert reference["problems"]["ids_behind_several_parents"]["count"] > 0
