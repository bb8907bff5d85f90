"""Wall time and peak memory of `kvtrace analyze` as a whole process (issue 3).

    python benchmarks/make_replicated_trace.py ../shared/traces/synthetic_trace.jsonl 60 \\
        benchmarks/corpora/synthetic_x60.jsonl          # 240k rows
    python benchmarks/bench_analyze.py benchmarks/corpora/synthetic_x60.jsonl --repeat 3

The reference analyzers measured on a trace of that size on this machine: Dynamo's `datagen
analyze` ~10 s and 1.3 GB; aiperf's analyze-trace ~42 s and 3.7 GB (issue 3).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

# Runs a command and prints the peak resident set of it and its descendants, in KiB.
_PEAK_RSS = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
    "stdout=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    runs = []
    for _ in range(args.repeat):
        command = [sys.executable, "-m", "kvtrace.cli", "analyze", args.trace]
        start = time.perf_counter()
        measured = subprocess.run([sys.executable, "-c", _PEAK_RSS, *command], check=True,
                                  capture_output=True, text=True)
        runs.append({"seconds": time.perf_counter() - start,
                     "peak_rss_mib": int(measured.stdout.split()[-1]) / 1024})
    print(json.dumps({"trace": args.trace, "runs": runs,
                      "best_seconds": min(r["seconds"] for r in runs),
                      "max_peak_rss_mib": max(r["peak_rss_mib"] for r in runs)}, indent=2))


if __name__ == "__main__":
    main()
