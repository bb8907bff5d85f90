"""What a night costs against the size of the id map it extends (--engine, default beam).

A night of N_NEW_BLOCKS new blocks (token-id requests, so tokenizing does not hide the id work)
is anonymized with no map, then against maps of each --map-sizes; finally the same night again
against the last map it has just extended (every block known: the rerun case). Maps are written
directly as one segment of random keyed hashes with metadata that matches the run, as a map of
that size built night by night would look after compaction. "map MiB" is what the night reads
of the map (every segment file, streamed once).

    python benchmarks/bench_id_map.py --tokenizer ../shared/tokenizers/deepseek-r1 \
        --map-sizes 1000000,8000000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from transforms.encode.blocks import HASH_SCHEME, salt_fingerprint
from transforms.ids.dense_ids import (
    DEFAULT_HASH_SHARDS,
    NUMBERED,
    shard_of,
    split_by,
)
from transforms.ids.id_map import (
    MapIdentity,
    MapVersion,
    empty_version,
    publish,
    relative,
    segment_path,
    write_segment,
)
from transforms.encode.tokenize import load_tokenizer, tokenization_fingerprint, tokenizer_sha256
from measure import run_measured

SALT = b"benchmark-salt-of-enough-bytes!!"
BLOCK_SIZE = 16
TOKENS_PER_REQUEST = 1_600  # 100 blocks
N_NEW_BLOCKS = 1_000_000
DAY_MS = 86_400_000


def write_night(path: Path, blocks: int, seed: int) -> None:
    """Requests of random token ids: every block is new to any map."""
    rng = np.random.default_rng(seed)
    requests = blocks * BLOCK_SIZE // TOKENS_PER_REQUEST
    with open(path, "w") as f:
        for i in range(requests):
            tokens = rng.integers(0, 120_000, TOKENS_PER_REQUEST).tolist()
            f.write(json.dumps({"timestamp": DAY_MS + 8 * i, "input_ids": tokens,
                                "output_length": 100}) + "\n")


def write_map(directory: Path, ids: int, identity: MapIdentity) -> None:
    """Version 1 of a map holding `ids` random hashes (ids 0..ids-1), sharded as a run would."""
    rng = np.random.default_rng(7)
    table = np.empty(ids, dtype=NUMBERED)
    table["hi"] = rng.integers(0, 2**63, ids, dtype=np.uint64)
    table["lo"] = rng.integers(0, 2**63, ids, dtype=np.uint64)
    table["id"] = np.arange(ids)
    files = []
    for shard, part in split_by(table, shard_of(table, DEFAULT_HASH_SHARDS)):
        path = segment_path(str(directory), 1, "bench", "blocks", shard)
        write_segment(path, [part])
        files.append(relative(str(directory), path))
    version = MapVersion(1, identity, 0, {"blocks": ids, "sessions": 0},
                         {"blocks": sorted(files), "sessions": []})
    publish(str(directory), empty_version(identity), version)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--map-sizes", default="0,1000000,10000000")
    parser.add_argument("--engine", choices=("local", "beam"), default="beam")
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.tokenizer)
    identity = MapIdentity(salt_fingerprint(SALT), BLOCK_SIZE, tokenizer_sha256(args.tokenizer),
                           HASH_SCHEME, {}, tokenization_fingerprint(tokenizer))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "salt").write_bytes(SALT)
        night = work / "night.jsonl"
        write_night(night, N_NEW_BLOCKS, seed=1)
        base = [sys.executable, "-m", "kvtrace.cli", "anonymize", "--input", str(night),
                "--tokenizer", args.tokenizer, "--block-size", str(BLOCK_SIZE),
                "--salt-file", str(work / "salt"), "--engine", args.engine]
        print(f"night: {N_NEW_BLOCKS:,} new blocks, {night.stat().st_size / 2**20:.0f} MiB of JSONL")
        print("| map before | run | map MiB | wall s | peak RSS MiB |\n|---|---|---|---|---|")
        seconds, peak = run_measured([*base, "--output", str(work / "out-none")])
        print(f"| no map | night | 0 | {seconds:.1f} | {peak:.0f} |")
        for size in (int(s) for s in args.map_sizes.split(",")):
            directory = work / f"map-{size}"
            if size:
                write_map(directory, size, identity)
            command = [*base, "--output", str(work / f"out-{size}"), "--id-map", str(directory)]
            map_mib = map_bytes(directory) / 2**20
            seconds, peak = run_measured(command)
            print(f"| {size:,} ids | night (+{N_NEW_BLOCKS:,}) | {map_mib:.0f} | {seconds:.1f} "
                  f"| {peak:.0f} |")
        map_mib = map_bytes(directory) / 2**20
        seconds, peak = run_measured(command)
        print(f"| {size + N_NEW_BLOCKS:,} ids | same night again (all known) | {map_mib:.0f} "
              f"| {seconds:.1f} | {peak:.0f} |")


def map_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("segments/*/*.parquet"))


if __name__ == "__main__":
    main()
