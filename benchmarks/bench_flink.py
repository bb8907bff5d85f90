"""`kvtrace anonymize` on the local Flink cluster beside the local engine, same corpora, same
machine (issues 22, 36): CPU seconds (user + system) of every process a run uses (the launcher
and its workers; on Flink also the JobManager, TaskManager and job server, read from /proc
before and after), wall seconds, and whether the outputs are byte-identical.

Two corpus sizes give the fixed cost per job and the cost per record apart: per-record CPU is
(large - small) / (records added), start-up and submission cancel out. Runs alternate engines
(paired), so load from other processes falls on both alike; the spread over runs says how noisy.

    deploy/flink/local-cluster.sh start
    python benchmarks/make_corpus.py agent 800 /tmp/agent800.jsonl
    python benchmarks/make_corpus.py agent 1600 /tmp/agent1600.jsonl
    python benchmarks/bench_flink.py /tmp/agent800.jsonl /tmp/agent1600.jsonl \\
        --tokenizer ../shared/tokenizers/qwen3
"""

from __future__ import annotations

import argparse
import filecmp
import os
import statistics
import sys
import tempfile
from pathlib import Path

from measure import run_measured_cpu

ROOT = Path(__file__).resolve().parents[1]
JVMS = ("StandaloneSessionClusterEntrypoint", "TaskManagerRunner", "FlinkJobServerDriver")
# Flink runs submit with Beam's SDK at the job server's release (deploy/flink/versions.env).
FLINK_PYTHON = [str(ROOT / "deploy" / "flink" / "local-cluster.sh"), "python"]


def jvm_cpu_seconds() -> float:
    """CPU seconds the cluster's JVMs have used so far."""
    return sum(jvm_cpu_by_name().values())


def jvm_cpu_by_name() -> dict[str, float]:
    """CPU seconds each cluster JVM has used so far (utime + stime, /proc/PID/stat)."""
    ticks = os.sysconf("SC_CLK_TCK")
    used = dict.fromkeys(JVMS, 0.0)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            command = (stat.parent / "cmdline").read_bytes().decode(errors="replace")
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        for name in JVMS:
            if name in command:
                used[name] += (int(fields[11]) + int(fields[12])) / ticks
    return used


def count_lines(path: str) -> int:
    with open(path, "rb") as handle:
        return sum(1 for _ in handle)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("small")
    parser.add_argument("large")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--block-size", default="16")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--flink-config",
        action="append",
        help="a preset for Flink runs, one engine each (default configs/flink-local.yaml)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-flink-"))
    (work / "salt").write_text("a-benchmark-salt-long-enough-to-use")
    env = {k: v for k, v in os.environ.items() if k != "KVTRACE_SALT"}
    engines = {
        "local": [sys.executable, "-m", "kvtrace.cli", "anonymize"],
        **{
            f"flink-{Path(config).stem}": [
                *(*FLINK_PYTHON, "-m", "kvtrace.cli", "anonymize", "--config"),
                str(Path(config).resolve()),
            ]
            for config in args.flink_config or [str(ROOT / "configs" / "flink-local.yaml")]
        },
    }
    cpu: dict[tuple[str, str], list[float]] = {}
    wall: dict[tuple[str, str], list[float]] = {}
    for run in range(args.runs):
        for size in ("small", "large"):
            for engine, command in engines.items():
                out = work / f"{engine}-{size}-{run}"
                before = jvm_cpu_seconds()
                seconds, launcher, _ = run_measured_cpu(
                    [
                        *command,
                        *("--input", getattr(args, size), "--output", str(out)),
                        *("--tokenizer", args.tokenizer, "--block-size", args.block_size),
                        *("--salt-file", str(work / "salt")),
                    ],
                    ROOT,
                    env,
                )
                total = launcher + jvm_cpu_seconds() - before
                cpu.setdefault((engine, size), []).append(total)
                wall.setdefault((engine, size), []).append(seconds)
                print(f"run {run} {size:5} {engine:20} cpu {total:7.1f} s  wall {seconds:6.1f} s")
    added = count_lines(args.large) - count_lines(args.small)
    per_record = {}
    for engine in engines:
        pairs = [
            (large - small) / added
            for small, large in zip(cpu[engine, "small"], cpu[engine, "large"], strict=True)
        ]
        per_record[engine] = statistics.median(pairs)
        fixed = statistics.median(cpu[engine, "small"]) - per_record[engine] * count_lines(
            args.small
        )
        print(
            f"{engine:20} per record {per_record[engine] * 1e3:6.1f} ms CPU "
            f"(runs {', '.join(f'{p * 1e3:.1f}' for p in pairs)}), fixed {fixed:5.1f} s CPU, "
            f"wall small/large median {statistics.median(wall[engine, 'small']):.1f}/"
            f"{statistics.median(wall[engine, 'large']):.1f} s"
        )
    local = work / "local-large-0"
    names = [p.name for p in local.iterdir()]
    for engine in engines:
        if engine != "local":
            _, mismatch, errors = filecmp.cmpfiles(
                local, work / f"{engine}-large-0", names, shallow=False
            )
            print(
                f"{engine}: per-record CPU throughput / the local engine's "
                f"{per_record['local'] / per_record[engine]:.2f}, "
                f"outputs byte-identical: {not mismatch and not errors}"
            )


if __name__ == "__main__":
    main()
