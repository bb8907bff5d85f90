"""Red team round 11, hostile input: reproducers of the holes found past the round-1..10 fixes
(test_redteam_input*.py). Each asserts the promised behaviour (a flag or an input kvtrace cannot
honour is a one-line error or a dead letter, never a run whose memory grows until the machine
runs out) and fails today (2026-11-27)."""

from __future__ import annotations

import pytest

from helpers import kvtrace_child, write_jsonl

pytestmark = pytest.mark.slow

# The child's address space: far above what synthesize needs for the small trace below (its
# whole run peaks under 200 MB), far below what the machine holds, so a run that holds every
# drawn request ends here within seconds instead of meeting the OOM killer.
_ADDRESS_SPACE = 3 << 30


@pytest.mark.xfail(strict=True, reason="red team round 11")
def test_an_absurd_num_requests_is_refused_in_one_line_not_run_out_of_memory(tmp_path):
    """docs/ANALYSIS.md: synthesize's knobs are bounded "so timestamps and lengths stay within
    their int64 columns" and out of range is "refused with one line before any work"; reshape
    refuses a request whose own part "would take N blocks". `--num-requests N` has no bound:
    synth/sample.sample_requests draws N rows into one Python list (each a copy of its source
    row's ids) before anything is written, so the local engine's memory grows with N until the
    machine runs out (a trace of two 20,000-id rows, N = 10^6: 2 x 10^10 ids, ~1 TB as Python
    lists; unbounded, a typo's extra zeros are an OOM kill with no line at all; here, under a
    3 GiB cap, "the job failed: MemoryError" after ~8 s, exit 1). The promise: refused in one
    line naming the flag (exit 2), as every other knob is."""
    ids = 20_000
    trace = write_jsonl(
        tmp_path / "trace.jsonl",
        [
            {
                "timestamp": row,
                "input_length": ids * 4,
                "output_length": 1,
                "hash_ids": list(range(row * ids, (row + 1) * ids)),
            }
            for row in range(2)
        ],
    )
    done = kvtrace_child(
        "synthesize",
        str(trace),
        "--block-size",
        "4",
        "-o",
        str(tmp_path / "out"),
        "--num-requests",
        "1000000",
        prelude=(
            "import resource; "
            f"resource.setrlimit(resource.RLIMIT_AS, ({_ADDRESS_SPACE}, {_ADDRESS_SPACE}))"
        ),
        timeout=120,
    )
    assert "MemoryError" not in done.stderr
    assert done.returncode == 2, done.stderr
    assert "--num-requests" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists()
