"""One unit per quantity (issue 35): every command prints a hit rate or share as the report
does, in percent (capacity.percent), the same figure to the same digit; the JSON outputs keep
the exact fractions.

The whole CLI runs on one small trace with reuse inside and across sessions."""

from __future__ import annotations

import html
import json
import re

import pytest

from helpers import write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.cache.capacity import percent

# analyze's line names (its JSON's keys) and the report's rows for the same figures.
HIT_RATES = {
    "token_weighted": "token weighted",
    "block_weighted": "block weighted",
    "per_request_mean": "per request mean (causal)",
    "token_weighted_after_warmup": "token weighted after warm-up",
}
FRACTION = re.compile(r"(?<![\d.])0\.\d{3,}")  # 0.4060: a share printed as a fraction


@pytest.fixture
def trace(tmp_path):
    rows = [  # three prefixes of two blocks, each row's last block its own, partly filled
        {
            "timestamp": 1_000 * i,
            "input_length": 12 - i % 4,
            "output_length": 3,
            "hash_ids": [i % 3, 3 + i % 3, 100 + i],
        }
        for i in range(40)
    ]
    return str(write_jsonl(tmp_path / "trace.jsonl", rows))


def analyze(trace, tmp_path, capsys) -> tuple[dict, str]:
    report = tmp_path / "analysis.json"
    assert main(["analyze", trace, "--block-size", "4", "--json", str(report)]) == 0
    return json.loads(report.read_text()), capsys.readouterr().out


def test_analyze_and_synthesize_print_percent_and_write_fractions(trace, tmp_path, capsys):
    numbers, text = analyze(trace, tmp_path, capsys)
    lines = text.splitlines()
    for key in HIT_RATES:
        value = numbers["hit_rates"][key]
        assert 0 < value < 1  # the JSON's machine value: a fraction, exact
        assert any(line.split()[:2] == [key, percent(value)] for line in lines), key
    assert f"cache_hit_rate {percent(numbers['cache_hit_rate'])}: " in text
    assert f"prefix reuse ratio: {percent(numbers['prefix_reuse_ratio'])}" in text
    hit_row = next(line for line in lines if "Theoretical Hit Rates" in line)
    assert percent(numbers["hit_rate_stats"]["mean"]) in hit_row
    assert not FRACTION.search(text), FRACTION.search(text)

    summary = tmp_path / "summary.json"
    synthesized = ["synthesize", trace, "--block-size", "4", "-o", str(tmp_path / "syn")]
    assert main([*synthesized, "--json", str(summary)]) == 0
    table = capsys.readouterr().out
    before = json.loads(summary.read_text())["before"]
    assert before["hit_rate_token_weighted"] == numbers["hit_rates"]["token_weighted"]
    for key, figure in (
        ("hit_rate_token_weighted", numbers["hit_rates"]["token_weighted"]),
        ("hit_rate_after_warmup", numbers["hit_rates"]["token_weighted_after_warmup"]),
        ("cache_hit_rate_aiperf", numbers["cache_hit_rate"]),
    ):
        assert f"| {percent(figure)} |" in table, key  # analyze's figure, in analyze's unit
    assert not FRACTION.search(table), FRACTION.search(table)


@pytest.mark.slow  # the report draws six plots: over a second
def test_the_report_prints_each_rate_as_analyze_does(trace, tmp_path, capsys):
    numbers, text = analyze(trace, tmp_path, capsys)
    page = tmp_path / "report.html"
    assert main(["report", trace, "--block-size", "4", "-o", str(page)]) == 0
    rows = dict(
        (html.unescape(name), value)
        for name, value in re.findall(r"<tr><td>([^<]+)</td><td>([^<]+)</td><td>", page.read_text())
    )
    for key, name in HIT_RATES.items():
        shown = next(line.split()[1] for line in text.splitlines() if line.split()[:1] == [key])
        assert rows[name] == shown, (key, rows[name], shown)
    assert rows["aiperf / Dynamo cache_hit_rate"] == percent(numbers["cache_hit_rate"])
    assert f"cache_hit_rate {rows['aiperf / Dynamo cache_hit_rate']}: " in text
