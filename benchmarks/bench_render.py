"""`kvtrace render` wall time and peak memory as the trace grows: memory should stay flat (rows
are rendered, written and verified in batches), time grow with the rows.

    python benchmarks/bench_render.py ../shared/traces/synthetic_trace.jsonl \\
        --tokenizer ../shared/tokenizers/deepseek-r1 --rows 500,2000,3993 --shape prompt
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from measure import run_measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--rows", default="500,2000,3993")
    parser.add_argument("--shape", default="prompt", choices=("prompt", "chat"))
    parser.add_argument("--block-size", default="512")
    args = parser.parse_args()
    lines = args.trace.read_bytes().splitlines(keepends=True)
    print("| rows | wall s | peak RSS MiB |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for rows in [int(r) for r in args.rows.split(",")]:
            part = Path(tmp) / f"head{rows}.jsonl"
            part.write_bytes(b"".join(lines[:rows]))
            seconds, peak = run_measured([sys.executable, "-m", "kvtrace.cli", "render", str(part),
                                          "--tokenizer", args.tokenizer, "-o",
                                          str(Path(tmp) / "out.jsonl"), "--shape", args.shape,
                                          "--block-size", args.block_size])
            print(f"| {rows:,} | {seconds:.1f} | {peak:.0f} |", flush=True)


if __name__ == "__main__":
    main()
