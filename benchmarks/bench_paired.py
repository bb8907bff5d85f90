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
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDER = "OUT"
# Runs a command; prints the wall seconds, CPU seconds and peak RSS (KiB) of it and its children.
_MEASURE = (
    "import json, resource, subprocess, sys, time; start = time.perf_counter(); "
    "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
    "wall = time.perf_counter() - start; usage = resource.getrusage(resource.RUSAGE_CHILDREN); "
    "print(json.dumps([wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss]))"
)


def run_in(tree: Path, kvtrace_args: list[str], out: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one run of the command from tree."""
    command = [sys.executable, "-m", "kvtrace.cli",
               *(str(out) if arg == PLACEHOLDER else arg for arg in kvtrace_args)]
    measured = subprocess.run([sys.executable, "-c", _MEASURE, *command], cwd=tree, check=True,
                              capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(tree)})
    wall, cpu, peak_kib = json.loads(measured.stdout.split("\n")[-2])
    return wall, cpu, peak_kib / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a git revision to compare with")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("kvtrace_args", nargs="+", help=f"after --; {PLACEHOLDER} is the output")
    args = parser.parse_args()
    inputs = [str(Path(arg).resolve()) if Path(arg).exists() else arg for arg in args.kvtrace_args]
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(baseline),
                        args.baseline], check=True, capture_output=True)
        try:
            figures: dict[str, list[tuple[float, float, float]]] = {"this": [], "baseline": []}
            print("| pair | tree | wall s | CPU s | peak RSS MiB |\n|---|---|---|---|---|")
            for pair in range(args.pairs):
                trees = [("this", ROOT), ("baseline", baseline)]
                for name, tree in trees if pair % 2 == 0 else trees[::-1]:
                    run = run_in(tree, inputs, Path(tmp) / f"out-{name}-{pair}")
                    figures[name].append(run)
                    print(f"| {pair + 1} | {name} | {run[0]:.2f} | {run[1]:.2f} | {run[2]:.0f} |",
                          flush=True)
            for index, what in ((0, "wall"), (1, "CPU")):
                this = [run[index] for run in figures["this"]]
                base = [run[index] for run in figures["baseline"]]
                ratios = [a / b for a, b in zip(this, base)]
                print(f"{what}: median this {statistics.median(this):.2f} s, baseline "
                      f"{statistics.median(base):.2f} s; median paired ratio "
                      f"{statistics.median(ratios):.3f} (spread {min(ratios):.3f}-"
                      f"{max(ratios):.3f})")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)],
                           capture_output=True)


if __name__ == "__main__":
    main()
