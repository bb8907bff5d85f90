"""The tie-break fingerprint of a request, text or capture: one encoder for every kind.

Rows equal in what the gate checks are ordered by it (docs/ORDERING.md), and ids are numbered
first-seen in that order, so two requests it leaves tied must hold the same ids and publish the
same values. It is therefore an unsalted digest of an unambiguous encoding of all they are made
of: every integer first at a fixed width, each value's length among them (or a marker for a value
absent), then the values; so no field can be left out or run into its neighbour, and two
different requests never feed it the same bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash


def fingerprint_bytes(
    scheme: str | None,
    block_size: int,
    blocks: Sequence[bytes],
    tail: bytes | None,
    input_length: int,
    output_length: int,
    session: str | None,
    answer: bytes | None = None,
) -> bytes:
    """scheme: a capture's hash scheme, or None for token ids (whose keys are the same function
    of them for every row of a run, so rows order alike under every --hash-scheme). blocks: the
    engine's hashes, each as logged, or the prompt's token bytes as one item (and its cache salt,
    which keys its ids, as a second: encode_requests.hash_request). tail: what keys a
    capture's unhashed partial block. answer: the generated tokens' bytes, when they are hashed
    into ids (--emit-output-hashes)."""
    named = None if scheme is None else scheme.encode("utf-8", "surrogatepass")
    session_id = None if session is None else session.encode("utf-8", "surrogatepass")
    # One pack and one join however many hashes (a capture's cost is per block: CAPTURES.md).
    # An optional value's length is stored plus one, so 0 marks it absent: none is not empty.
    head = struct.pack(
        f"<{8 + len(blocks)}q",
        block_size,
        input_length,
        output_length,
        len(blocks),
        0 if named is None else len(named) + 1,
        0 if tail is None else len(tail) + 1,
        0 if session_id is None else len(session_id) + 1,
        0 if answer is None else len(answer) + 1,
        *map(len, blocks),
    )
    return b"".join((head, named or b"", *blocks, tail or b"", session_id or b"", answer or b""))


def fingerprint(
    scheme: str | None,
    block_size: int,
    blocks: Sequence[bytes],
    tail: bytes | None,
    input_length: int,
    output_length: int,
    session: str | None,
    answer: bytes | None = None,
) -> int:
    """The 64-bit digest of fingerprint_bytes (the ids' digest breaks its 2^-64 ties)."""
    return xxhash.xxh3_64_intdigest(
        fingerprint_bytes(
            scheme, block_size, blocks, tail, input_length, output_length, session, answer
        )
    )
