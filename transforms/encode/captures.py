"""Engine hash captures re-keyed with the run's salt: the first thing done with them.

An engine's block hash is unkeyed (Dynamo's XXH3-64 chain) or keyed with a secret its operators
share: published, or kept in an id map, it would let whoever holds the tokenizer confirm a
guessed prompt. Each is replaced here by a keyed digest under the salt, the one the text path
keys its blocks and sessions with (blocks.py: XXH3-128 over the salt's chain seed and the value,
16 bytes), over the capture's scheme and the hash. The engine's hashes are already chained (hash
i covers blocks 0..i), so equal keys mean equal prefixes, as equal chain hashes do on the text
path, and the dense ids follow alike. (A BLAKE2b MAC cost ~0.8 us a hash, more than the rest of
a short request's ingestion: docs/CAPTURES.md.)
"""

from __future__ import annotations

import xxhash

from kvtrace.transforms.encode.blocks import keyed_digest
from kvtrace.transforms.encode.fingerprint import fingerprint as request_fingerprint
from kvtrace.transforms.encode.hashed_batch import HashedRequest
from kvtrace.transforms.encode.schemes import engine_key_prefix, keyed_engine_hashes
from kvtrace.transforms.read.captures import Capture
from kvtrace.transforms.read.records import Request
from kvtrace.transforms.trace_format import NO_RESPONSE_MS

# A capture cut at another block size than the run's: the night refuses to publish
# (write/manifest.py check_rejected_fraction), as it never re-cuts an engine's blocks.
BLOCK_SIZE_MISMATCH = "block_size_mismatch"


def rekeyed(capture: Capture, seed: bytes) -> bytes:
    """16 bytes per block: each engine hash keyed by the salt's chain seed, then the capture's
    tail (a partial last block the engine did not hash), if it has one."""
    prefix = engine_key_prefix(seed, capture.scheme)
    keys = keyed_engine_hashes(prefix, capture.hashes)
    if capture.tail is None:
        return keys
    # chained on the last full block's hash, as a block's key is
    last = capture.hashes[-1] if capture.hashes else b""
    return keys + xxhash.xxh3_128_digest(prefix + b"tail\0" + last + b"\0" + capture.tail)


def hash_capture(request: Request, seed: bytes) -> HashedRequest:
    """The HashedRequest of a capture record (request.capture set), as hash_request gives one
    for a text record: lengths from the capture, block keys re-keyed."""
    capture = request.capture
    assert capture is not None
    output_length = request.output_length or 0
    session = request.session
    # Unsalted, never published: orders requests tied on time and lengths the same in every
    # run (row_order.py), over all the row's ids are made of, the hashes' scheme included.
    fingerprint = request_fingerprint(
        capture.scheme,
        capture.block_size,
        capture.hashes,
        capture.tail,
        capture.input_length,
        output_length,
        session,
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
