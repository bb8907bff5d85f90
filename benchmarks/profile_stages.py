"""CPU seconds per stage of `kvtrace anonymize` (local engine), which stages are serial, and an
Amdahl projection of the whole run to more cores (issue 10), with the tokenizer backend given
(issue 36: what bounds the run once tokenizing is cheap).

Each stage runs alone over the whole corpus, in the order the job runs them, and is timed by
wall clock and by process CPU time (user + system, all threads: the Rust tokenizer's too).
A stage is parallel when its work splits across workers with no shared state (records, batches),
serial when it needs everything in one place (numbering ids by first occurrence, the process's
fixed start-up). Stages the job overlaps (rendering and hashing behind tokenization) are timed
apart here, so the table shows the work, not the overlap.

    python benchmarks/profile_stages.py benchmarks/corpora/rendered.jsonl \\
        --tokenizer ../shared/tokenizers/deepseek-r1 --block-size 512 --tokenizer-backend fastokens

Start-up is the CPU time of a one-record run as a whole process (imports, tokenizer loads, the
backend's probes, the job's fixed steps); `whole_process_cpu_s` is the corpus's whole run, so the
stages' shares of it can be read (what is left: the engine's own overhead and overlap).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from measure import ROOT, corpus_parser, run_measured_cpu

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


def anonymize_cpu_seconds(corpus: Path, tokenizer: str, backend: str, block_size: int) -> float:
    """CPU seconds (user + system, the process and its workers) of `kvtrace anonymize` on corpus
    as a whole process, this checkout's kvtrace."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "kvtrace.cli",
            "anonymize",
            "--input",
            str(corpus),
            "--output",
            f"{tmp}/out",
            "--tokenizer",
            tokenizer,
            "--tokenizer-backend",
            backend,
            "--block-size",
            str(block_size),
            "--quiet",
        ]
        return run_measured_cpu(command, ROOT, env)[1]


def startup_seconds(tokenizer: str, backend: str) -> float:
    """Fixed cost of a run: a one-record job as a whole process (the work is nil)."""
    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp, "one.jsonl")
        one.write_text('{"timestamp": 0, "prompt": "hello", "output_length": 1}\n')
        return anonymize_cpu_seconds(one, tokenizer, backend, 512)


def profile(corpus: Path, tokenizer_name: str, block_size: int, backend: str) -> None:
    from kvtrace.transforms.batching import batches_by_weight
    from kvtrace.transforms.encode.encode_requests import (
        TOKENIZE_BATCH_BYTES,
        TOKENIZE_BATCH_REQUESTS,
        EncodeOptions,
        open_encoder,
    )
    from kvtrace.transforms.encode.hashed_batch import HashedBatch
    from kvtrace.transforms.encode.salt import SaltSource
    from kvtrace.transforms.garbage import settle_after_start_up
    from kvtrace.transforms.ids.dense_ids import block_keys, dense_ids, session_keys
    from kvtrace.transforms.read.records import ParseOptions
    from kvtrace.transforms.read.sources import file_ranges, parse_one, read_range
    from kvtrace.transforms.trace_format import jsonl_bytes, parquet_bytes
    from kvtrace.transforms.write.rows import row_batch
    from kvtrace.transforms.write.shards import published_columns

    salt = SaltSource("random", inline=b"profile salt, 32 bytes long.....")
    options = EncodeOptions(tokenizer_name, salt, block_size=block_size, tokenizer_backend=backend)
    encoder = open_encoder(options)
    settle_after_start_up()  # as a worker does: start-up's objects left out of the collector
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
    parser.add_argument("--tokenizer-backend", default="tokenizers")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # this checkout's kvtrace in the stages, as in the whole runs (not another installed copy:
    # from a worktree, the editable install is the main checkout's)
    sys.path.insert(0, str(ROOT))
    backend = args.tokenizer_backend
    startup = startup_seconds(args.tokenizer, backend)
    whole = anonymize_cpu_seconds(args.corpus, args.tokenizer, backend, args.block_size)
    profile(args.corpus, args.tokenizer, args.block_size, backend)
    STAGES.append({"stage": "start-up", "wall_s": startup, "cpu_s": startup, "parallel": False})
    total_cpu = sum(s["cpu_s"] for s in STAGES)
    serial_cpu = sum(s["cpu_s"] for s in STAGES if not s["parallel"])
    cores = os.cpu_count() or 1
    print(
        json.dumps(
            {
                "corpus": str(args.corpus),
                "block_size": args.block_size,
                "tokenizer_backend": backend,
                "whole_process_cpu_s": whole,
                "share_of_whole": {s["stage"]: s["cpu_s"] / whole for s in STAGES},
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
