"""`kvtrace anonymize` with each tokenizer backend, paired, against the floors (issue 36).

For each corpus:
  tokenize only: the rendered prompts and output texts (prepared beforehand, untimed) in
      batches of 256 through `tokenizers`' encode_batch_fast (the floor, both cores), through
      raw fastokens, and through the verified backend as a run calls it (its 1-in-64 check
      included); whether every text's ids agree;
  parse only: orjson over every line, the next floor once tokenizing is cheap;
  stages: CPU seconds of read, parse, render, tokenize, hash and numbering, each alone over
      the corpus in this process, with each backend (the step that bounds the run);
  whole process: `kvtrace anonymize --tokenizer-backend B` for B in tokenizers and fastokens,
      alternated pair by pair (the order swapped each pair), start-up included, with the peak
      RSS of the process and its workers; the output's bytes compared across backends.

    python benchmarks/make_corpus.py agent 800 benchmarks/corpora/agent.jsonl
    python benchmarks/bench_tokenizer_backends.py benchmarks/corpora/agent.jsonl \\
        --tokenizer ../shared/tokenizers/qwen3 --pairs 3
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_anonymize import FLOOR_BATCH
from measure import ROOT, run_measured

BACKENDS = ("tokenizers", "fastokens")


def prepare(corpus: Path, tokenizer_name: str) -> list[str]:
    """What a run tokenizes: each record's rendered prompt and output text (records kvtrace
    dead-letters left out)."""
    from kvtrace.transforms.encode.tokenize import load_tokenizer, render_chat
    from kvtrace.transforms.errors import Rejected
    from kvtrace.transforms.read.records import parse_record

    tokenizer = load_tokenizer(tokenizer_name)
    texts = []
    for line in corpus.read_bytes().splitlines():
        try:
            request = parse_record(line, str(corpus))
            if request.kind == "chat":
                texts.append(render_chat(tokenizer, request.messages, request.tools, {}))
            elif request.prompt is not None:
                texts.append(request.prompt)
        except Rejected:
            continue
        if request.output_text is not None:
            texts.append(request.output_text)
    return texts


def tokenize_rates(tokenizer_name: str, texts: list[str], repeats: int = 3) -> dict:
    """Tokens per second of each way to tokenize texts (best of repeats), and whether the fast
    ids equal the reference's text for text."""
    from kvtrace.transforms.encode.tokenize import encode_texts, encoding_tokenizer, load_tokenizer

    reference = load_tokenizer(tokenizer_name)
    verified = encoding_tokenizer(tokenizer_name, "fastokens")
    raw = verified.backend_tokenizer._fast

    def reference_batch(batch: list[str]) -> int:
        return sum(map(len, encode_texts(reference, batch)))

    def verified_batch(batch: list[str]) -> int:
        return sum(map(len, encode_texts(verified, batch)))

    def raw_batch(batch: list[str]) -> int:
        return len(raw.encode_batch_flat(batch)[0]) // 4

    rates = {}
    for name, encode in (
        ("tokenizers_encode_batch_fast", reference_batch),
        ("fastokens_raw", raw_batch),
        ("fastokens_verified", verified_batch),
    ):
        best, tokens = float("inf"), 0
        for _ in range(repeats):
            start = time.perf_counter()
            tokens = sum(
                encode(texts[i : i + FLOOR_BATCH]) for i in range(0, len(texts), FLOOR_BATCH)
            )
            best = min(best, time.perf_counter() - start)
        rates[name] = {"seconds": best, "tokens": tokens, "tokens_per_s": tokens / best}
    equal = all(
        encode_texts(reference, texts[i : i + FLOOR_BATCH])
        == [
            e.ids.tolist()
            for e in verified.backend_tokenizer._fast_batch(texts[i : i + FLOOR_BATCH])
        ]
        for i in range(0, len(texts), FLOOR_BATCH)
    )
    rates["ids_equal"] = equal
    return rates


def stage_seconds(corpus: Path, tokenizer_name: str, block_size: int, backend: str) -> dict:
    """CPU seconds of each step of encoding and numbering, run alone over the whole corpus in
    this process (as profile_stages.py times them), with the backend given: which step bounds
    the run once tokenizing is cheap."""
    from profile_stages import STAGES, stage

    from kvtrace.transforms.batching import batches_by_weight
    from kvtrace.transforms.dead_letters import DeadLetter
    from kvtrace.transforms.encode.encode_requests import (
        TOKENIZE_BATCH_BYTES,
        TOKENIZE_BATCH_REQUESTS,
        EncodeOptions,
        open_encoder,
    )
    from kvtrace.transforms.encode.hashed_batch import HashedBatch
    from kvtrace.transforms.encode.salt import SaltSource
    from kvtrace.transforms.ids.dense_ids import block_keys, dense_ids, session_keys
    from kvtrace.transforms.read.records import ParseOptions
    from kvtrace.transforms.read.sources import file_ranges, parse_one, read_range

    STAGES.clear()
    salt = SaltSource("random", inline=b"profile salt, 32 bytes long.....")
    options = EncodeOptions(tokenizer_name, salt, block_size=block_size, tokenizer_backend=backend)
    encoder = open_encoder(options)
    with stage("read"):
        records = [
            item
            for piece in file_ranges(str(corpus), corpus.stat().st_size)
            for item in read_range(piece, 64 << 20)
        ]
    with stage("parse"):
        parsed = [parse_one(*record, ParseOptions()) for record in records]
    requests = [r for r in parsed if not isinstance(r, DeadLetter)]
    batches = list(
        batches_by_weight(
            requests, TOKENIZE_BATCH_BYTES, lambda r: len(r.line), TOKENIZE_BATCH_REQUESTS
        )
    )
    with stage("render"):
        rendered = [encoder.render(batch)[0] for batch in batches]
    with stage("tokenize"):
        tokenized = [encoder.tokenize(batch) for batch in rendered]
    with stage("hash"):
        hashed = [encoder.hash(r, t)[0] for r, t in zip(rendered, tokenized)]
    with stage("ids"):
        whole = HashedBatch.concat(hashed)
        dense_ids(block_keys(whole, block_size)), dense_ids(session_keys(whole))
    return {s["stage"]: round(s["cpu_s"], 2) for s in STAGES}


