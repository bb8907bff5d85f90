"""`kvtrace export` wall time and peak memory per replayer form, on a generated trace of
multi-turn conversations (each turn extends the previous prompt and answer, each response end
known) at block size 16.

    python benchmarks/bench_export.py --conversations 20000 --turns 6
    python benchmarks/bench_export.py --to dynamo,dynamo-agentic,weka,libcachesim --rounds 2

The checkout's kvtrace is measured (`python -m kvtrace.cli` from the checkout), whatever
kvtrace is installed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
from pathlib import Path

from measure import run_measured_cpu

BLOCK = 16
CHECKOUT = Path(__file__).resolve().parents[1]


def conversations(count: int, turns: int, seed: int = 0):
    """Rows as kvtrace publishes them: dense ids, whole prompts, session numbers, response_ms."""
    rng, next_id, rows = random.Random(seed), 0, []
    for session in range(count):
        start, prompt, ids = rng.randrange(3_600_000), 0, []
        for turn in range(turns):
            answer, added = rng.randrange(20, 400), rng.randrange(50, 2_000)
            prompt = prompt + added
            full = prompt // BLOCK
            ids = ids[: min(len(ids), full)]
            while len(ids) < math.ceil(prompt / BLOCK):
                ids.append(next_id)
                next_id += 1
            rows.append(
                {
                    "timestamp": start,
                    "input_length": prompt,
                    "output_length": answer,
                    "hash_ids": list(ids),
                    "response_ms": rng.randrange(500, 20_000),
                    "session": session,
                }
            )
            start += rows[-1]["response_ms"] + rng.randrange(1_000, 60_000)
            prompt += answer
    rows.sort(key=lambda r: r["timestamp"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=20_000)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--to", default="vllm,dynamo,dynamo-delta,sglang")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each form, interleaved")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        rows = conversations(args.conversations, args.turns)
        trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
        blocks = sum(len(r["hash_ids"]) for r in rows)
        print(f"{len(rows):,} rows, {blocks:,} blocks, {trace.stat().st_size / 2**20:.0f} MiB\n")
        print("| --to | round | wall s | CPU s | peak RSS MiB |\n|---|---|---|---|---|")
        for round_ in range(1, args.rounds + 1):
            for name in args.to.split(","):
                output = Path(tmp) / f"{name}.out"  # any name: the form is --to's
                seconds, cpu, peak = run_measured_cpu(
                    [sys.executable, "-m", "kvtrace.cli", "export", str(trace), "--to", name]
                    + ["-o", str(output), "--overwrite", "--block-size", str(BLOCK)],
                    CHECKOUT,
                    dict(os.environ),
                )
                print(f"| {name} | {round_} | {seconds:.1f} | {cpu:.1f} | {peak:.0f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
