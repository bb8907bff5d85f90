"""Red team round 18, hostile input to everything but the Parquet readers: reproducers of holes
found on that round's code, each xfail until fixed (strict: a fix makes it pass)."""

import subprocess
from pathlib import Path

import pytest

from helpers import KVTRACE, ROOT, SALT, chat, kvtrace_child, read_jsonl, under_rlimit, write_jsonl

pytestmark = pytest.mark.slow

GOOD = [
    {"timestamp": 1000 * i, "input_length": 8, "output_length": 2, "hash_ids": [2 * i, 2 * i + 1]}
    for i in range(3)
]


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


def _lengths(tokenizer: str, tmp_path: Path, name: str, record: dict, *extra: str) -> list:
    """The input lengths anonymize publishes for a log of the record and a later clean chat (a
    night never empty), and its letters' count."""
    log = write_jsonl(tmp_path / f"{name}.jsonl", [record, chat(1, 60_000)])
    out = tmp_path / name
    done = kvtrace_child(
        "anonymize", "--input", str(log), "--tokenizer", tokenizer, "--block-size", "4",
        "--salt-file", str(tmp_path / "salt"), "--output", str(out),
        "--max-rejected-fraction", "1", "--processes", "1", "--quiet", *extra,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [row["input_length"] for row in read_jsonl(next(out.glob("trace-*.jsonl")))]
    letters = sum(len(read_jsonl(p)) for p in Path(f"{out}-rejected").glob("*.jsonl"))
    return [rows, letters]


def test_a_requests_own_chat_template_kwargs_give_no_made_up_length(qwen3_tokenizer, tmp_path):
    """Values as the serving engine reads them, never a made-up length. An OpenAI chat request
    may carry its own `chat_template_kwargs` (`{"enable_thinking": false}`, the usual way to
    turn Qwen3's thinking off per request), which the engine renders its prompt with; anonymize
    reads none of a record's own template fields (nor `add_generation_prompt`,
    `continue_final_message`, `chat_template`): it renders with the run's
    --chat-template-kwargs and publishes that length (13 tokens for the engine's 17). The record
    must be rendered as the engine did, or be a letter."""
    (tmp_path / "salt").write_text(SALT)
    record = {"timestamp": 0, "messages": [{"role": "user", "content": "what is a prefix cache"}]}
    record["output_length"] = 3
    engine = _lengths(qwen3_tokenizer, tmp_path, "engine", record, "--chat-template-kwargs",
                      '{"enable_thinking": false}')  # fmt: skip
    own = _lengths(qwen3_tokenizer, tmp_path, "own",
                   {**record, "chat_template_kwargs": {"enable_thinking": False}})  # fmt: skip
    assert len(engine[0]) == 2 and own in ([engine[0][:1] + own[0][1:], 0], [own[0][-1:], 1])
