"""The full LRU curve of a ~10M-block trace: kvtrace simulate (one stack-distance pass) against
kvcache-simulator (KVCache.AI's C++ replay core, one replay per capacity), same trace, same
capacities; wall time and peak memory of each whole process, and their hit rates side by side.

kvcache-simulator sizes caches in GiB of a model's KV cache and reports the hit rate over the
last 50% of requests; kvtrace is given the same capacities in tokens (GiB / bytes per token of
that model) and its stack distances are read over the same rows. It is installed in its own
venv (it compiles its C++ core on first use, so one warm-up run is not timed).

    python benchmarks/make_replicated_trace.py ../shared/traces/synthetic_trace.jsonl 82 \\
        benchmarks/corpora/synthetic_x82.jsonl          # 10.0M blocks
    python benchmarks/bench_cache.py benchmarks/corpora/synthetic_x82.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from measure import run_measured

VENV = Path(os.environ.get("TMPDIR", "/tmp")) / "kvtrace-kvsim-venv"
MODEL = "qwen3-8b"  # in both catalogs: GQA, 36 layers, 8 KV heads of 128, bf16
BYTES_PER_TOKEN = 2 * 36 * 8 * 128 * 2
BUDGETS_GIB = (1, 4, 16, 64, 256, 1024)


def simulator_python() -> str:
    if not (VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "kvcache-simulator==0.1.3"],
                   check=True)
    return str(VENV / "bin" / "python")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--block-size", type=int, default=512)
    args = parser.parse_args()
    capacities = [g * 2**30 // BYTES_PER_TOKEN for g in BUDGETS_GIB]
    with tempfile.TemporaryDirectory() as tmp:
        ours = Path(tmp) / "ours.json"
        command = ["kvtrace", "simulate", args.trace, "--block-size", str(args.block_size),
                   "--policy", "lru", "--capacity", ",".join(map(str, capacities)),
                   "--json", str(ours)]
        seconds, peak = run_measured(command)
        print(f"kvtrace simulate --policy lru ({len(capacities)} capacities, one pass): "
              f"{seconds:.1f} s, peak {peak:.0f} MiB")
        python = simulator_python()
        theirs = Path(tmp) / "theirs.json"
        theirs_command = [python, "-m", "kvcache_sim", "run", "--trace", args.trace,
                          "--model", MODEL, "--kv-precision", "bf16_fp16",
                          "--block-size", str(args.block_size), "--policies", "lru",
                          "--budgets-gib", ",".join(map(str, BUDGETS_GIB)), "--no-progress",
                          "--format", "json", "--output", str(theirs)]
        subprocess.run(theirs_command, check=True, capture_output=True)  # compiles its core
        seconds, peak = run_measured(theirs_command)
        print(f"kvcache-simulator --policies lru (C++ backend, {len(BUDGETS_GIB)} budgets): "
              f"{seconds:.1f} s, peak {peak:.0f} MiB")
        print(json.dumps(json.loads(theirs.read_text()), indent=1)[:3000])
        print("ours (last 50% of rows):", last_half_rates(args.trace, args.block_size, capacities))


def last_half_rates(trace: str, block_size: int, capacities: list[int]) -> list[float]:
    """kvtrace's LRU hit rates over the last 50% of rows, the simulator's window."""
    from transforms.cache.cache_trace import read_cache_trace
    from transforms.cache.stack_distance import stack_distances

    _, cache = read_cache_trace([trace], block_size)
    distances = stack_distances(cache)
    first = cache.row_starts[cache.rows // 2]
    pages = np.array(capacities) // block_size
    tokens = distances.tokens[first:]
    prefix_max = distances.prefix_max[first:]
    return [round(float(tokens[prefix_max <= p].sum() / tokens.sum()), 4) for p in pages]


if __name__ == "__main__":
    main()