def parse_only(corpus: Path) -> float:
    """Seconds to parse every line with orjson (the file read beforehand, untimed; a line
    that is not JSON counted as parsed)."""
    import orjson

    lines = corpus.read_bytes().splitlines()
    start = time.perf_counter()
    for line in lines:
        try:
            orjson.loads(line)
        except orjson.JSONDecodeError:  # a log's broken line costs its parse all the same
            pass
    return time.perf_counter() - start


def anonymize(corpus: Path, tokenizer: str, block_size: int, backend: str, out: Path) -> dict:
    command = [
        sys.executable,
        "-m",
        "kvtrace.cli",
        "anonymize",
        "--input",
        str(corpus),
        "--output",
        str(out),
        "--tokenizer",
        tokenizer,
        "--block-size",
        str(block_size),
        "--tokenizer-backend",
        backend,
        "--quiet",
    ]
    seconds, peak = run_measured(command)
    stats = json.loads((out / "stats.json").read_text())
    return {"seconds": seconds, "peak_rss_mib": peak, "input_tokens": stats["input_tokens"]}


def same_bytes(left: Path, right: Path) -> bool:
    names = sorted(p.name for p in left.iterdir())
    _, mismatch, errors = filecmp.cmpfiles(left, right, names, shallow=False)
    return names == sorted(p.name for p in right.iterdir()) and not mismatch and not errors


def whole_runs(corpus: Path, tokenizer: str, block_size: int, pairs: int) -> dict:
    runs: dict[str, list[dict]] = {backend: [] for backend in BACKENDS}
    identical = True
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(pairs):
            order = BACKENDS if pair % 2 == 0 else BACKENDS[::-1]
            outs = {}
            for backend in order:
                outs[backend] = Path(tmp, f"{backend}-{pair}")
                runs[backend].append(
                    anonymize(corpus, tokenizer, block_size, backend, outs[backend])
                )
            identical &= same_bytes(*outs.values())
    ratios = [
        slow["seconds"] / fast["seconds"]
        for slow, fast in zip(runs["tokenizers"], runs["fastokens"])
    ]
    return {
        backend: {
            "median_s": statistics.median(r["seconds"] for r in results),
            "seconds": [round(r["seconds"], 2) for r in results],
            "peak_rss_mib": max(r["peak_rss_mib"] for r in results),
            "input_tokens": results[0]["input_tokens"],
        }
        for backend, results in runs.items()
    } | {
        "paired_speedup": ratios,
        "median_paired_speedup": statistics.median(ratios),
        "identical_output": identical,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("corpus", type=Path, nargs="+")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--block-size", type=int, default=512)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # this checkout's kvtrace, here and in the runs (not another installed copy)
    sys.path.insert(0, str(ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    # one salt for every run, so that the backends' outputs can be compared byte for byte
    os.environ.setdefault("KVTRACE_SALT", "a benchmark salt, 32 bytes long..")
    for corpus in args.corpus:
        rates = tokenize_rates(args.tokenizer, prepare(corpus, args.tokenizer))
        runs = whole_runs(corpus, args.tokenizer, args.block_size, args.pairs)
        floor = rates["tokenizers_encode_batch_fast"]
        result = {
            "corpus": str(corpus),
            "tokenizer": args.tokenizer,
            "block_size": args.block_size,
            "bytes": corpus.stat().st_size,
            "tokenize_only": rates,
            "parse_only_orjson_s": parse_only(corpus),
            "stage_cpu_s": {
                backend: stage_seconds(corpus, args.tokenizer, args.block_size, backend)
                for backend in BACKENDS
            },
            "whole_process": runs,
            # the whole run with each backend against the floor: the floor's time for the same
            # texts over the run's wall time (1.0: the run as fast as tokenizing alone)
            "times_floor": {
                backend: floor["seconds"] / runs[backend]["median_s"] for backend in BACKENDS
            },
        }
        print(json.dumps(result, indent=2), flush=True)


if __name__ == "__main__":
    main()
