"""The stream's id map in hash-shard keys (transforms/ids/id_shards.py) against the one key that
held it before (issue 36.3), window after window, in one process:

- state per key: the bytes the largest shard key holds after the last window (its seen set and
  id store), against the one key's map (24 bytes an id);
- what a window reads of the map: the one key reads every id so far for every window; sharded,
  the numbering step takes only the window's new first occurrences (44 bytes each);
- CPU seconds to number the windows, all shards' steps run here one after another (a runner
  spreads them over the shard keys), against dense_ids over the whole map, and the two ids equal.

Windows of agent-like traffic: each request is one of --prefixes shared prefixes (--shared
blocks) and --own blocks of its own, so most of a window's blocks are new, as in real logs.

    python benchmarks/bench_id_shards.py --windows 24 --requests 2000 --shards 1,4,16,64
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kvtrace.transforms.ids.dense_ids import FIRST, NUMBERED, OCCURRENCE, dense_ids
from kvtrace.transforms.ids.id_shards import empty_shard, number_window


def window_keys(window: int, args: argparse.Namespace, rng: np.random.Generator) -> np.ndarray:
    """One window's block occurrences: request r of the window at time r, a shared prefix then
    blocks of its own (keys drawn from 2^64: distinct unless shared)."""
    shared = rng.integers(0, args.prefixes, args.requests)
    per_request = args.shared + args.own
    table = np.zeros(args.requests * per_request, dtype=OCCURRENCE)
    prefix_keys = np.arange(args.prefixes * args.shared, dtype=np.uint64).reshape(
        args.prefixes, args.shared
    )
    own = rng.integers(1 << 40, 1 << 63, (args.requests, args.own), dtype=np.uint64)
    keys = np.concatenate([prefix_keys[shared], own], axis=1).reshape(-1)
    table["hi"] = keys
    table["lo"] = keys * np.uint64(0x9E3779B97F4A7C15)  # a keyed hash's bits, spread
    table["ts"] = window * args.requests + np.repeat(np.arange(args.requests), per_request)
    table["fp"] = np.repeat(rng.integers(0, 1 << 62, args.requests, dtype=np.uint64), per_request)
    table["pos"] = np.tile(np.arange(per_request), args.requests)
    table["weight"] = 1
    return table


def run(args: argparse.Namespace) -> None:
    windows = [
        window_keys(w, args, np.random.default_rng([args.seed, w])) for w in range(args.windows)
    ]
    start = time.process_time()
    whole, next_id, map_reads, reference = np.empty(0, NUMBERED), 0, 0, []
    for keys in windows:
        map_reads += whole.nbytes
        numbered = dense_ids(keys, lambda _, whole=whole: whole, next_id)
        whole = np.concatenate([whole, numbered.added])
        next_id += numbered.added_count
        reference.append(numbered.ids)
    one_key_s = time.process_time() - start
    occurrences = sum(len(keys) for keys in windows)
    print(
        f"{args.windows} windows, {occurrences:,} blocks, {next_id:,} ids; one key: "
        f"{whole.nbytes / 2**20:.1f} MiB of map, {map_reads / 2**20:.0f} MiB read over the "
        f"windows, {one_key_s:.2f} CPU-s"
    )
    print("shards | largest key's state | numbering step's input per window | CPU-s | ids equal")
    for count in args.shards:
        shards, new_bytes, equal = [empty_shard()] * count, [], True
        start = time.process_time()
        for keys, expected in zip(windows, reference):
            numbered, shards = number_window(keys, shards, sum(len(s.ids) for s in shards))
            new_bytes.append(numbered.added_count * FIRST.itemsize)
            equal &= np.array_equal(numbered.ids, expected)
        seconds = time.process_time() - start
        largest = max(shard.seen.nbytes + shard.ids.nbytes for shard in shards)
        print(
            f"{count:6d} | {largest / 2**20:8.2f} MiB | mean {np.mean(new_bytes) / 2**20:.2f} MiB, "
            f"max {max(new_bytes) / 2**20:.2f} MiB | {seconds:.2f} | {equal}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=24)
    parser.add_argument("--requests", type=int, default=2000, help="per window")
    parser.add_argument("--prefixes", type=int, default=50)
    parser.add_argument("--shared", type=int, default=30, help="blocks of a shared prefix")
    parser.add_argument("--own", type=int, default=10, help="blocks of a request's own")
    parser.add_argument("--shards", default="1,4,16,64")
    parser.add_argument("--seed", type=int, default=36)
    args = parser.parse_args()
    args.shards = [int(n) for n in args.shards.split(",")]
    run(args)


if __name__ == "__main__":
    main()
