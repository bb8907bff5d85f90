"""What joining OpenAI Batch files costs (issue 35): `kvtrace anonymize` on a batch's input file
and output file (the output in reverse order, as a batch finishes requests out of order)
against the same requests joined beforehand into one file: CPU seconds, wall seconds, peak
memory of the process and its workers, and whether the outputs are byte-identical.

    python benchmarks/bench_batch_join.py 80000 --tokenizer TOKENIZER --block-size 16

Each request is a ~2 KB completions prompt (seeded), so the run is mostly reading and joining.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import random
import sys
import tempfile
from pathlib import Path

from measure import run_measured_cpu

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the quick brown fox jumps over the lazy dog again".split()
START_S = 1_763_703_600


def write_batch(pairs: int, folder: Path) -> tuple[list[Path], Path]:
    """([input file, output file], the joined file) of `pairs` requests."""
    rng = random.Random(0)
    paths = [folder / name for name in ("input.jsonl", "output.jsonl", "joined.jsonl")]
    answers = []
    with open(paths[0], "w") as requests, open(paths[2], "w") as joined:
        for k in range(pairs):
            body = {"model": "m", "prompt": " ".join(rng.choice(WORDS) for _ in range(400))}
            request = {"custom_id": f"request-{k}", "url": "/v1/completions", "body": body}
            usage = {"completion_tokens": 10 + k % 50}
            result = {"created": START_S + k // 100, "choices": [], "usage": usage}
            answer = {"id": f"b{k}", "custom_id": f"request-{k}", "error": None}
            answer["response"] = {"status_code": 200, "body": result}
            requests.write(json.dumps(request) + "\n")
            joined.write(json.dumps({**request, **answer}) + "\n")  # the join, beforehand
            answers.append(answer)
    with open(paths[1], "w") as output:
        output.writelines(json.dumps(answer) + "\n" for answer in reversed(answers))
    return paths[:2], paths[2]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("pairs", type=int)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files, joined = write_batch(args.pairs, folder)
        size = sum(path.stat().st_size for path in files) / 1e6
        print(f"{args.pairs} pairs, {size:.1f} MB of Batch files")
        outputs = {}
        for name, inputs in (("joined beforehand", [joined]), ("input + output", files)):
            out = folder / name.replace(" ", "-")
            command = [sys.executable, "-m", "kvtrace.cli", "anonymize", "--quiet"]
            command += [arg for path in inputs for arg in ("--input", str(path))]
            command += ["--output", str(out), "--tokenizer", args.tokenizer]
            command += ["--block-size", str(args.block_size), "--processes", str(args.processes)]
            wall, cpu, peak = run_measured_cpu(command, ROOT, None)
            print(f"{name:>18}: {cpu:6.1f} CPU-s, {wall:6.1f} s, peak {peak:7.1f} MiB")
            outputs[name] = out
        left, right = outputs.values()
        names = sorted(path.name for path in left.iterdir())
        same = filecmp.cmpfiles(left, right, names, shallow=False)[0] == names
        print("outputs byte-identical" if same else "OUTPUTS DIFFER")


if __name__ == "__main__":
    main()
