"""What a night costs against the size of the id map it extends: time, memory, bytes read.

A night of token-id requests (so tokenizing does not hide the id work) is anonymized with no
map, then against random maps of each --map-sizes (written as one segment, as a map of that
size looks after compaction), then again against the last map it has just extended (every key
known: the rerun case). Each request is a prefix shared with others (--shared-blocks, drawn
from --prefixes) and its own blocks, so occurrences outnumber distinct keys as in real logs.
"map read" is what the run reports reading of the map ("id map: read ..."), against the
map's size on storage.

    python benchmarks/bench_id_map.py --tokenizer ../shared/tokenizers/deepseek-r1 \
        --map-sizes 1000000,8000000 --engine beam
    python benchmarks/bench_id_map.py --tokenizer ../shared/tokenizers/deepseek-r1 \
        --night-blocks 100000000 --block-size 2 --map-sizes 10000000,80000000 --engine local
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
from measure import run_measured_with_log

from kvtrace.transforms.encode.blocks import HASH_SCHEME, salt_fingerprint
from kvtrace.transforms.encode.tokenize import (
    load_tokenizer,
    tokenization_fingerprint,
    tokenizer_sha256,
)
from kvtrace.transforms.ids.dense_ids import NUMBERED, hash_shards_for, shard_of, split_by
from kvtrace.transforms.ids.id_map import (
    MapIdentity,
    Night,
    empty_version,
    map_key,
    new_run_id,
    next_version,
    publish,
    segment_path,
)
from kvtrace.transforms.ids.segments import write_segment

SALT = b"benchmark-salt-of-enough-bytes!!"
BLOCKS_PER_REQUEST = 100
DAY_MS = 86_400_000
MAP_READ = re.compile(r"id map: read ([\d.]+) MiB, (\d+) of (\d+) row groups")


def write_night(
    path: Path, blocks: int, block_size: int, shared_blocks: int, prefixes: int, seed: int
) -> None:
    """Requests of random token ids: a shared prefix of shared_blocks blocks (one of
    `prefixes`), then blocks of their own; every key is new to any map."""
    rng = np.random.default_rng(seed)
    requests = blocks // BLOCKS_PER_REQUEST
    pool = rng.integers(0, 120_000, (prefixes, shared_blocks * block_size))
    own = (BLOCKS_PER_REQUEST - shared_blocks) * block_size
    with open(path, "w") as f:
        for start in range(0, requests, 10_000):
            count = min(10_000, requests - start)
            tokens = np.hstack(
                [pool[rng.integers(0, prefixes, count)], rng.integers(0, 120_000, (count, own))]
            )
            f.writelines(
                f'{{"timestamp": {DAY_MS + 8 * (start + i)}, "output_length": 100, '
                f'"input_ids": [{",".join(map(str, row))}]}}\n'
                for i, row in enumerate(tokens.tolist())
            )


def write_map(directory: Path, ids: int, identity: MapIdentity) -> None:
    """Version 1 of a map holding `ids` random hashes (ids 0..ids-1), sharded as a run would."""
    rng = np.random.default_rng(7)
    table = np.empty(ids, dtype=NUMBERED)
    table["hi"] = rng.integers(0, 2**64, ids, dtype=np.uint64, endpoint=False)
    table["lo"] = rng.integers(0, 2**64, ids, dtype=np.uint64, endpoint=False)
    table["id"] = np.arange(ids)
    shards = hash_shards_for(ids)
    run_id = new_run_id()
    written = [
        write_segment(segment_path(str(directory), 1, run_id, "blocks", shard), [part])
        for shard, part in split_by(table, shard_of(table, shards))
    ]
    empty = empty_version(identity)
    version = next_version(
        str(directory),
        empty,
        {"blocks": written, "sessions": []},
        {"blocks": ids, "sessions": 0},
        False,
        shards,
        0,
        Night({"block_ids_from": 0, "sessions_from": 0, "time_from_ms": 0}, "0" * 64),
    )
    publish(str(directory), empty, version, map_key(SALT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--map-sizes", default="1000000,8000000")
    parser.add_argument("--night-blocks", type=int, default=1_000_000)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--shared-blocks", type=int, default=80)
    parser.add_argument("--prefixes", type=int, default=1000)
    parser.add_argument("--engine", choices=("local", "beam"), default="beam")
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.tokenizer)
    identity = MapIdentity(
        salt_fingerprint(SALT),
        args.block_size,
        tokenizer_sha256(args.tokenizer),
        HASH_SCHEME,
        {},
        tokenization_fingerprint(tokenizer),
    )
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent / "corpora") as tmp:
        work = Path(tmp)
        (work / "salt").write_bytes(SALT)
        night = work / "night.jsonl"
        write_night(
            night, args.night_blocks, args.block_size, args.shared_blocks, args.prefixes, seed=1
        )
        base = [
            sys.executable,
            "-m",
            "kvtrace.cli",
            "anonymize",
            "--input",
            str(night),
            "--tokenizer",
            args.tokenizer,
            "--block-size",
            str(args.block_size),
            "--salt-file",
            str(work / "salt"),
            "--engine",
            args.engine,
        ]
        print(
            f"night: {args.night_blocks:,} block occurrences (block size {args.block_size}), "
            f"{night.stat().st_size / 2**20:.0f} MiB of JSONL; engine {args.engine}"
        )
        print(
            "| map before | run | map MiB | map read MiB | row groups read | wall s "
            "| peak RSS MiB |\n|---|---|---|---|---|---|---|"
        )
        seconds, peak, _ = run_measured_with_log([*base, "--output", str(work / "out-none")])
        print(f"| no map | night | 0 | 0 | - | {seconds:.1f} | {peak:.0f} |", flush=True)
        for size in (int(s) for s in args.map_sizes.split(",")):
            directory = work / f"map-{size}"
            write_map(directory, size, identity)
            command = [*base, "--output", str(work / f"out-{size}"), "--id-map", str(directory)]
            print(row(f"{size:,} ids", "night (all new)", directory, command), flush=True)
            shutil_rmtree(work / f"out-{size}")
        print(row("that map + the night", "same night again (all known)", directory, command))


def row(before: str, run: str, directory: Path, command: list[str]) -> str:
    map_mib = map_bytes(directory) / 2**20
    seconds, peak, log = run_measured_with_log(command)
    read = MAP_READ.search(log)
    mib, groups = (f"{float(read[1]):.1f}", f"{read[2]} of {read[3]}") if read else ("?", "?")
    return f"| {before} | {run} | {map_mib:.0f} | {mib} | {groups} | {seconds:.1f} | {peak:.0f} |"


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def map_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("segments/*/*"))


if __name__ == "__main__":
    main()
