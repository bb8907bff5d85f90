"""Wall time and peak memory of `kvtrace audit` (the publication gate) on a large output folder.

    python benchmarks/bench_audit.py --rows 10000000 benchmarks/corpora/audit-10m

Writes the folder first if it is not there: ROWS rows of 1-4 blocks (block size 512), a shared
first block per thousand rows and new ids after it (dense from 0), 3M rows per shard, through
the writers' own serializers; stats.json computed here with numpy, independently of the audit.
Then runs `python -m kvtrace.cli audit FOLDER` as a whole process and reports seconds, peak RSS
and the verdict (which must be publishable: the folder is exactly what kvtrace writes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import run_measured  # noqa: E402

from kvtrace.transforms.trace_format import (  # noqa: E402
    MANIFEST,
    NO_RESPONSE_MS,
    NO_SESSION,
    STATS,
    TraceColumns,
    canonical_json,
    jsonl_bytes,
    parquet_bytes,
    shard_name,
)
from kvtrace.transforms.write.manifest import KVTRACE_VERSION, replay_contract, set_content_times  # noqa: E402
from kvtrace.transforms.write.publish import sha256_of  # noqa: E402
from kvtrace.transforms.write.replayers import replay_commands  # noqa: E402
from kvtrace.transforms.write.totals import ExportTotals, export_stats  # noqa: E402

BLOCK = 512
ROWS_PER_SHARD = 3_000_000  # ~7.5M blocks: under the 8M kvtrace cuts a shard at (write/shards.py)
SHARED_PREFIXES = 1000


def first_seen_numbers(raw: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Published ids as kvtrace numbers them: 0, 1, 2, ... in the order they first appear."""
    unseen = raw[labels[raw] < 0]
    order = np.argsort(unseen, kind="stable")
    first = np.ones(len(unseen), bool)
    first[1:] = unseen[order][1:] != unseen[order][:-1]
    new = unseen[np.sort(order[first])]
    start = int(labels.max()) + 1
    labels[new] = start + np.arange(len(new))
    return labels[raw]


def write_folder(folder: Path, rows: int) -> None:
    rng = np.random.default_rng(7)
    folder.mkdir(parents=True)
    shards = -(-rows // ROWS_PER_SHARD)
    digests, next_id, weights = {}, SHARED_PREFIXES, [np.full(SHARED_PREFIXES, BLOCK)]
    labels = np.full(SHARED_PREFIXES + rows * 3, -1, np.int64)  # raw id -> published id
    totals = ExportTotals()
    for shard in range(shards):
        n = min(ROWS_PER_SHARD, rows - shard * ROWS_PER_SHARD)
        input_length = rng.integers(BLOCK, 4 * BLOCK + 1, n)
        num_ids = -(-input_length // BLOCK)
        new = num_ids - 1
        ids = np.empty(int(num_ids.sum()), np.int64)
        starts = np.cumsum(num_ids) - num_ids
        ids[starts] = (np.arange(n) + shard * ROWS_PER_SHARD) % SHARED_PREFIXES
        rest = np.ones(len(ids), bool)
        rest[starts] = False
        ids[rest] = next_id + np.arange(int(new.sum()))
        next_id += int(new.sum())
        ids = first_seen_numbers(ids, labels)
        position = np.arange(len(ids)) - np.repeat(starts, num_ids)
        weights.append(np.minimum(BLOCK, np.repeat(input_length, num_ids) - position * BLOCK)[rest])
        output_length = rng.integers(0, 2000, n)
        columns = TraceColumns(
            np.arange(n, dtype=np.int64) * 3 + shard * ROWS_PER_SHARD * 3,
            input_length,
            output_length,
            num_ids,
            ids,
            np.full(n, NO_SESSION),
            np.full(n, NO_RESPONSE_MS),
        )
        for suffix, data in (
            (".jsonl", jsonl_bytes(columns)),
            (".parquet", parquet_bytes(columns)),
        ):
            name = shard_name(shard, shards, suffix)
            (folder / name).write_bytes(data)
            digests[name] = sha256_of(data)
        totals = ExportTotals(
            totals.requests + n,
            totals.input_tokens + int(input_length.sum()),
            totals.output_tokens + int(output_length.sum()),
            totals.blocks + int(num_ids.sum()),
        )
        print(f"shard {shard + 1} of {shards} written", file=sys.stderr)
    stats = canonical_json(export_stats(totals, next_id, int(np.concatenate(weights).sum())))
    (folder / STATS).write_bytes(stats)
    digests[STATS] = sha256_of(stats)
    manifest = {
        "kvtrace_version": KVTRACE_VERSION,
        "format": "mooncake-trace",
        "tokenizer": {"name": None, "sha256": {}},
        "block_size": BLOCK,
        "hash_scheme": "xxh3-128-chained-salted-v1",
        "hash_scheme_keyed": True,
        "granularity": {"timestamp_ms": 1, "output_length": 1},
        "output_hash_ids": False,
        "chat_template_kwargs": {},
        "id_map": None,
        "records": {"exported": rows},
        "files": sorted(digests),
        "sha256": digests,
        "replay": replay_commands(BLOCK, rows, sorted(digests)),
        **replay_contract(),  # the ids' scope and the hit rates' definitions, as anonymize's
    }
    (folder / MANIFEST).write_bytes(canonical_json(manifest))
    set_content_times(str(folder))  # as anonymize publishes: the gate checks file times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    if not args.folder.exists():
        write_folder(args.folder, args.rows)
    report = args.folder.parent / f"{args.folder.name}.audit.json"
    runs = [
        run_measured(
            [sys.executable, "-m", "kvtrace.cli", "audit", str(args.folder), "--json", str(report)]
        )
        for _ in range(args.repeat)
    ]
    verdict = json.loads(report.read_text())
    size = sum(os.path.getsize(p) for p in args.folder.iterdir())
    print(
        json.dumps(
            {
                "rows": verdict["rows"],
                "folder_mb": round(size / 2**20),
                "seconds": [round(s, 1) for s, _ in runs],
                "peak_rss_mib": [round(m) for _, m in runs],
                "publishable": verdict["publishable"],
                "flags": verdict["flags"],
            }
        )
    )


if __name__ == "__main__":
    main()
