"""Red team round 18, hostile input to everything but the Parquet readers: reproducers of holes
found on that round's code, each xfail until fixed (strict: a fix makes it pass)."""

import subprocess

import pytest

from helpers import KVTRACE, ROOT, chat, kvtrace_child, under_rlimit, write_jsonl

pytestmark = pytest.mark.slow

GOOD = [
    {"timestamp": 1000 * i, "input_length": 8, "output_length": 2, "hash_ids": [2 * i, 2 * i + 1]}
    for i in range(3)
]


@pytest.mark.xfail(strict=True, reason="red team round 18")
def test_render_of_a_trace_with_no_readable_row_publishes_nothing(qwen3_tokenizer, tmp_path):
    """Exit codes right, and a failed run publishes nothing (round 2's rule, kept for
    synthesize, reuse, report, analyze by common.require_rows): `kvtrace render` of a trace
    none of whose lines reads (here a timestamp of NaN, a malformed line to every trace reader)
    exits 0 and publishes an empty requests file over the good one an earlier run wrote, where
    every other trace command stops with 'no trace rows could be read' (exit 1)."""
    out = tmp_path / "requests.jsonl"
    good = write_jsonl(tmp_path / "good.jsonl", GOOD)
    render = ["render", "--block-size", "4", "--tokenizer", qwen3_tokenizer, "--output", str(out)]
    assert kvtrace_child(*render, str(good)).returncode == 0
    earlier = out.read_bytes()
    assert earlier
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"timestamp": NaN, "input_length": 8, "output_length": 2, "hash_ids": [1, 2]}\n'
    )
    done = kvtrace_child(*render, str(bad))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no trace rows could be read" in done.stderr
    assert out.read_bytes() == earlier, "the failed run replaced the output with an empty one"


@pytest.mark.xfail(strict=True, reason="red team round 18")
def test_a_preset_of_one_sexagesimal_integer_costs_no_unbounded_cpu(tiny_tokenizer, tmp_path):
    """Bounded CPU, and a one-line error naming the file. config.load_bounded_yaml bounds a
    preset's bytes (1 MiB), aliases and depth, but YAML 1.1's safe loader reads `59:59:...` as
    a base-60 integer, built one digit at a time (each step multiplies a growing integer:
    quadratic): 340,000 digits (1 MB) took 18 CPU-s to load before `block-size` refused it,
    and the refusal was Python's 4,300-digit message, naming neither the preset nor the key.
    Here 240,000 digits (720 KB) within 4 s of CPU: over it, SIGXCPU kills the run."""
    preset = tmp_path / "preset.yaml"
    preset.write_text("block-size: " + ":".join(["59"] * 240_000) + "\n")
    log = write_jsonl(tmp_path / "in.jsonl", [chat(0, 1000)])
    command = [*KVTRACE, "anonymize", "--config", str(preset), "--input", str(log)]
    command += ["--tokenizer", tiny_tokenizer, "--output", str(tmp_path / "out")]
    done = subprocess.run(
        under_rlimit(command, "RLIMIT_CPU", 4),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert str(preset) in done.stderr
