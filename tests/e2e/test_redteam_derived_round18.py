"""Red team round 18, hostile input to everything but the Parquet readers: reproducers of holes
found on that round's code, each xfail until fixed (strict: a fix makes it pass)."""

import pytest

from helpers import kvtrace_child, write_jsonl

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
