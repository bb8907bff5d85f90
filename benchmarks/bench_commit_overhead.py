"""What a night's durability and integrity cost: the same night with this tree against a
baseline revision (before staging, fsyncs and checksums), runs alternated so the machine's drift
hits both alike.

    python benchmarks/bench_commit_overhead.py benchmarks/corpora/chat.jsonl \\
        --tokenizer ../shared/tokenizers/deepseek-r1 --baseline 67a1335 --runs 5

Each run is a second night against a map holding the first (block size 16, so the map is
large), with its own copy of the map and a previous output to replace. Prints each run's wall
seconds and peak RSS and the median ratio this/baseline.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from measure import ROOT, baseline_tree, run_measured

SALT = b"benchmark-salt-of-enough-bytes!!"


def _night(tree: Path, work: Path, corpus: Path, tokenizer: str, out: str, day: int) -> list[str]:
    return [
        "env",
        f"PYTHONPATH={tree}",
        sys.executable,
        "-m",
        "kvtrace.cli",
        "anonymize",
        "--input",
        str(corpus),
        "--output",
        str(work / out),
        "--id-map",
        str(work / "map"),
        "--tokenizer",
        tokenizer,
        "--block-size",
        "16",
        "--salt-file",
        str(work / "salt"),
        "--hash-shards",
        "64",
        "--dead-letter",
        str(work / f"{out}-rejected-{day}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--baseline", required=True, help="a git revision to compare with")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(dir=ROOT / "benchmarks" / "corpora") as tmp,
        baseline_tree(args.baseline, Path(tmp)) as baseline,
    ):
        tmp = Path(tmp)
        lines = args.corpus.read_bytes().splitlines(keepends=True)
        half = len(lines) // 2
        (tmp / "first.jsonl").write_bytes(b"".join(lines[:half]))
        (tmp / "second.jsonl").write_bytes(b"".join(lines[half:]))
        seeds = {}
        for name, tree in (("this", ROOT), ("baseline", baseline)):
            seed = tmp / f"seed-{name}"
            seed.mkdir()
            (seed / "salt").write_bytes(SALT)
            subprocess.run(
                _night(tree, seed, tmp / "first.jsonl", args.tokenizer, "out", 1),
                check=True,
                capture_output=True,
            )
            seeds[name] = (seed, tree)
        times: dict[str, list[float]] = {"this": [], "baseline": []}
        print("| run | tree | wall s | peak RSS MiB |\n|---|---|---|---|")
        for run in range(args.runs):
            for name, (seed, tree) in seeds.items():
                work = tmp / f"run-{name}"
                shutil.rmtree(work, ignore_errors=True)
                shutil.copytree(seed, work)
                seconds, peak = run_measured(
                    _night(tree, work, tmp / "second.jsonl", args.tokenizer, "out", 2)
                )
                times[name].append(seconds)
                print(f"| {run + 1} | {name} | {seconds:.2f} | {peak:.0f} |", flush=True)
        ratios = [a / b for a, b in zip(times["this"], times["baseline"])]
        print(
            f"median wall: this {statistics.median(times['this']):.2f} s, baseline "
            f"{statistics.median(times['baseline']):.2f} s; median paired ratio "
            f"{statistics.median(ratios):.3f}"
        )


if __name__ == "__main__":
    main()
