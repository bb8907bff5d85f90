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

Whatever the scheme, a block's key for numbering is 16 bytes (hi, lo as little-endian u64), and
keyed by the salt: an engine hash is keyed under the salt's chain seed (keyed_engine_hashes, as
a capture's are), so an id map (which keeps keys) confirms no guessed prompt without the salt.
Only a run that writes the engine hashes out (--emit-block-hashes: HashScheme.raw) keeps the
engine's 64-bit form as its keys, hi == lo, read back by engine_hashes: dynamo's sequence hash,
and for vLLM the int its KV events publish with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (the
digest's last 8 bytes, big-endian). Its map holds those raw hashes, as private as the folder
they are written to, under an identity of its own (map_identity): the two are never mixed.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
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
    raw: bool = False  # engine schemes only: the engine's hashes as keys (--emit-block-hashes)

    def __post_init__(self) -> None:
        if self.name not in SCHEMES:
            raise ValueError(f"unknown hash scheme {self.name!r}: one of {', '.join(SCHEMES)}")
        if self.raw and self.keyed:
            raise ValueError("only an engine hash scheme has raw hashes to keep")
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

    @property
    def map_identity(self) -> str:
        """What an id map records: its keys' scheme. An engine scheme's keys are keyed by the
        salt, raw only when written out (raw): those keep the identity maps of raw engine hashes
        always had (kvtrace before round 26), so a map of one kind refuses runs of the other."""
        if self.keyed or self.raw:
            return self.identity
        return f"{self.identity}+salt-keyed"

    def block_keys(self, data: bytes, block_size: int, seed: bytes) -> bytes:
        """16 bytes per block of one request's token bytes (u32 LE), in block order; seed is
        the salt's chain seed, which keys every scheme's keys but raw ones."""
        if self.name == "kvtrace":
            return chain_hashes(data, block_size, seed)
        hashes = (
            dynamo_sequence_hashes(data, block_size)
            if self.name == "dynamo"
            else [vllm_int_hash(h) for h in vllm_block_hashes(data, block_size, self.none_hash)]
        )
        if self.raw:
            return b"".join(_U64.pack(h) * 2 for h in hashes)
        prefix = engine_key_prefix(seed, self.identity)
        return keyed_engine_hashes(prefix, [_U64.pack(h) for h in hashes])


# The domain of keyed engine hashes (blocks.keyed_digest's ids are under \0id\0): named when
# captures alone were keyed, kept so that their keys, which maps hold, stay what they were.
_ENGINE_DOMAIN = b"\0capture\0"


def engine_key_prefix(seed: bytes, label: str) -> bytes:
    """What an engine hash of one scheme (label: a scheme's identity, a capture's format) is
    keyed after: the salt's chain seed, the domain, the label."""
    return seed + _ENGINE_DOMAIN + label.encode() + b"\0"


def keyed_engine_hashes(prefix: bytes, values: Iterable[bytes]) -> bytes:
    """16 bytes per engine hash (its bytes): XXH3-128 over the prefix and the hash, as the text
    path keys its blocks (blocks.py); engine hashes are chained already, so equal keys mean
    equal prefixes."""
    return b"".join([xxhash.xxh3_128_digest(prefix + value) for value in values])


def engine_hashes(keys: np.ndarray) -> np.ndarray:
    """The engine's 64-bit hash per block, from (n, 2) uint64 keys of a raw engine scheme."""
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
