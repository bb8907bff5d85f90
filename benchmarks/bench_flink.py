"""`kvtrace anonymize` on the local Flink cluster beside the local engine, same corpus, same
machine (issue 22): wall seconds and peak memory of the launching process, the cluster's JVMs'
peak resident memory, and whether the outputs are byte-identical.

    deploy/flink/local-cluster.sh start
    python benchmarks/bench_flink.py /tmp/short10k.jsonl --tokenizer ../shared/tokenizers/deepseek-r1
"""

from __future__ import annotations

import argparse
import filecmp
import statistics
import sys
import tempfile
from pathlib import Path

from measure import run_measured

ROOT = Path(__file__).resolve().parents[1]
JVMS = ("StandaloneSessionClusterEntrypoint", "TaskManagerRunner", "FlinkJobServerDriver")


def jvm_peaks_mib() -> dict[str, float]:
    """Each cluster JVM's peak resident memory so far (VmHWM), from /proc."""
    peaks = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            command = (status.parent / "cmdline").read_bytes().decode(errors="replace")
            text = status.read_text()
        except OSError:
            continue
        for name in JVMS:
            if name in command:
                kib = next(
                    int(line.split()[1]) for line in text.splitlines() if line.startswith("VmHWM")
                )
                peaks[name] = max(peaks.get(name, 0.0), kib / 1024)
    return peaks


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("corpus")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--block-size", default="16")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-flink-"))
    (work / "salt").write_text("a-benchmark-salt-long-enough-to-use")
    common = [
        sys.executable,
        "-m",
        "kvtrace.cli",
        "anonymize",
        "--input",
        args.corpus,
        "--tokenizer",
        args.tokenizer,
        "--block-size",
        args.block_size,
        "--salt-file",
        str(work / "salt"),
    ]
    engines = {"local": [], "flink": ["--config", str(ROOT / "configs" / "flink-local.yaml")]}
    for engine, extra in engines.items():
        figures = [
            run_measured([*common, "--output", str(work / engine), *extra])
            for _ in range(args.runs)
        ]
        print(
            f"{engine:6} wall median {statistics.median(s for s, _ in figures):6.1f} s, "
            f"launcher peak {max(p for _, p in figures):6.0f} MiB"
        )
    print("cluster JVM peaks (MiB):", {k: round(v) for k, v in jvm_peaks_mib().items()})
    names = [p.name for p in (work / "local").iterdir()]
    _, mismatch, errors = filecmp.cmpfiles(work / "local", work / "flink", names, shallow=False)
    print("outputs byte-identical:", not mismatch and not errors)


if __name__ == "__main__":
    main()
