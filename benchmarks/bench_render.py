"""`kvtrace render` wall time and peak memory as the trace grows: memory should stay flat (rows
are rendered, written and verified in batches), time grow with the rows.

    python benchmarks/bench_render.py ../shared/traces/synthetic_trace.jsonl \\
        --tokenizer ../shared/tokenizers/deepseek-r1 --rows 500,2000,3993 --shape prompt

With --chat-template, the chat template's rendering alone instead: the CPU seconds to render
the first --rows chat records of a request log in this process (best of 7), as anonymize
renders them (the watchdog and the bounded sandbox included), and a digest of the texts, which
must not change. Run it from each tree to compare (PYTHONPATH=TREE):

    python benchmarks/bench_render.py benchmarks/corpora/agent.jsonl --chat-template \\
        --tokenizer ../shared/tokenizers/qwen3 --rows 600
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

from measure import run_measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--rows", default="500,2000,3993")
    parser.add_argument("--shape", default="prompt", choices=("prompt", "chat"))
    parser.add_argument("--block-size", default="512")
    parser.add_argument(
        "--chat-template",
        action="store_true",
        help="time the chat template's rendering of a request log alone",
    )
    args = parser.parse_args()
    if args.chat_template:
        chat_template(args.trace, args.tokenizer, int(args.rows.split(",")[0]))
        return
    lines = args.trace.read_bytes().splitlines(keepends=True)
    print("| rows | wall s | peak RSS MiB |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for rows in [int(r) for r in args.rows.split(",")]:
            part = Path(tmp) / f"head{rows}.jsonl"
            part.write_bytes(b"".join(lines[:rows]))
            seconds, peak = run_measured(
                [
                    sys.executable,
                    "-m",
                    "kvtrace.cli",
                    "render",
                    str(part),
                    "--tokenizer",
                    args.tokenizer,
                    "-o",
                    str(Path(tmp) / "out.jsonl"),
                    "--shape",
                    args.shape,
                    "--block-size",
                    args.block_size,
                ]
            )
            print(f"| {rows:,} | {seconds:.1f} | {peak:.0f} |", flush=True)


def chat_template(log: Path, tokenizer_name: str, rows: int, repeats: int = 7) -> None:
    from kvtrace.transforms.encode.tokenize import load_tokenizer, render_chat
    from kvtrace.transforms.read.records import parse_record

    tokenizer = load_tokenizer(tokenizer_name)
    with open(log, "rb") as lines:
        requests = [
            parse_record(line.rstrip(b"\n"), str(log)) for _, line in zip(range(rows), lines)
        ]
    best, texts = float("inf"), []
    for _ in range(repeats):
        start = time.process_time()
        texts = [render_chat(tokenizer, r.messages, r.tools, {}) for r in requests]
        best = min(best, time.process_time() - start)
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]
    print(f"{len(requests)} renders: {best:.3f} s CPU (best of {repeats}), texts {digest}")


if __name__ == "__main__":
    main()
