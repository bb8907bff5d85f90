"""Wall time and peak memory of `kvtrace analyze` as a whole process (issue 3).

    python benchmarks/make_replicated_trace.py ../shared/traces/synthetic_trace.jsonl 60 \\
        benchmarks/corpora/synthetic_x60.jsonl          # 240k rows
    python benchmarks/bench_analyze.py benchmarks/corpora/synthetic_x60.jsonl --repeat 3

The reference analyzers measured on a trace of that size on this machine: Dynamo's `datagen
analyze` ~10 s and 1.3 GB; aiperf's analyze-trace ~42 s and 3.7 GB (issue 3).

--dynamo DIR also runs Dynamo's analyzer on the same trace, side by side: DIR is the folder
holding Dynamo's `benchmarks/prefix_data_generator` package (a checkout of ai-dynamo/dynamo; it is
not on PyPI), run as `python -m prefix_data_generator.prefix_analyzer`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from measure import run_measured


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trace")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--dynamo", metavar="DIR", help="folder holding prefix_data_generator")
    args = parser.parse_args()
    runs = []
    for _ in range(args.repeat):
        command = [sys.executable, "-m", "kvtrace.cli", "analyze", args.trace]
        seconds, peak_mib = run_measured(command)
        runs.append({"seconds": seconds, "peak_rss_mib": peak_mib})
    result = {
        "trace": args.trace,
        "runs": runs,
        "best_seconds": min(r["seconds"] for r in runs),
        "max_peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
    }
    if args.dynamo:
        os.environ["PYTHONPATH"] = args.dynamo
        seconds, peak_mib = run_measured(
            [
                sys.executable,
                "-m",
                "prefix_data_generator.prefix_analyzer",
                "--input-file",
                args.trace,
                "--block-size",
                "512",
            ]
        )
        result["dynamo"] = {"seconds": seconds, "peak_rss_mib": peak_mib}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
