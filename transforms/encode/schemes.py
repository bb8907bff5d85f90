"""Block hash schemes: which hash keys a block before its dense id is given.

- kvtrace (default): keyed xxh3-128, chained from a seed derived from the salt (blocks.py).
  Without the salt nobody can recompute a block's hash from a guessed prompt.
- dynamo: NVIDIA Dynamo's KV-router hashes. A block's local hash is XXH3-64 (seed 1337) over
  its token ids as little-endian u32; the first sequence hash is the first local hash, each
  next one XXH3-64 (seed 1337) over the previous sequence hash and the local hash as two
  little-endian u64.
- vllm-sha256-cbor: vLLM's prefix-cache block hash with `--prefix-caching-hash-algo
  sha256_cbor`: sha256 of the canonical CBOR of (parent hash or NONE_HASH, the block's token
  ids, extra keys = None for plain text requests). NONE_HASH is what the engine drew at
  start-up: sha256_cbor(PYTHONHASHSEED) when that is set, else random (then no match is
  possible), so it is given explicitly.
The engines hash full blocks only; the Mooncake trace's partial last block is hashed by the
same function over its tokens. Dense ids do not depend on the scheme (ids are numbered by first
occurrence), but the engine schemes are unkeyed: whoever holds the tokenizer can hash a guessed
prompt and confirm it, so their raw hashes never go into the published trace.

Whatever the scheme, a block's key for numbering is 16 bytes (hi, lo as little-endian u64). For
the engine schemes the key keeps the engine's 64-bit form in hi, so emitted hashes are read
back from the keys: dynamo's sequence hash, and for vLLM the int its KV events publish with
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (the digest's last 8 bytes, big-endian).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import cbor2
import numpy as np
import xxhash

from kvtrace.transforms.encode.blocks import HASH_SCHEME, TOKEN_DTYPE, chain_hashes

SCHEMES = ("kvtrace", "dynamo", "vllm-sha256-cbor")
DYNAMO_SEED = 1337
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class HashScheme:
    name: str = "kvtrace"
    none_hash: bytes | None = None  # vllm-sha256-cbor only: the engine's NONE_HASH (32 bytes)

    def __post_init__(self) -> None:
        if self.name not in SCHEMES:
            raise ValueError(f"unknown hash scheme {self.name!r}: one of {', '.join(SCHEMES)}")
        if (self.name == "vllm-sha256-cbor") != (self.none_hash is not None):
            raise ValueError(
                "vllm-sha256-cbor needs the engine's NONE_HASH (--vllm-none-hash "
                "or --vllm-hash-seed), and only it takes one"
            )

    @property
    def keyed(self) -> bool:
        return self.name == "kvtrace"

    @property
    def identity(self) -> str:
        """What an id map records: runs under another scheme (or NONE_HASH) get refused."""
        if self.name == "kvtrace":
            return HASH_SCHEME
        if self.name == "dynamo":
            return f"dynamo-xxh3-64-seed{DYNAMO_SEED}-v1"
        return f"vllm-sha256-cbor-v1:{hashlib.sha256(self.none_hash).hexdigest()[:16]}"

    def block_keys(self, data: bytes, block_size: int, seed: bytes) -> bytes:
        """16 bytes per block of one request's token bytes (u32 LE), in block order; seed is
        the salt's chain seed, used by the keyed scheme only."""
        if self.name == "kvtrace":
            return chain_hashes(data, block_size, seed)
        hashes = (
            dynamo_sequence_hashes(data, block_size)
            if self.name == "dynamo"
            else [vllm_int_hash(h) for h in vllm_block_hashes(data, block_size, self.none_hash)]
        )
        return b"".join(_U64.pack(h) * 2 for h in hashes)


def engine_hashes(keys: np.ndarray) -> np.ndarray:
    """The engine's 64-bit hash per block, from (n, 2) uint64 keys of an engine scheme."""
    return keys[:, 0]


def dynamo_local_hashes(data: bytes, block_size: int) -> list[int]:
    step = block_size * TOKEN_DTYPE.itemsize
    return [
        xxhash.xxh3_64_intdigest(data[start : start + step], seed=DYNAMO_SEED)
        for start in range(0, len(data), step)
    ]


def dynamo_sequence_hashes(data: bytes, block_size: int) -> list[int]:
    sequence: list[int] = []
    for local in dynamo_local_hashes(data, block_size):
        sequence.append(
            local
            if not sequence
            else xxhash.xxh3_64_intdigest(
                _U64.pack(sequence[-1]) + _U64.pack(local), seed=DYNAMO_SEED
            )
        )
    return sequence


def vllm_none_hash(python_hash_seed: str) -> bytes:
    """NONE_HASH of a vLLM engine started with PYTHONHASHSEED=python_hash_seed (init_none_hash
    with sha256_cbor)."""
    return sha256_cbor(python_hash_seed)


def sha256_cbor(value: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def vllm_block_hashes(data: bytes, block_size: int, none_hash: bytes) -> list[bytes]:
    tokens = np.frombuffer(data, dtype=TOKEN_DTYPE).tolist()
    hashes: list[bytes] = []
    for start in range(0, len(tokens), block_size):
        parent = hashes[-1] if hashes else none_hash
        hashes.append(sha256_cbor((parent, tuple(tokens[start : start + block_size]), None)))
    return hashes


def vllm_int_hash(digest: bytes) -> int:
    """vLLM's maybe_convert_block_hash with int block hashes: the low 64 bits, big-endian."""
    return int.from_bytes(digest, "big") & ((1 << 64) - 1)
