"""One kvtrace command with this tree against a baseline revision: CPU time, wall time and peak
memory, runs alternated pair by pair so the machine's drift hits both alike.

    python benchmarks/bench_paired.py --baseline ff8ab1a --pairs 4 -- anonymize \\
        --input benchmarks/corpora/agent.jsonl --tokenizer ../shared/tokenizers/qwen3 \\
        --block-size 512 --output OUT

Each tree runs `python -m kvtrace.cli ARGS` from its own root (so its own code is imported),
OUT replaced by a fresh folder each run. Prints each run's figures and the median paired
ratios this/baseline; CPU time (user + system, the process and its children) is the steadier
figure on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from measure import ROOT, baseline_tree, run_measured_cpu

PLACEHOLDER = "OUT"


def run_in(tree: Path, kvtrace_args: list[str], out: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one run of the command from tree."""
    command = [
        sys.executable,
        "-m",
        "kvtrace.cli",
        *(str(out) if arg == PLACEHOLDER else arg for arg in kvtrace_args),
    ]
    return run_measured_cpu(command, tree, {**os.environ, "PYTHONPATH": str(tree)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a git revision to compare with")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("kvtrace_args", nargs="+", help=f"after --; {PLACEHOLDER} is the output")
    args = parser.parse_args()
    inputs = [str(Path(arg).resolve()) if Path(arg).exists() else arg for arg in args.kvtrace_args]
    with tempfile.TemporaryDirectory() as tmp, baseline_tree(args.baseline, Path(tmp)) as baseline:
        figures: dict[str, list[tuple[float, float, float]]] = {"this": [], "baseline": []}
        print("| pair | tree | wall s | CPU s | peak RSS MiB |\n|---|---|---|---|---|")
        for pair in range(args.pairs):
            trees = [("this", ROOT), ("baseline", baseline)]
            for name, tree in trees if pair % 2 == 0 else trees[::-1]:
                run = run_in(tree, inputs, Path(tmp) / f"out-{name}-{pair}")
                figures[name].append(run)
                print(
                    f"| {pair + 1} | {name} | {run[0]:.2f} | {run[1]:.2f} | {run[2]:.0f} |",
                    flush=True,
                )
        for index, what in ((0, "wall"), (1, "CPU")):
            this = [run[index] for run in figures["this"]]
            base = [run[index] for run in figures["baseline"]]
            ratios = [a / b for a, b in zip(this, base)]
            print(
                f"{what}: median this {statistics.median(this):.2f} s, baseline "
                f"{statistics.median(base):.2f} s; median paired ratio "
                f"{statistics.median(ratios):.3f} (spread {min(ratios):.3f}-"
                f"{max(ratios):.3f})"
            )


if __name__ == "__main__":
    main()
