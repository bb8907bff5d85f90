"""Block hashing cost per scheme, on the same token ids: what --hash-scheme adds to anonymize.

Random token ids below 128,000 (hashing cost does not depend on their values), 4M tokens in
2,048-token requests; one process, best of 3.

    python benchmarks/bench_hash_schemes.py
"""

from __future__ import annotations

import time

from kvtrace.transforms.encode.blocks import chain_seed, token_bytes
from kvtrace.transforms.encode.schemes import HashScheme, vllm_none_hash

TOKENS = 4_000_000
REQUEST_TOKENS = 2048


def main() -> None:
    import random

    rng = random.Random(0)
    requests = [
        token_bytes([rng.randrange(128_000) for _ in range(REQUEST_TOKENS)])
        for _ in range(TOKENS // REQUEST_TOKENS)
    ]
    seed = chain_seed(b"benchmark salt, 32 bytes long...")
    schemes = [
        HashScheme(),
        HashScheme("dynamo"),
        HashScheme("vllm-sha256-cbor", vllm_none_hash("0")),
    ]
    print(f"{TOKENS:,} tokens in {len(requests):,} requests; million tokens hashed per second\n")
    print("| block size | " + " | ".join(s.name for s in schemes) + " |")
    print("|---" * (len(schemes) + 1) + "|")
    for block_size in (16, 512):
        rates = []
        for scheme in schemes:
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                for data in requests:
                    scheme.block_keys(data, block_size, seed)
                best = min(best, time.perf_counter() - start)
            rates.append(TOKENS / best / 1e6)
        print(f"| {block_size} | " + " | ".join(f"{r:.1f}" for r in rates) + " |")


if __name__ == "__main__":
    main()
