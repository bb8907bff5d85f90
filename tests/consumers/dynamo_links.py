"""Run with Dynamo's Python: does Dynamo replay a `kvtrace export --to dynamo-agentic` file of
a trace with parent_row links as the links say (branches, subagents, tool results)?

Usage: python dynamo_links.py FILE BLOCK_SIZE EXPECTED.json
EXPECTED holds the rows in time order, each its prompt length, the ms from which it may start
(not_before), and its predecessor's place (`after`: its parent, else its conversation's
previous turn; null for none) with the wait after that predecessor's completion. Replays offline
(Dynamo's own reader and simulated engine) and checks every request: each starts at
max(not_before, its predecessor's end + wait). Prints one JSON summary line (rows, plays,
dependencies, spawns, branch points); exits 1 on the first failure.
"""

import json
import sys
from collections import Counter

from dynamo.replay import run_trace_replay


def main(path: str, block_size: int, expected_path: str) -> int:
    with open(expected_path) as handle:
        expected = json.load(handle)["rows"]
    report = run_trace_replay(
        path,
        trace_format="agentic_mooncake",
        trace_block_size=block_size,
        capture_per_request=True,
        execution_model="MODEL",
    )
    done = {int(r["request_id"][1:]): r for r in report.per_request}  # r<rank>: rank in time
    if sorted(done) != list(range(len(expected))):
        print(f"replayed {sorted(done)}, not {len(expected)} rows", file=sys.stderr)
        return 1
    for rank, row in enumerate(expected):
        request = done[rank]
        if request["input_length"] != row["prompt"]:
            print(f"r{rank}: prompt {request['input_length']}, not {row['prompt']}")
            return 1
        due = row["not_before"]
        if row["after"] is not None:
            due = max(due, done[row["after"]]["terminal_time_ms"] + row["wait"])
        if abs(request["dispatched_at_ms"] - due) > 1e-6:
            print(f"r{rank} at {request['dispatched_at_ms']}, not {due}")
            return 1
    with open(path) as handle:
        records = [json.loads(line) for line in handle][1:]
    edges = [d for r in records for d in r.get("dependencies", [])]
    children = Counter(d["request_id"] for d in edges)
    summary = {
        "rows": len(done),
        "plays": len({r["play_id"] for r in records}),
        "dependencies": len(edges),
        "spawns": sum(d["relation"] == "spawn" for d in edges),
        "branch_points": sum(n > 1 for n in children.values()),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
