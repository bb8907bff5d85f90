"""Run with Dynamo's Python: does Dynamo's trace replay read a `kvtrace export` file right?

Usage: python dynamo_replay.py FILE.jsonl FORMAT BLOCK_SIZE EXPECTED.json
FORMAT is mooncake or mooncake-delta. EXPECTED holds, per exported row in file order, the
prompt length the replayed request must have (the row's whole prompt: a delta turn rebuilt
from the previous prompt, its generated answer and the delta) and, for follow-up turns, the
delay. Replays offline (Dynamo's own reader and simulated engine) and checks every request:
its input length, and that a follow-up turn arrives `delay` ms after the previous turn of its
session ended. Prints one JSON summary line; exits 1 on the first failure.
"""

import json
import sys

from dynamo.replay import run_trace_replay


def main(path: str, trace_format: str, block_size: int, expected_path: str) -> int:
    with open(expected_path) as handle:
        expected = json.load(handle)
    report = run_trace_replay(
        path, trace_format=trace_format, trace_block_size=block_size, capture_per_request=True
    )
    requests = report.per_request
    if len(requests) != len(expected["rows"]):
        print(f"{len(requests)} requests replayed, not {len(expected['rows'])}", file=sys.stderr)
        return 1
    by_turn = {(r["session_id"], r["turn_index"]): r for r in requests if r["session_id"]}
    lengths = sorted(r["input_length"] for r in requests)
    if lengths != sorted(row["prompt"] for row in expected["rows"]):
        print(
            f"prompt lengths {lengths}, not {sorted(r['prompt'] for r in expected['rows'])}",
            file=sys.stderr,
        )
        return 1
    delays = 0
    for row in expected["rows"]:
        if row.get("delay") is None:
            continue
        turn = by_turn[(row["session"], row["turn"])]
        before = by_turn[(row["session"], row["turn"] - 1)]
        waited = turn["arrival_time_ms"] - before["terminal_time_ms"]
        if abs(waited - row["delay"]) > 1e-6 or turn["input_length"] != row["prompt"]:
            print(
                f"{row['session']} turn {row['turn']}: {turn['input_length']} tokens after "
                f"{waited} ms, not {row['prompt']} after {row['delay']}",
                file=sys.stderr,
            )
            return 1
        delays += 1
    print(json.dumps({"rows": len(requests), "delays": delays}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
