"""Each replacement policy's replay speed: requests and blocks per second of one capacity's
replay (one core: `simulate` runs capacities in parallel, one per core), on a large trace, in
this process, the numba code compiled beforehand (untimed). Rounds rotate the policies' order,
so a busy neighbour on the machine falls on each of them alike; the median round is printed,
with the spread, and the process's peak memory.

    python benchmarks/make_replicated_trace.py ../shared/traces/synthetic_trace.jsonl 82 \\
        benchmarks/corpora/synthetic_x82.jsonl          # 327k requests, 10.0M blocks
    python benchmarks/bench_policies.py benchmarks/corpora/synthetic_x82.jsonl --capacity 3M,30M
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

from kvtrace.transforms.cache.cache_trace import read_cache_trace
from kvtrace.transforms.cache.capacity import parse_capacities
from kvtrace.transforms.cache.policies import hit_rates
from kvtrace.transforms.cache.policy_names import POLICIES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--block-size", type=int, default=512)
    parser.add_argument("--capacity", default="3M", help="capacities in tokens (3M,30M)")
    parser.add_argument("--policy", default=",".join(POLICIES))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    policies = args.policy.split(",")
    capacities = [c.tokens for c in parse_capacities(args.capacity, None, "--capacity")]
    _, cache = read_cache_trace([args.trace], args.block_size)
    for policy in policies:  # compile (or load numba's cache) before any timing
        hit_rates(cache, policy, [0])
    print(
        f"{cache.rows:,} requests, {len(cache.block):,} blocks, {cache.distinct_blocks:,} "
        f"distinct prefixes, block size {args.block_size}\n"
    )
    print("| policy | capacity (tokens) | hit rate | requests/s | blocks/s | spread |")
    print("|---|---|---|---|---|---|")
    for capacity in capacities:
        seconds: dict[str, list[float]] = {p: [] for p in policies}
        rates: dict[str, float] = {}
        for round_ in range(args.rounds):
            for policy in policies[round_ % len(policies) :] + policies[: round_ % len(policies)]:
                started = time.perf_counter()
                rates[policy] = hit_rates(cache, policy, [capacity])[0]
                seconds[policy].append(time.perf_counter() - started)
        for policy in policies:
            median = statistics.median(seconds[policy])
            spread = f"{min(seconds[policy]):.2f}-{max(seconds[policy]):.2f} s"
            print(
                f"| {policy} | {capacity:,} | {100 * rates[policy]:.1f}% | "
                f"{cache.rows / median:,.0f} | {len(cache.block) / median:,.0f} | {spread} |"
            )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS {peak:,.0f} MiB (the trace read and every replay)")


if __name__ == "__main__":
    main()
