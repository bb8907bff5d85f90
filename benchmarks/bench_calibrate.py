"""`kvtrace calibrate` over a 1M-request night: wall time and peak memory of the whole process
(issue 37: under a minute, bounded memory), lru fitted over every capacity.

The night is generated (seeded): requests extending earlier requests' prefixes or new, 1 s
apart per 1,000, with measured counts from kvtrace's own LRU at a known capacity (so the fit
must find it: the figure printed beside the time). Paired runs: give --repeat to see the noise.

    python benchmarks/bench_calibrate.py --requests 1000000 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from measure import run_measured

BLOCK = 16
CAPACITY_PAGES = 20_000


def night(folder: Path, requests: int, seed: int = 1) -> tuple[Path, Path]:
    """(trace, measured file): a one-shard output folder (its shard and manifest) and its
    measured file as a run joins it; the counts are the LRU replay's at CAPACITY_PAGES."""
    from kvtrace.transforms.cache.cache_trace import causal_rows, read_cache_trace
    from kvtrace.transforms.cache.policies import row_hits
    from kvtrace.transforms.read.measured import join_measured, measured_bytes, measured_part
    from kvtrace.transforms.read.trace_io import read_trace
    from kvtrace.transforms.trace_format import FORMAT, canonical_json
    from kvtrace.transforms.write.publish import sha256_of

    random = np.random.default_rng(seed)
    (folder / "night").mkdir()
    trace, fresh, kept = folder / "night" / "trace-00000-of-00001.jsonl", 0, []
    with trace.open("w") as out:
        for index in range(requests):
            ids: list[int] = []
            if kept and random.random() < 0.7:
                earlier = kept[int(random.integers(len(kept)))]
                ids = earlier[: int(random.integers(1, len(earlier) + 1))]
            extra = int(random.integers(1, 12))
            ids, fresh = [*ids, *range(fresh, fresh + extra)], fresh + extra
            kept.append(ids)
            if len(kept) > 5_000:  # recent prefixes: reuse at every distance up to ~5k requests
                kept.pop(int(random.integers(len(kept))))
            row = {"timestamp": index, "input_length": BLOCK * len(ids), "output_length": 1}
            out.write(json.dumps({**row, "hash_ids": ids}) + "\n")
    manifest = canonical_json(
        {
            "format": FORMAT,
            "records": {"exported": requests},
            "sha256": {trace.name: sha256_of(trace.read_bytes())},
        }
    )
    (folder / "night" / "manifest.json").write_bytes(manifest)
    _, cache = read_cache_trace([str(trace)], BLOCK)
    hits = row_hits(cache, "lru", [CAPACITY_PAGES * BLOCK])[0]
    per_row = np.empty(len(hits), dtype=np.int64)
    per_row[causal_rows(read_trace([str(trace)]))] = hits  # file order: the one shard's rows
    (folder / "letters").mkdir()
    (folder / "letters" / measured_part(0)).write_bytes(measured_bytes(0, per_row) or b"")
    return trace.parent, Path(join_measured(str(folder / "letters"), sha256_of(manifest)) or "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        trace, measured = night(Path(tmp), args.requests)
        print(f"night of {args.requests:,} requests made in {time.perf_counter() - started:.0f} s")
        report = Path(tmp) / "fit.json"
        command = ["python", "-m", "kvtrace.cli", "calibrate", str(trace), "--block-size"]
        command += [str(BLOCK), "--measured", str(measured), "--json", str(report)]
        for _ in range(args.repeat):
            seconds, peak_mib = run_measured(command)
            lru = json.loads(report.read_text())["policies"]["lru"]
            print(
                f"calibrate: {seconds:.1f} s, peak {peak_mib:,.0f} MiB; lru capacity "
                f"{lru['capacity_tokens']:,}..{lru['capacity_tokens_upto']:,} tokens (true "
                f"{CAPACITY_PAGES * BLOCK:,}), mean error {lru['mae_tokens']:.2f} tokens"
            )


if __name__ == "__main__":
    main()
