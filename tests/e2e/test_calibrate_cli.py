"""`kvtrace calibrate`: the whole CLI on a trace and its measured file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.read.measured import measured_bytes

pytestmark = pytest.mark.smoke  # in the fast set: one whole run per command (conftest)


def test_capacity_error_and_plot_and_a_bad_measured_file_in_one_line(tmp_path, capsys):
    # Two prefixes alternating: a cache of one block keeps neither, of two keeps both.
    rows = [{"timestamp": t, "input_length": 8, "hash_ids": [t % 2, 10 + t]} for t in range(8)]
    trace = write_jsonl(tmp_path / "t.jsonl", rows)
    measured = tmp_path / "m.jsonl"
    measured.write_bytes(measured_bytes(0, np.array([0, 0, 4, 4, 4, 4, 4, 4])))
    args = ["calibrate", str(trace), "--block-size", "4", "--measured", str(measured)]
    report = tmp_path / "fit.json"
    assert main([*args, "-o", str(tmp_path / "fit.png"), "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "measured: 8 of 8 requests" in out and "lru: best capacity" in out
    fit = json.loads(report.read_text())["policies"]["lru"]
    assert fit["mae_tokens"] == 0 and fit["verdict"] is None
    # Between their uses each prefix sees the other's, and the 3 blocks between: 4 pages.
    assert fit["capacity_tokens"] == 16 and fit["hit_rate_difference"] == 0
    assert (tmp_path / "fit.png").read_bytes()[:4] == b"\x89PNG"
    measured.write_bytes(b'{"shard": 0, "row": 8, "cached_tokens": 4}\n')
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --measured") and "\n" not in err and "row 8" in err
    assert main([*args, "--policy", "belady"]) == 2
