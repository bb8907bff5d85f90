"""Run with Dynamo's Python: does Dynamo's Weka importer replay every request of a
`kvtrace export --to weka` file, subagent entries' requests included?

Usage: python dynamo_weka_rows.py FILE.jsonl
Prints one JSON summary line (conversations, requests replayed); exits 1 on a refusal.
"""

import json
import sys

from dynamo.replay import run_trace_replay


def main(path: str) -> int:
    with open(path) as handle:
        plays = [json.loads(line) for line in handle]
    report = run_trace_replay(
        path,
        trace_format="weka",
        trace_block_size=plays[0]["block_size"],
        capture_per_request=True,
        execution_model="MODEL",
    )
    print(json.dumps({"conversations": len(plays), "requests": len(report.per_request)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
