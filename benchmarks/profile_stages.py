"""CPU seconds per stage of `kvtrace anonymize` (local engine), which stages are serial, and an
Amdahl projection of the whole run to more cores (issue 10).

Each stage runs alone over the whole corpus, in the order the job runs them, and is timed by
wall clock and by process CPU time (user + system, all threads: the Rust tokenizer's too).
A stage is parallel when its work splits across workers with no shared state (records, batches),
serial when it needs everything in one place (numbering ids by first occurrence, the process's
fixed start-up). Stages the job overlaps (rendering and hashing behind tokenization) are timed
apart here, so the table shows the work, not the overlap.

    python benchmarks/profile_stages.py benchmarks/corpora/rendered.jsonl \\
        --tokenizer ../shared/tokenizers/deepseek-r1 --block-size 512
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from measure import corpus_parser

STAGES: list[dict] = []
# What can run on every core: per record and per batch work. Fixed start-up and the global
# numbering stay on one core (they are what Amdahl's law charges).
PARALLEL = {
    "read": False,
    "parse": True,
    "render": True,
    "tokenize": True,
    "hash": True,
    "ids": False,
    "rows and write": False,
    "start-up": False,
}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def stage(name: str):
    wall, cpu = time.perf_counter(), _cpu()
    yield
    STAGES.append(
        {
            "stage": name,
            "wall_s": time.perf_counter() - wall,
            "cpu_s": _cpu() - cpu,
            "parallel": PARALLEL[name],
        }
    )


def startup_seconds(tokenizer: str) -> float:
    """Fixed cost of a run: a one-record job as a whole process, minus nothing (the work is nil)."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "one.jsonl").write_text('{"timestamp": 0, "prompt": "hello"}\n')
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "kvtrace.cli",
                "anonymize",
                "--input",
                f"{tmp}/one.jsonl",
                "--output",
                f"{tmp}/out",
                "--tokenizer",
                tokenizer,
            ],
            check=True,
            capture_output=True,
        )
        return time.perf_counter() - start


def profile(corpus: Path, tokenizer_name: str, block_size: int) -> None:
    from kvtrace.transforms.batching import batches_by_weight
    from kvtrace.transforms.encode.encode_requests import (
        TOKENIZE_BATCH_BYTES,
        TOKENIZE_BATCH_REQUESTS,
        EncodeOptions,
        open_encoder,
    )
    from kvtrace.transforms.encode.hashed_batch import HashedBatch
    from kvtrace.transforms.encode.salt import SaltSource
    from kvtrace.transforms.ids.dense_ids import block_keys, dense_ids, session_keys
    from kvtrace.transforms.read.records import ParseOptions
    from kvtrace.transforms.read.sources import file_ranges, parse_one, read_range
    from kvtrace.transforms.trace_format import jsonl_bytes, parquet_bytes
    from kvtrace.transforms.write.rows import row_batch
    from kvtrace.transforms.write.shards import published_columns

    salt = SaltSource("random", inline=b"profile salt, 32 bytes long.....")
    encoder = open_encoder(EncodeOptions(tokenizer_name, salt, block_size=block_size))
    with stage("read"):
        records = [
            item
            for piece in file_ranges(str(corpus), corpus.stat().st_size)
            for item in read_range(piece, 64 << 20)
        ]
    with stage("parse"):
        requests = [parse_one(*record, ParseOptions()) for record in records]
    batches = list(
        batches_by_weight(
            requests, TOKENIZE_BATCH_BYTES, lambda r: len(r.line), TOKENIZE_BATCH_REQUESTS
        )
    )
    with stage("render"):
        rendered = [encoder.render(batch)[0] for batch in batches]
    with stage("tokenize"):
        tokenized = [encoder.tokenize(batch) for batch in rendered]
    with stage("hash"):
        hashed = [encoder.hash(r, t)[0] for r, t in zip(rendered, tokenized)]
    with stage("ids"):
        whole = HashedBatch.concat(hashed)
        block_ids = dense_ids(block_keys(whole, block_size)).ids
        session_ids = dense_ids(session_keys(whole)).ids
    with stage("rows and write"):
        rows = row_batch(whole.requests, block_ids, session_ids).sorted()
        columns = published_columns(rows, int(rows.rows["timestamp_ms"].min()))
        jsonl_bytes(columns), parquet_bytes(columns)


def amdahl(stages: list[dict], cores: int) -> float:
    serial = sum(s["cpu_s"] for s in stages if not s["parallel"])
    parallel = sum(s["cpu_s"] for s in stages if s["parallel"])
    return serial + parallel / cores


def main() -> None:
    parser = corpus_parser(__doc__)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    startup = startup_seconds(args.tokenizer)
    profile(args.corpus, args.tokenizer, args.block_size)
    STAGES.append({"stage": "start-up", "wall_s": startup, "cpu_s": startup, "parallel": False})
    total_cpu = sum(s["cpu_s"] for s in STAGES)
    serial_cpu = sum(s["cpu_s"] for s in STAGES if not s["parallel"])
    cores = os.cpu_count() or 1
    print(
        json.dumps(
            {
                "corpus": str(args.corpus),
                "block_size": args.block_size,
                "cores": cores,
                "stages": STAGES,
                "total_cpu_s": total_cpu,
                "serial_cpu_s": serial_cpu,
                "serial_share": serial_cpu / total_cpu,
                "amdahl_wall_s": {n: amdahl(STAGES, n) for n in (1, 2, 16, 64)},
                "amdahl_speedup": {n: amdahl(STAGES, 1) / amdahl(STAGES, n) for n in (2, 16, 64)},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
