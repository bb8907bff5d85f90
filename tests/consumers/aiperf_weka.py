"""Run with aiperf's Python: does aiperf's own WEKA schema (`WekaTrace`, extra fields forbidden)
accept every conversation of a `kvtrace export --to weka` file, each as its own trace file?

Usage: python aiperf_weka.py FILE.jsonl
Prints one JSON summary line (conversations, requests); exits 1 on the first refusal.
"""

import json
import sys

from aiperf.dataset.loader.weka_trace_models import WekaTrace


def main(path: str) -> int:
    conversations = requests = 0
    with open(path) as handle:
        for line in handle:
            trace = WekaTrace.model_validate(json.loads(line))
            conversations += 1
            requests += len(trace.requests)
    print(json.dumps({"conversations": conversations, "requests": requests}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
