"""Throughput of `kvtrace anonymize` against the tokenization floor (issue 2).

For one corpus, in input tokens per second of wall time:
  (a) floor: batched tokenization alone of everything the job tokenizes (rendered prompts and
      output texts) with the same tokenizer on both cores, the texts prepared beforehand;
      also reported for the prompts alone;
  (b) `kvtrace anonymize` end to end, as a whole process (startup included; the default
      engine unless flags say otherwise, e.g. --engine beam), with its peak memory;
  (c) a one-request-at-a-time loop: render, encode, chain-hash, number ids in a dict.

    python benchmarks/make_corpus.py long 3000 benchmarks/corpora/long.jsonl
    python benchmarks/bench_anonymize.py benchmarks/corpora/long.jsonl \\
        --tokenizer ../shared/tokenizers/deepseek-r1 --block-size 512 --block-size 16
    python benchmarks/bench_anonymize.py benchmarks/corpora/rendered.jsonl \\
        --tokenizer ../shared/tokenizers/deepseek-r1 --block-size 512 --skip-loop --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from measure import run_measured

# Batches as the pipeline makes them for tokenization (pipelines/anonymize_config.py TOKENIZE_BATCH_REQUESTS).
FLOOR_BATCH = 256


def prepare(corpus: Path, tokenizer_name: str) -> tuple[list[str], list[str]]:
    from kvtrace.transforms.encode.tokenize import load_tokenizer, render_chat
    from kvtrace.transforms.read.records import parse_record

    tokenizer = load_tokenizer(tokenizer_name)
    prompts, outputs = [], []
    with open(corpus, "rb") as f:
        for line in f:
            request = parse_record(line.rstrip(b"\n"), str(corpus))
            prompts.append(
                request.prompt
                if request.kind != "chat"
                else render_chat(tokenizer, request.messages, request.tools, {})
            )
            if request.output_text is not None:
                outputs.append(request.output_text)
    return prompts, outputs


def floor(tokenizer_name: str, texts: list[str], repeats: int = 3) -> tuple[float, int]:
    """(seconds, tokens) to batch-tokenize texts with the fast tokenizer on every core; the best
    of a few repeats, as the floor is the fastest the machine can do."""
    from kvtrace.transforms.encode.tokenize import encode_texts, load_tokenizer

    tokenizer = load_tokenizer(tokenizer_name)
    best = float("inf")
    for _ in range(repeats):
        start, tokens = time.perf_counter(), 0
        for i in range(0, len(texts), FLOOR_BATCH):
            tokens += sum(map(len, encode_texts(tokenizer, texts[i : i + FLOOR_BATCH])))
        best = min(best, time.perf_counter() - start)
    return best, tokens


def one_at_a_time(corpus: Path, tokenizer_name: str, block_size: int) -> tuple[float, int]:
    """The naive loop: each request rendered, encoded, hashed and numbered on its own."""
    from kvtrace.transforms.encode.blocks import DIGEST_SIZE, chain_hashes, chain_seed, token_bytes
    from kvtrace.transforms.encode.tokenize import load_tokenizer, render_chat
    from kvtrace.transforms.read.records import parse_record

    tokenizer = load_tokenizer(tokenizer_name)
    seed, ids, tokens = chain_seed(b"benchmark salt, 32 bytes long..."), {}, 0
    start = time.perf_counter()
    with open(corpus, "rb") as f:
        for line in f:
            request = parse_record(line.rstrip(b"\n"), str(corpus))
            text = render_chat(tokenizer, request.messages, request.tools, {})
            token_ids = tokenizer.encode(text, add_special_tokens=False)
            tokenizer.encode(request.output_text or "", add_special_tokens=False)
            blob = chain_hashes(token_bytes(token_ids), block_size, seed)
            for i in range(0, len(blob), DIGEST_SIZE):
                ids.setdefault(blob[i : i + DIGEST_SIZE], len(ids))
            tokens += len(token_ids)
    return time.perf_counter() - start, tokens


def end_to_end(corpus: Path, tokenizer_name: str, block_size: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "kvtrace.cli",
            "anonymize",
            "--input",
            str(corpus),
            "--output",
            f"{tmp}/out",
            "--tokenizer",
            tokenizer_name,
            "--block-size",
            str(block_size),
            *extra,
        ]
        seconds, peak_mib = run_measured(command)
        stats = json.loads(Path(tmp, "out", "stats.json").read_text())
    return {
        "seconds": seconds,
        "input_tokens": stats["input_tokens"],
        "blocks": stats["blocks"],
        "unique_blocks": stats["unique_blocks"],
        "peak_rss_mib": peak_mib,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--block-size", type=int, action="append", required=True)
    parser.add_argument("--skip-loop", action="store_true", help="skip (c), the slowest")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="(a) then (b), this many times each; the ratio of each pair, "
        "measured minutes apart, is robust to the machine's drift",
    )
    args, kvtrace_args = parser.parse_known_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    prompts, outputs = prepare(args.corpus, args.tokenizer)
    floor_prompts, input_tokens = floor(args.tokenizer, prompts)
    result = {
        "corpus": str(args.corpus),
        "corpus_mib": args.corpus.stat().st_size / 2**20,
        "requests": len(prompts),
        "input_tokens": input_tokens,
        "a_floor_prompts_only_tokens_per_s": input_tokens / floor_prompts,
        "runs": [],
    }
    for block_size in args.block_size:
        for _ in range(args.repeats):
            floor_all, _ = floor(args.tokenizer, prompts + outputs, repeats=1)
            run = end_to_end(args.corpus, args.tokenizer, block_size, kvtrace_args)
            run["block_size"] = block_size
            run["a_floor_tokens_per_s"] = input_tokens / floor_all
            run["b_tokens_per_s"] = run["input_tokens"] / run["seconds"]
            run["b_over_a"] = run["b_tokens_per_s"] / run["a_floor_tokens_per_s"]
            result["runs"].append(run)
        ratios = [r["b_over_a"] for r in result["runs"] if r["block_size"] == block_size]
        result[f"median_b_over_a_block_{block_size}"] = statistics.median(ratios)
        if not args.skip_loop:
            seconds, tokens = one_at_a_time(args.corpus, args.tokenizer, block_size)
            result[f"c_tokens_per_s_block_{block_size}"] = tokens / seconds
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
