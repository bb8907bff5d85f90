"""Engine hash captures re-keyed with the run's salt: the first thing done with them.

An engine's block hash is unkeyed (Dynamo's XXH3-64 chain) or keyed with a secret its operators
share: published, or kept in an id map, it would let whoever holds the tokenizer confirm a
guessed prompt. Each is replaced here by a keyed MAC (BLAKE2b keyed with the salt's chain seed,
blocks.chain_seed, 16 bytes: the width of a text block's key) over the capture's scheme and the
hash. The engine's hashes are already chained (hash i covers blocks 0..i), so equal MACs mean
equal prefixes, as equal chain hashes do on the text path, and the dense ids follow alike.
"""

from __future__ import annotations

import hashlib
import struct

import xxhash

from kvtrace.transforms.encode.blocks import keyed_digest
from kvtrace.transforms.encode.hashed_batch import HashedRequest
from kvtrace.transforms.read.captures import Capture
from kvtrace.transforms.read.records import Request
from kvtrace.transforms.trace_format import NO_RESPONSE_MS

# A capture cut at another block size than the run's: the night refuses to publish
# (write/manifest.py check_rejected_fraction), as it never re-cuts an engine's blocks.
BLOCK_SIZE_MISMATCH = "block_size_mismatch"
_PERSON = b"kvtrace-capture"  # BLAKE2b's personalization: these MACs are no other digest's


def rekeyed(capture: Capture, seed: bytes) -> bytes:
    """16 bytes per block: the MAC of each engine hash, keyed by the salt's chain seed, then of
    the capture's tail (a partial last block the engine did not hash), if it has one."""
    scheme = hashlib.blake2b(digest_size=16, key=seed, person=_PERSON)
    scheme.update(capture.scheme.encode() + b"\0")  # keyed once, copied per hash: half the cost
    keys = bytearray()
    for value in capture.hashes:
        mac = scheme.copy()
        mac.update(value)
        keys += mac.digest()
    if capture.tail is not None:  # chained on the last full block's hash, as a block's are
        mac = scheme.copy()
        mac.update(b"tail\0" + (capture.hashes[-1] if capture.hashes else b"") + b"\0")
        mac.update(capture.tail)
        keys += mac.digest()
    return bytes(keys)


def hash_capture(request: Request, seed: bytes) -> HashedRequest:
    """The HashedRequest of a capture record (request.capture set), as hash_request gives one
    for a text record: lengths from the capture, block keys re-keyed."""
    capture = request.capture
    assert capture is not None
    output_length = request.output_length or 0
    session = request.session
    # Unsalted, never published: orders requests tied on time and lengths the same in every
    # run, as the text path's digest of token ids does (row_order.py).
    fingerprint = xxhash.xxh3_64_intdigest(
        b"\0".join(capture.hashes)
        + (capture.tail or b"")
        + struct.pack("<qq", capture.input_length, output_length)
        + (b"" if session is None else session.encode("utf-8", "surrogatepass"))
    )
    return HashedRequest(
        timestamp_ms=request.timestamp_ms,
        fingerprint=fingerprint,
        input_length=capture.input_length,
        output_length=output_length,
        block_hashes=rekeyed(capture, seed),
        session_key=None if session is None else keyed_digest(session, seed),
        defaulted=request.defaulted,
        response_ms=NO_RESPONSE_MS if request.response_ms is None else request.response_ms,
    )
