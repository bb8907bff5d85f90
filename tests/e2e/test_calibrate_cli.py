"""`kvtrace calibrate`: the whole CLI on a trace and its measured file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import write_jsonl
from kvtrace.cli import main
from kvtrace.transforms.read.measured import measured_bytes

pytestmark = pytest.mark.smoke  # in the fast set: one whole run per command (conftest)


def _night(folder: Path, rows: list[dict], cached: list[int]) -> tuple[Path, Path]:
    """(a one-shard output folder as kvtrace publishes it: the shard and its manifest, its
    measured file as a run joins it)."""
    from kvtrace.transforms.read.measured import join_measured, measured_part
    from kvtrace.transforms.trace_format import FORMAT, canonical_json
    from kvtrace.transforms.write.publish import sha256_of

    (folder / "out").mkdir()
    shard = write_jsonl(folder / "out" / "trace-00000-of-00001.jsonl", rows)
    manifest = canonical_json(
        {
            "format": FORMAT,
            "records": {"exported": len(rows)},
            "sha256": {shard.name: sha256_of(shard.read_bytes())},
        }
    )
    (folder / "out" / "manifest.json").write_bytes(manifest)
    staging = folder / "letters"
    staging.mkdir()
    (staging / measured_part(0)).write_bytes(measured_bytes(0, np.array(cached)) or b"")
    return folder / "out", Path(join_measured(str(staging), sha256_of(manifest)) or "")


def test_capacity_error_and_plot_and_a_bad_measured_file_in_one_line(tmp_path, capsys):
    # Two prefixes alternating: a cache of one block keeps neither, of two keeps both.
    rows = [{"timestamp": t, "input_length": 8, "hash_ids": [t % 2, 10 + t]} for t in range(8)]
    trace, measured = _night(tmp_path, rows, [0, 0, 4, 4, 4, 4, 4, 4])
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
    header = measured.read_bytes().splitlines(keepends=True)[0]
    measured.write_bytes(header + b'{"shard": 0, "row": 8, "cached_tokens": 4}\n')
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --measured") and "\n" not in err and "row 8" in err
    assert main([*args, "--policy", "belady"]) == 2
