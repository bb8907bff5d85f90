"""The full LRU curve of a ~10M-block trace: kvtrace simulate against kvcache-simulator
(KVCache.AI's C++ replay core), same trace, same capacities, same measurement window (the last
50% of requests); wall time and peak memory of each whole process, hit rates side by side.

kvcache-simulator's `lru` is a leaf-LRU over a prefix trie with the running request's path
protected: kvtrace's `prefix-lru` (a replay per capacity). kvtrace's `lru` (plain block LRU
with prefix hits) comes from one stack-distance pass for every capacity. Capacities are the
simulator's GiB budgets of one model's KV cache, given to kvtrace in tokens (GiB / bytes per
token). The simulator is installed in its own venv and compiles its C++ core on first use (that
first run is not timed).

    python benchmarks/make_replicated_trace.py ../shared/traces/synthetic_trace.jsonl 82 \\
        benchmarks/corpora/synthetic_x82.jsonl          # 10.0M blocks
    python benchmarks/bench_cache.py benchmarks/corpora/synthetic_x82.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from measure import run_measured, tool_python

MODEL = "qwen3-8b"  # in both catalogs: GQA, 36 layers, 8 KV heads of 128, bf16
BYTES_PER_TOKEN = 2 * 36 * 8 * 128 * 2
BUDGETS_GIB = (1, 4, 16, 64, 256, 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--block-size", type=int, default=512)
    args = parser.parse_args()
    capacities = [g * 2**30 // BYTES_PER_TOKEN for g in BUDGETS_GIB]
    rates: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for policy in ("lru", "prefix-lru"):
            out = Path(tmp) / f"{policy}.json"
            seconds, peak = run_measured(
                [
                    "kvtrace",
                    "simulate",
                    args.trace,
                    "--block-size",
                    str(args.block_size),
                    "--policy",
                    policy,
                    "--warmup-fraction",
                    "0.5",
                    "--capacity",
                    ",".join(map(str, capacities)),
                    "--json",
                    str(out),
                ]
            )
            rates[f"kvtrace {policy}"] = [
                p["hit_rate"] for p in json.loads(out.read_text())["policies"][policy]
            ]
            print(f"kvtrace simulate --policy {policy}: {seconds:.1f} s, peak {peak:.0f} MiB")
        python = tool_python("kvsim", "kvcache-simulator==0.1.3")
        theirs = Path(tmp) / "theirs.json"
        command = [
            python,
            "-m",
            "kvcache_sim",
            "run",
            "--trace",
            args.trace,
            "--model",
            MODEL,
            "--kv-precision",
            "bf16_fp16",
            "--block-size",
            str(args.block_size),
            "--policies",
            "lru",
            "--budgets-gib",
            ",".join(map(str, BUDGETS_GIB)),
            "--no-progress",
            "--format",
            "json",
            "--output",
            str(theirs),
        ]
        subprocess.run(command, check=True, capture_output=True)  # compiles its core
        seconds, peak = run_measured(command)
        print(f"kvcache-simulator --policies lru: {seconds:.1f} s, peak {peak:.0f} MiB")
        points = {p["gib"]: p["results"]["lru"] for p in json.loads(theirs.read_text())["points"]}
        rates["kvcache-simulator lru"] = [
            points.get(float(g), {}).get("hitRate", float("nan")) for g in BUDGETS_GIB
        ]
    print(
        "\n| GiB | tokens | " + " | ".join(rates) + " |\n|---" * 1 + "|---" * (len(rates) + 1) + "|"
    )
    for i, gib in enumerate(BUDGETS_GIB):
        print(
            f"| {gib} | {capacities[i]:,} | "
            + " | ".join(f"{r[i]:.4f}" for r in rates.values())
            + " |"
        )


if __name__ == "__main__":
    main()
