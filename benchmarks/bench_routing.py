"""Does routing a session's requests to one Beam worker pay for its shuffle? (issue 23)

`kvtrace anonymize --engine beam` with and without `--route-sessions`, alternated run by run, on
the runner the extra Beam options name (default: the DirectRunner with two worker processes):
wall seconds, peak memory, the segment cache's token hit rate (the job's own log line), and
whether the outputs are byte-identical; plus what routing shuffles (the payloads as
transforms/read/routing.py builds them) against what is read.

    python benchmarks/bench_routing.py benchmarks/corpora/agent.jsonl \
        --tokenizer ../shared/tokenizers/qwen3 --runs 3
    python benchmarks/bench_routing.py ... -- --runner FlinkRunner --flink_master localhost:8081 ...
"""

from __future__ import annotations

import filecmp
import json
import pickle
import re
import statistics
import sys
import tempfile
from pathlib import Path

from measure import corpus_parser, run_measured_with_log

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# Threads of the Beam child: the CLI refuses multi_processing (its SDK workers report to no one).
DIRECT_TWO_WORKERS = ["--direct_num_workers", "2", "--direct_running_mode", "multi_threading"]
HIT_RATE = re.compile(r"segment cache: ([0-9.]+)% of (\d+) tokens")


def routed_bytes(corpus: Path) -> tuple[int, int, int]:
    """(requests, sessions, bytes of key and payload routing shuffles), as the pipeline keys
    them; pickling adds a few bytes per element."""
    from kvtrace.transforms.read.records import ParseOptions
    from kvtrace.transforms.read.routing import route_key, routed
    from kvtrace.transforms.read.sources import file_ranges, parse_one, read_range

    options, requests, sessions, size = ParseOptions(), 0, set(), 0
    for piece in file_ranges(str(corpus), corpus.stat().st_size):
        for source, line in read_range(piece, options.max_record_bytes):
            request = parse_one(source, line, options)
            key, payload = route_key(request), routed(request)
            requests += 1
            sessions.add(key)
            size += len(key) + (
                sum(map(len, payload)) if isinstance(payload, tuple) else len(pickle.dumps(payload))
            )
    return requests, len(sessions), size


def one_run(
    corpus: Path, tokenizer: str, block_size: int, beam_flags: list[str], routed: bool, out: Path
) -> dict:
    command = [
        sys.executable,
        "-m",
        "kvtrace.cli",
        "anonymize",
        "--input",
        str(corpus),
        "--output",
        str(out),
        "--tokenizer",
        tokenizer,
        "--block-size",
        str(block_size),
        "--salt-file",
        str(out.parent / "salt"),
        "--engine",
        "beam",
        *beam_flags,
        *(["--route-sessions"] if routed else []),
    ]
    seconds, peak_mib, log = run_measured_with_log(command)
    found = HIT_RATE.search(log)
    return {
        "routed": routed,
        "seconds": round(seconds, 2),
        "peak_rss_mib": round(peak_mib),
        "token_hit_rate": float(found.group(1)) / 100 if found else None,
        "tokens": int(found.group(2)) if found else None,
    }


def main() -> None:
    parser = corpus_parser(__doc__)
    parser.add_argument("--runs", type=int, default=3, help="pairs, alternated")
    args, rest = parser.parse_known_args()  # after --: Beam options
    beam_flags = [flag for flag in rest if flag != "--"] or DIRECT_TWO_WORKERS
    requests, sessions, shuffled = routed_bytes(args.corpus)
    result = {
        "corpus": str(args.corpus),
        "corpus_mb": args.corpus.stat().st_size / 1e6,
        "requests": requests,
        "routing_keys": sessions,
        "routed_mb": shuffled / 1e6,
        "beam_flags": beam_flags,
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "salt").write_bytes(b"benchmark salt, 32 bytes long...")
        for run in range(args.runs):
            for routed in (False, True):
                out = Path(tmp, f"out-{run}-{int(routed)}")
                result["runs"].append(
                    one_run(args.corpus, args.tokenizer, args.block_size, beam_flags, routed, out)
                )
        first = Path(tmp, "out-0-0")
        result["outputs_identical"] = all(
            not filecmp.dircmp(first, Path(tmp, f"out-{run}-1")).diff_files
            for run in range(args.runs)
        )
    for routed in (False, True):
        runs = [r for r in result["runs"] if r["routed"] == routed]
        name = "routed" if routed else "unrouted"
        result[f"median_seconds_{name}"] = statistics.median(r["seconds"] for r in runs)
        rates = [r["token_hit_rate"] for r in runs if r["token_hit_rate"] is not None]
        result[f"median_hit_rate_{name}"] = statistics.median(rates) if rates else None
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
