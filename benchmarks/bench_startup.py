"""Start-up of `kvtrace anonymize` against loading the tokenizer file alone (issue 10, item 1).

Median wall seconds of whole processes, each run several times:
  tokenizer file: `tokenizers.Tokenizer.from_file(tokenizer.json)`, nothing else;
  prompt job / chat job: a one-record anonymize on the default (local) engine;
  chat job, Beam engine: the same on the in-process Beam runner, for reference.

--python runs everything under another interpreter, e.g. a venv where torch is installed (where
transformers' AutoTokenizer chain imports it):

    python benchmarks/bench_startup.py --tokenizer ../shared/tokenizers/deepseek-r1
    python benchmarks/bench_startup.py --tokenizer ../shared/tokenizers/deepseek-r1 \\
        --python /tmp/torch-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = {"timestamp": 0, "prompt": "Hello, world.", "output": "Hi."}
CHAT = {"timestamp": 0, "messages": [{"role": "user", "content": "Hello, world."}], "output": "Hi."}


def seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokenizer", required=True, help="a local tokenizer folder")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tokenizer_file = str(Path(args.tokenizer, "tokenizer.json"))
    with tempfile.TemporaryDirectory() as tmp:
        for name, record in (("prompt", PROMPT), ("chat", CHAT)):
            Path(tmp, f"{name}.jsonl").write_text(json.dumps(record) + "\n")
        Path(tmp, "salt").write_text("a benchmark salt, long enough")

        def job(name: str, *extra: str) -> list[str]:
            return [
                args.python,
                "-m",
                "kvtrace.cli",
                "anonymize",
                "--input",
                f"{tmp}/{name}.jsonl",
                "--output",
                f"{tmp}/out-{name}",
                "--tokenizer",
                args.tokenizer,
                "--salt-file",
                f"{tmp}/salt",
                *extra,
            ]

        commands = {
            "tokenizer_file": [
                args.python,
                "-c",
                "import tokenizers, sys; tokenizers.Tokenizer.from_file(sys.argv[1])",
                tokenizer_file,
            ],
            "prompt_job": job("prompt"),
            "chat_job": job("chat"),
            "chat_job_beam_engine": job("chat", "--engine", "beam"),
        }
        runs = {
            name: [seconds(command) for _ in range(args.repeats)]
            for name, command in commands.items()
        }
    medians = {name: statistics.median(times) for name, times in runs.items()}
    base = medians["tokenizer_file"]
    print(
        json.dumps(
            {
                "python": args.python,
                "median_s": medians,
                "over_tokenizer_file_s": {
                    n: m - base for n, m in medians.items() if n != "tokenizer_file"
                },
                "runs_s": runs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
