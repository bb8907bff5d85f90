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


def test_simulate_takes_the_queue_policies_and_says_what_each_evicts(tmp_path, capsys):
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"timestamp": i, "input_length": 32, "output_length": 1, "hash_ids": [i % 4, 9 + i]}
            for i in range(30)
        ],
    )
    names = ["s3-fifo", "sieve", "arc", "tinylfu"]
    report, out = run_json(
        capsys,
        tmp_path,
        "simulate",
        str(trace),
        "--block-size",
        "16",
        "--capacity",
        "1M",
        "--policy",
        ",".join(names),
    )
    assert list(report["policies"]) == names and set(names) <= set(report["definitions"])
    assert "| capacity | s3-fifo | sieve | arc | tinylfu |" in out
    for name in names:  # everything fits: the infinite cache's hits, 26 first blocks of 16
        assert report["policies"][name][0]["hit_rate"] == pytest.approx(26 * 16 / (30 * 32))


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
        "Sessions",
    ):
        assert heading in text
    for policy in ("s3-fifo", "sieve", "arc", "tinylfu"):  # every policy by default, explained
        assert f"<tr><td>{policy}</td>" in text
    assert text.index('class="headline"') < text.index("<h2>")  # the headline comes first
    assert "kvtrace&#x27;s default: 50 GiB" in text and str(Path(trace).parent) not in text
    assert "<title>kvtrace report: model not named, undated</title>" in text
    assert "<p>Undated: its times are not epoch times" in text  # and says why


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
    assert f"37.3 GiB ({tokens:,} tokens at 147,456 bytes per token)" in text
    assert "kvtrace&#x27;s default" not in text and "kvtrace report: qwen3-8b, " in text
    assert "<td>fifo</td>" in text and "<td>belady</td>" not in text
    assert "<th>412.0 GiB</th>" in text and "with an offload tier" in text
    assert (
        main(["report", trace, "-o", str(page), "--gpu-kv-cache-size", "40GB", "--overwrite"]) == 2
    )
    said = capsys.readouterr().err
    assert "in bytes" in said and "--gpu-kv-cache-size" in said  # the flag named, not the value


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


def _conversations(path: Path) -> str:
    """A trace whose reuse spans many capacities: a shared opening, 25 conversations, new turns."""
    rows = [
        {
            "timestamp": 1000 * i,
            "input_length": 16 * 4 - 3,
            "output_length": 5,
            "hash_ids": [0, 1, 100 + i % 25, 1000 + i],
        }
        for i in range(300)
    ]
    return str(write_jsonl(path, rows))


def test_one_size_parser_for_reuse_simulate_and_report(tmp_path, capsys):
    trace = _conversations(tmp_path / "t.jsonl")
    png, page = str(tmp_path / "p.png"), str(tmp_path / "r.html")
    for argv in (
        ["reuse", trace, "--output", png, "--gpu-kv-cache-size"],
        ["simulate", trace, "--policy", "lru", "--capacity"],
        ["report", trace, "-o", page, "--gpu-kv-cache-size"],
    ):
        assert main([*argv, "40G", "--model", "qwen3-8b"]) == 2
        assert "'40G': bytes or tokens? write 40GB" in capsys.readouterr().err
        assert main([*argv, "40GB"]) == 2  # bytes need a token's bytes
        assert "--kv-bytes-per-token or --model" in capsys.readouterr().err
    assert not Path(page).exists() and not Path(png).exists()


@pytest.mark.slow  # the plot: over a second
def test_reuse_takes_a_gpu_cache_in_bytes_as_report_does(tmp_path, capsys):
    trace = _conversations(tmp_path / "t.jsonl")
    report, out = run_json(
        capsys, tmp_path, "reuse", trace, "--output", str(tmp_path / "p.png"),
        "--gpu-kv-cache-size", "40GB", "--model", "qwen3-8b",
    )  # fmt: skip
    assert report["gpu_kv_cache_size"] == 40 * 10**9 // 147_456
    assert "reused after more than 37.3 GiB went through the cache" in out


def test_report_refuses_an_empty_trace_before_writing_anything(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("nonsense\n")
    page = tmp_path / "r.html"
    assert main(["report", str(empty), "-o", str(page)]) == 1
    assert "no trace rows could be read" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl"]


@pytest.mark.slow  # the report draws six plots: over a second
def test_every_figure_simulate_and_reuse_print_is_the_reports(tmp_path, capsys):
    trace = _conversations(tmp_path / "t.jsonl")
    sizing = ["--capacity", "200k,500k,2M", "--policy", "lru,fifo", "--model", "qwen3-8b"]
    page = tmp_path / "r.html"
    assert main(["report", trace, "-o", str(page), "--gpu-kv-cache-size", "500k", *sizing]) == 0
    text = page.read_text()
    capsys.readouterr()
    assert main(["simulate", trace, *sizing]) == 0
    simulated = capsys.readouterr().out
    argv = ["reuse", trace, "--output", str(tmp_path / "p.png"), "--gpu-kv-cache-size", "500k"]
    assert main([*argv, "--model", "qwen3-8b"]) == 0
    reused = capsys.readouterr().out

    header = re.findall(r"<th>([0-9.,]+ GiB)</th>", text.split("policy \\ capacity")[1])
    table = {
        (policy, capacity): rate
        for policy, cells in re.findall(r"<tr><td>(\w+)</td>((?:<td>[^<]+</td>)+)</tr>", text)
        if policy in ("lru", "fifo")
        for capacity, rate in zip(header, re.findall(r"<td>([^<]+)</td>", cells))
    }
    printed = {
        (policy, capacity): rate
        for capacity, lru, fifo in re.findall(r"^\| ([0-9.,]+ GiB) \| (\S+) \| (\S+) \|$",
                                              simulated, re.M)
        for policy, rate in (("lru", lru), ("fifo", fifo))
    }  # fmt: skip
    assert len(printed) == 6 and printed == table
    ceiling = re.search(r"\(infinite cache\): ([0-9.]+%) of prompt tokens", reused)[1]
    assert f"<td>{ceiling} of prompt tokens hit (token-weighted)" in text
    beyond = re.search(r"beyond the GPU cache\): ([0-9.]+%) of prompt tokens", reused)[1]
    gpu = re.search(r"more than ([0-9.,]+ GiB) went", reused)[1]
    assert f"at\n{gpu} of GPU cache (red),\n{beyond} of prompt tokens" in text
