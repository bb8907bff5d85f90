"""The tie-break fingerprint of a request, text or capture: one encoder for every kind.

Rows equal in what the gate checks are ordered by it (docs/ORDERING.md), and ids are numbered
first-seen in that order, so two requests it leaves tied must hold the same ids and publish the
same values. It is therefore an unsalted digest of an unambiguous encoding of all they are made
of: every field typed and length-prefixed, optional ones behind a marker, so no field can be
left out or run into its neighbour and two different requests never feed it the same bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

# What the digest is of: the request's blocks are its token ids (the text path) or an engine's
# hashes under a named scheme (a capture); never one where the other was.
_TOKENS, _HASHES = b"T", b"H"
_ABSENT, _PRESENT = b"\0", b"\1"
_U64 = struct.Struct("<Q")
_FIELDS = struct.Struct("<qqq")  # block size, input length, output length


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
    engine's hashes, each as logged, or the prompt's token bytes as one item. tail: what keys a
    capture's unhashed partial block. answer: the generated tokens' bytes, when they are hashed
    into ids (--emit-output-hashes)."""
    kind = _TOKENS if scheme is None else _HASHES + _text(scheme)
    # The count and every length before the values: one pack and one join, however many hashes.
    lengths = struct.pack(f"<{len(blocks) + 1}Q", len(blocks), *map(len, blocks))
    return b"".join(
        (
            kind,
            _FIELDS.pack(block_size, input_length, output_length),
            lengths,
            *blocks,
            _optional(tail),
            _optional(None if session is None else session.encode("utf-8", "surrogatepass")),
            _optional(answer),
        )
    )


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


def _text(value: str) -> bytes:
    encoded = value.encode("utf-8", "surrogatepass")
    return _U64.pack(len(encoded)) + encoded


def _optional(value: bytes | None) -> bytes:
    return _ABSENT if value is None else _PRESENT + _U64.pack(len(value)) + value
