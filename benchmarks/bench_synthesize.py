"""kvtrace synthesize against aiperf's synthesizer on the same trace and knobs: wall time, peak
memory, and whether the output is a valid trace (kvtrace analyze finds no problem in it).

aiperf 0.13 runs in its own venv (the one `.ci/run` builds for the replay tests, or a new one);
its Synthesizer is driven through its Python API, as `aiperf profile` calls it. It refuses the
FAST'25 traces, whose exact repeats share a partial last block, so the comparison runs again
on the same trace without those rows. Dynamo's `datagen synthesize` is not on PyPI and could
not be installed here (its package needs modules absent from the sources we can reach).

    python benchmarks/make_replicated_trace.py ../shared/traces/synthetic_trace.jsonl 60 \\
        benchmarks/corpora/synthetic_x60.jsonl           # 240k rows
    python benchmarks/bench_synthesize.py benchmarks/corpora/synthetic_x60.jsonl
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from measure import run_measured, tool_python

KNOBS = {
    "speedup_ratio": 2.0,
    "prefix_len_multiplier": 1.5,
    "prefix_root_multiplier": 2,
    "prompt_len_multiplier": 1.0,
}
AIPERF_DRIVER = """
import sys, orjson
from aiperf.common import random_generator
from aiperf.dataset.synthesis.models import SynthesisParams
from aiperf.dataset.synthesis.synthesizer import Synthesizer
random_generator.init(1)
params = SynthesisParams(speedup_ratio={speedup_ratio}, prefix_len_multiplier={prefix_len_multiplier},
                         prefix_root_multiplier={prefix_root_multiplier},
                         prompt_len_multiplier={prompt_len_multiplier}, block_size=512)
rows = Synthesizer(params).synthesize_from_file(sys.argv[1])
with open(sys.argv[2], "wb") as out:
    out.writelines(orjson.dumps(r) + b"\\n" for r in rows)
"""


def problems(trace: Path) -> str:
    from kvtrace.transforms.read.trace_io import read_trace
    from kvtrace.transforms.stats.trace_stats import analyze

    found = {
        name: p["count"]
        for name, p in analyze(read_trace([str(trace)]), 512)["problems"].items()
        if p["count"]
    }
    return "valid" if not found else ", ".join(f"{n}: {c:,}" for n, c in found.items())


def without_shared_partial_blocks(trace: str, target: Path) -> int:
    """The trace without the rows that end in a partial block shared with another row (what
    aiperf cannot take); returns the rows kept."""
    import json

    from kvtrace.transforms.read.trace_io import read_trace
    from kvtrace.transforms.synth.parts import RowParts

    source = read_trace([trace])
    parts = RowParts.of(source, 512)
    drop = (parts.shared == source.lengths) & (parts.last_tokens < 512) & (source.lengths > 0)
    kept = 0
    with open(trace) as lines, open(target, "w") as out:
        for line, dropped in zip((text for text in lines if text.strip()), drop.tolist()):
            if not dropped:
                out.write(json.dumps(json.loads(line)) + "\n")
                kept += 1
    return kept


def compare(trace: str, work: Path, beam: bool) -> None:
    ours = work / "kvtrace.jsonl"
    command = [
        "kvtrace",
        "synthesize",
        trace,
        "-o",
        str(ours),
        "--block-size",
        "512",
        *[f"--{k.replace('_', '-')}={v}" for k, v in KNOBS.items()],
    ]
    seconds, peak = run_measured(command)
    print(f"| kvtrace synthesize | {seconds:.1f} | {peak:.0f} | {problems(ours)} |")
    if beam:  # the embedded runner, one worker; the bytes must be the local engine's
        on_beam = work / "kvtrace_beam.jsonl"
        seconds, peak = run_measured([*command[:4], str(on_beam), *command[5:], "--engine", "beam"])
        same = on_beam.read_bytes() == ours.read_bytes()
        print(
            f"| kvtrace synthesize --engine beam (embedded runner) | {seconds:.1f} | {peak:.0f} | "
            f"{'the same bytes' if same else 'DIFFERENT BYTES'} |"
        )
    theirs = work / "aiperf.jsonl"
    driver = work / "aiperf_driver.py"
    driver.write_text(AIPERF_DRIVER.format(**KNOBS))
    command = [tool_python("aiperf", "aiperf==0.13.0"), str(driver), trace, str(theirs)]
    tried = subprocess.run(command, capture_output=True, text=True)
    if tried.returncode:
        print(
            f"| aiperf 0.13 Synthesizer | crashed | - | {tried.stderr.strip().splitlines()[-1][:150]} |"
        )
        return
    seconds, peak = run_measured(command)
    print(f"| aiperf 0.13 Synthesizer | {seconds:.1f} | {peak:.0f} | {problems(theirs)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    args = parser.parse_args()
    print("knobs: " + ", ".join(f"{k} {v}" for k, v in KNOBS.items()))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"\n{args.trace}\n\n| tool | wall s | peak RSS MiB | output |\n|---|---|---|---|")
        compare(args.trace, work, beam=True)
        filtered = work / "without_shared_partials.jsonl"
        kept = without_shared_partial_blocks(args.trace, filtered)
        print(
            f"\nthe same without rows ending in a shared partial block ({kept:,} rows)\n\n"
            f"| tool | wall s | peak RSS MiB | output |\n|---|---|---|---|"
        )
        compare(str(filtered), work, beam=False)


if __name__ == "__main__":
    main()
