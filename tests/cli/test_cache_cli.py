"""kvtrace reuse / simulate / report: reference values on the real trace, bad lines, the page."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from helpers import shared_path, write_jsonl
from kvtrace.cli import main


def run_json(capsys, tmp_path, *argv: str) -> tuple[dict, str]:
    out = tmp_path / "out.json"
    assert main([*argv, "--json", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


def test_simulate_in_bytes_with_a_model_preset(tmp_path, capsys):
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"timestamp": i, "input_length": 40, "output_length": 1, "hash_ids": [0, 1, 2 + i % 3]}
            for i in range(30)
        ],
    )
    report, _ = run_json(
        capsys,
        tmp_path,
        "simulate",
        str(trace),
        "--block-size",
        "16",
        "--capacity",
        "10MB",
        "--model",
        "qwen3-8b",
        "--policy",
        "lru,fifo",
    )
    point = report["policies"]["fifo"][0]
    assert report["kv_bytes_per_token"] == 147_456
    assert (
        point["capacity_bytes"] == 10_000_000 and point["capacity_tokens"] == 10_000_000 // 147_456
    )
    assert set(report["policies"]) == {"lru", "fifo"}


def test_bad_lines_are_reported_and_bad_flags_refused(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [0, 1]}\n'
        "not json\n"
        '{"timestamp": 5, "input_length": 20, "output_length": 1, "hash_ids": [0, 1]}\n'
    )
    assert (
        main(["reuse", str(trace), "--block-size", "16", "--output", str(tmp_path / "p.png")]) == 0
    )
    err = capsys.readouterr().err
    assert "1 malformed trace line(s) skipped" in err and "t.jsonl:2" in err
    assert main(["simulate", str(trace), "--capacity", "1M", "--policy", "lru,mru"]) == 2
    assert "unknown mru" in capsys.readouterr().err
    assert main(["simulate", str(trace), "--capacity", "40GB"]) == 2
    assert "--kv-bytes-per-token or --model" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("nonsense\n")
    assert main(["simulate", str(empty), "--capacity", "1M"]) == 1
    assert "no trace rows could be read" in capsys.readouterr().err


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_report_is_one_self_contained_page(tmp_path, capsys):
    trace = str(shared_path("traces", "synthetic_trace.jsonl"))
    page = tmp_path / "report.html"
    assert main(["report", trace, "-o", str(page)]) == 0
    text = page.read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert len(images) == 6
    assert all(base64.b64decode(image)[:4] == b"\x89PNG" for image in images)
    assert not re.search(r'(src|href)="(https?:)?//', text)  # nothing from the network
    for heading in (
        "Hit rates: the definitions side by side",
        "Hit rate by policy and capacity",
        "Two-tier sizing",
        "Reuse intervals",
        "Request rate",
    ):
        assert heading in text
    assert text.index('class="headline"') < text.index("<h2>")  # the headline comes first
    assert "chosen by kvtrace" in text and str(Path(trace).parent) not in text


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_report_takes_the_sizing_options_simulate_takes(tmp_path, capsys):
    trace = str(shared_path("traces", "synthetic_trace.jsonl"))
    page = tmp_path / "report.html"
    assert (
        main(
            [
                "report",
                trace,
                "-o",
                str(page),
                "--model",
                "qwen3-8b",
                "--gpu-kv-cache-size",
                "40GB",
                "--capacity",
                "1M,3M,10M",
                "--policy",
                "lru,fifo",
                "--tier2-capacity",
                "100GB",
            ]
        )
        == 0
    )
    text = page.read_text()
    tokens = 40 * 10**9 // (2 * 36 * 8 * 128 * 2)
    assert f"{tokens:,} tokens" in text and "chosen by kvtrace" not in text
    assert "<td>fifo</td>" in text and "<td>belady</td>" not in text
    assert "<th>3,000,000</th>" in text and "of CPU/SSD behind it" in text
    assert (
        main(["report", trace, "-o", str(page), "--gpu-kv-cache-size", "40GB", "--overwrite"]) == 2
    )
    assert "in bytes" in capsys.readouterr().err


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (CI installs it)")
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_report_renders_in_headless_chromium(tmp_path):
    trace = str(shared_path("traces", "synthetic_trace.jsonl"))
    page = tmp_path / "report.html"
    assert main(["report", trace, "-o", str(page)]) == 0
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--screenshot={shot}",
            "--window-size=1200,3000",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("L"))
    # Not blank: many distinct grey levels (plots, text), not one background colour.
    assert len(np.unique(pixels)) > 50 and pixels.std() > 10
