"""What a commit's check of the files it carries over costs (id_map.check_carried_files:
each index by its sha256, each segment file's size and footer by the record's digests),
against verifying every row group of those files (what a folding night's whole read does).

    python benchmarks/bench_carried_files.py --files 4096 --rows 2000
    python benchmarks/bench_carried_files.py --files 64 --rows 200000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from kvtrace.transforms.ids import segments
from kvtrace.transforms.ids.dense_ids import NUMBERED


def rows_of(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = np.empty(count, dtype=NUMBERED)
    rows["hi"] = rng.integers(0, 2**63, count, dtype=np.uint64)
    rows["lo"] = rng.integers(0, 2**63, count, dtype=np.uint64)
    rows["id"] = np.arange(count, dtype=rows["id"].dtype)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        listed = [
            segments.write_segment(
                str(Path(folder) / f"blocks-{n:05d}.parquet"), [rows_of(args.rows, n)]
            )
            for n in range(args.files)
        ]
        indexes = sum(s.index["bytes"] for s in listed) / 2**20
        data = sum(s.data["bytes"] for s in listed) / 2**20
        wall, cpu = time.perf_counter(), time.process_time()
        for segment in listed:
            segments.check_listed(segment)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        whole = time.perf_counter()
        for segment in listed:
            for _ in segments.read_segment(segment, 1):
                pass
        whole = time.perf_counter() - whole
    print(
        f"{args.files} files x {args.rows} rows ({indexes:.1f} MiB of indexes, {data:.1f} MiB "
        f"of segments): indexes and footers {wall:.2f} s wall, {cpu:.2f} s CPU; every row "
        f"group {whole:.2f} s wall"
    )


if __name__ == "__main__":
    main()
