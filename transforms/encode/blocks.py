"""Cut token ids into fixed-size blocks and chain-hash them.

Block i's hash covers block i's tokens and block i-1's hash, so two requests share hash i exactly
when they share their first i+1 blocks: the prefix-sharing structure survives, the tokens do not.
"""

from __future__ import annotations

import array
import hashlib
import hmac
import sys
from collections.abc import Sequence

import numpy as np
import xxhash

from kvtrace.transforms.trace_format import KEYED_SCHEME

HASH_SCHEME = KEYED_SCHEME  # the published format names it
DIGEST_SIZE = 16  # bytes of one block hash (xxh3-128)
TOKEN_DTYPE = np.dtype("<u4")  # fixed width, so a block's bytes encode its length unambiguously
_UINT32_CODE = next(code for code in "IL" if array.array(code).itemsize == 4)


def block_count(num_tokens: int, block_size: int) -> int:
    """Blocks for num_tokens tokens, the partial last block included: ceil(n / block_size)."""
    return -(-num_tokens // block_size)


def last_block_tokens(num_tokens: int, block_size: int) -> int:
    """Tokens in the last (possibly partial) block; 0 for an empty input."""
    if num_tokens == 0:
        return 0
    return num_tokens - (block_count(num_tokens, block_size) - 1) * block_size


def chain_seed(salt: bytes) -> bytes:
    """The hash the chain starts from: every block hash depends on the salt through it."""
    return xxhash.xxh3_128_digest(b"kvtrace-chain-seed\0" + salt)


def cache_salt_bytes(cache_salt: str | None) -> bytes | None:
    """A request's cache salt as the bytes its ids are keyed with (request_chain_seed, and the
    row's fingerprint): built once, so both key by the one encoding."""
    return None if cache_salt is None else cache_salt.encode("utf-8", "surrogatepass")


def request_chain_seed(seed: bytes, cache_salt: bytes | None) -> bytes:
    """The chain seed of one request: the run's (seed), or for a request the engine cached
    apart by its cache salt (cache_salt_bytes), the run's keyed with that salt (HMAC-SHA256,
    cut to a digest), so requests of different salts share no block hash, requests of one salt
    share theirs, and the salt itself is never in a hash anyone could check a guess against
    without the run's."""
    if cache_salt is None:
        return seed
    message = b"kvtrace-cache-salt\0" + cache_salt
    return hmac.new(seed, message, hashlib.sha256).digest()[:DIGEST_SIZE]


def salt_fingerprint(salt: bytes) -> str:
    """A public fingerprint that tells two salts apart without revealing the chain seed."""
    return hashlib.sha256(b"kvtrace-salt-fingerprint\0" + salt).hexdigest()[:16]


def shared_length(first: np.ndarray, second: np.ndarray) -> int:
    """How many leading elements two arrays share (token ids, block ids)."""
    size = min(len(first), len(second))
    differ = np.flatnonzero(first[:size] != second[:size])
    return int(differ[0]) if differ.size else size


def token_bytes(token_ids: Sequence[int] | np.ndarray) -> bytes:
    """Token ids as fixed-width little-endian bytes: what blocks are cut from and hashed."""
    if isinstance(token_ids, np.ndarray):
        return token_ids.astype(TOKEN_DTYPE, copy=False).tobytes()
    # array.array converts a Python list ~3x faster than numpy does (tokenizers return lists).
    packed = array.array(_UINT32_CODE, token_ids)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def chain_hashes(data: bytes, block_size: int, seed: bytes) -> bytes:
    """The block hashes of one request's token_bytes, DIGEST_SIZE bytes each, in block order."""
    step = block_size * TOKEN_DTYPE.itemsize
    digest = seed
    out = bytearray()
    for start in range(0, len(data), step):
        digest = xxhash.xxh3_128_digest(digest + data[start : start + step])
        out += digest
    return bytes(out)


def keyed_digest(value: str, seed: bytes) -> bytes:
    """A keyed 16-byte digest of an identifier (session ids), never reversible without the salt."""
    return xxhash.xxh3_128_digest(seed + b"\0id\0" + value.encode("utf-8"))
