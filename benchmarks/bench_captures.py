"""Capture ingestion (anonymize --capture) against text anonymization's parse step, per request.

    python benchmarks/make_corpus.py agent 400 benchmarks/corpora/agent.jsonl
    python benchmarks/bench_captures.py benchmarks/corpora/agent.jsonl \\
        --tokenizer ../shared/tokenizers/qwen3 --block-size 16 --block-size 512

The corpus's requests are rendered and tokenized by kvtrace once, untimed, and written again as
the two captures of the same requests: Dynamo's request trace (every block's hash) and LMCache's
lookup hash log (full chunks, hex). Then, in this process, alternated round by round so the
machine's drift hits all alike, CPU time per request of:
- text: the parse step of the text path (`read/sources.parse_one`: JSON, shape checks, chat
  normalization) on the corpus's own lines: what precedes rendering and tokenizing;
- each capture: its ingestion whole, `parse_one` and the re-keying into a HashedRequest
  (`encode/captures.hash_capture`): all a capture costs before the night's numbering.
Prints the median of the rounds and their spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kvtrace.transforms.encode.blocks import chain_seed, token_bytes
from kvtrace.transforms.encode.captures import hash_capture
from kvtrace.transforms.encode.encode_requests import EncodeOptions, open_encoder
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.schemes import dynamo_sequence_hashes
from kvtrace.transforms.read.records import ParseOptions, Request
from kvtrace.transforms.read.sources import parse_one

SEED = chain_seed(b"benchmark salt, sixteen bytes or more")


def token_ids(lines: list[bytes], tokenizer: str) -> list[list[int]]:
    encoder = open_encoder(EncodeOptions(tokenizer, SaltSource("random", inline=b"b" * 32)))
    requests = [parse_one("corpus", line, ParseOptions()) for line in lines]
    rendered, failed = encoder.render([r for r in requests if isinstance(r, Request)])
    assert not failed
    prompts = encoder.tokenize(rendered)[0]
    return [np.frombuffer(p, "<u4").tolist() for p in prompts]


def dynamo_line(i: int, ids: list[int], block_size: int) -> bytes:
    replay = {
        "trace_block_size": block_size,
        "input_length": len(ids),
        "input_sequence_hashes": dynamo_sequence_hashes(token_bytes(ids), block_size),
    }
    request = {"request_id": f"r{i}", "output_tokens": 100, "request_received_ms": 1_000 * i}
    record = {
        "schema": "dynamo.request.trace.v1",
        "event_type": "request_end",
        "event_time_unix_ms": 1_000 * i + 50,
        "request": request | {"replay": replay},
    }
    return json.dumps(record).encode()


def lmcache_line(i: int, ids: list[int], block_size: int) -> bytes:
    # A 32-byte hash per full chunk, as LMCache's default (blake3) is written: the values only
    # need the writer's width here, not its function.
    full = len(ids) // block_size
    hashes = [f"0x{(i * 7919 + k) * 0x9E3779B97F4A7C15 % (1 << 256):064x}" for k in range(full)]
    record = {
        "timestamp": 1_700_000_000 + i,
        "request_id": f"r{i}",
        "model_name": "m",
        "chunk_size": block_size,
        "seq_len": len(ids),
        "dtypes": ["torch.bfloat16"],
        "shapes": [[2, 36, block_size, 1024]],
        "chunk_hashes": hashes,
    }
    return json.dumps(record).encode()


def text_parse(lines: list[bytes]) -> Callable[[], None]:
    options = ParseOptions()
    return lambda: [parse_one("corpus", line, options) for line in lines]


def capture_ingest(lines: list[bytes], capture: str) -> Callable[[], None]:
    options = ParseOptions(capture=capture)
    return lambda: [hash_capture(parse_one("capture", line, options), SEED) for line in lines]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--block-size", type=int, action="append", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    lines = [line for line in args.corpus.read_bytes().splitlines() if line.strip()]
    ids = token_ids(lines, args.tokenizer)
    tokens = sum(map(len, ids))
    print(
        f"{len(lines)} requests, {tokens / len(lines):,.0f} tokens and "
        f"{sum(map(len, lines)) / len(lines):,.0f} bytes each on average"
    )
    for block_size in args.block_size:
        runs = {
            "text parse step": text_parse(lines),
            "dynamo-request-trace": capture_ingest(
                [dynamo_line(i, r, block_size) for i, r in enumerate(ids)], "dynamo-request-trace"
            ),
            "lmcache-lookup-hashes": capture_ingest(
                [lmcache_line(i, r, block_size) for i, r in enumerate(ids)], "lmcache-lookup-hashes"
            ),
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                started = time.process_time()
                run()
                times[name].append((time.process_time() - started) / len(lines) * 1e6)
        text = statistics.median(times["text parse step"])
        print(
            f"block size {block_size}: CPU us per request, median of {args.rounds} rounds (min-max)"
        )
        for name, values in times.items():
            median = statistics.median(values)
            print(
                f"  {name:22s} {median:9.1f}  ({min(values):.1f}-{max(values):.1f})  "
                f"{text / median:5.2f}x the text parse step's speed"
            )


if __name__ == "__main__":
    main()
