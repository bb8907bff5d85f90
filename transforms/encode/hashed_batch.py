"""Hashed requests: one request reduced to timestamps, lengths and keyed hashes, and a batch of
them held column-wise, which is what flows from the tokenize step onwards.

One Beam element per batch, a few numpy arrays each, so shipping a batch between stages costs one
pickle of a few arrays rather than one per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import xxhash

from kvtrace.transforms.encode.blocks import DIGEST_SIZE
from kvtrace.transforms.encode.fingerprint import fingerprint, fingerprint_bytes
from kvtrace.transforms.read.links import in_conversation
from kvtrace.transforms.read.measured import NOT_MEASURED
from kvtrace.transforms.trace_format import NO_RESPONSE_MS


@dataclass(frozen=True)
class HashedRequest:
    """A request reduced to what may leave the worker: no text, no token ids, no identifiers."""

    timestamp_ms: int
    # Unsalted digest of the request's content (all its ids are made of, a hashed answer too):
    # orders requests that share a timestamp the same way in every run, whatever the salt, so
    # ids do not depend on the salt. Never published.
    fingerprint: int
    input_length: int
    output_length: int
    block_hashes: bytes  # DIGEST_SIZE bytes per block
    session_key: bytes | None  # keyed digest of the session id
    defaulted: tuple[str, ...] = ()
    # --emit-output-hashes: the full blocks of prompt + generated tokens past the prompt's full
    # blocks, chained on from them (what the engine holds once the request has decoded).
    output_block_hashes: bytes = b""
    response_ms: int = NO_RESPONSE_MS  # when the log did not say when the response ended
    # The prompt tokens the engine reported cached: private, written only to the measured file.
    cached_tokens: int = NOT_MEASURED
    # read/links.py's links, keyed (link_key): the request this one continues (NO_LINK: none),
    # and the links naming this one, LINK_SIZE bytes each. Never published.
    parent_key: int = 0
    link_keys: bytes = b""
    # Unsalted digest of the links: orders requests alike in all else the same way whatever the
    # salt (the rows' parents are row numbers, so their order is published).
    links_digest: int = 0


NO_LINK = 0
LINK_SIZE = 8
_LINK_DOMAIN = b"\0link\0"  # these keys are no other digest's (blocks.keyed_digest: \0id\0)


def links_digest(continues: str | None, links: Sequence[str]) -> int:
    """The unsalted digest of a request's links (HashedRequest.links_digest); 0 for none."""
    if continues is None and not links:
        return 0
    # The fingerprint's encoder (each length first, the link continued as an optional value):
    # an id may hold any character, NUL too, so no separator could keep two links apart.
    named = [link.encode("utf-8", "surrogatepass") for link in links]
    return fingerprint(None, 0, named, None, 0, 0, continues)


def link_key(session: str | None, link: str, seed: bytes) -> int | None:
    """A link's key, within its conversation where it names something only there
    (links.in_conversation), keyed by the salt's seed; never NO_LINK. None for such a link of
    a request in no session: it has no conversation to name something in (two sessionless
    conversations' `call_0` are not one call)."""
    if not in_conversation(link):
        scope = None
    elif session is None:
        return None
    else:
        scope = session
    # The fingerprint's encoder (each length first, the scope an optional value): a session
    # and a link may hold any character, NUL too, so no separator could keep them apart.
    named = link.encode("utf-8", "surrogatepass")
    scoped = fingerprint_bytes(None, 0, [named], None, 0, 0, scope)
    digest = xxhash.xxh3_128_digest(seed + _LINK_DOMAIN + scoped)
    return int.from_bytes(digest[:LINK_SIZE], "little") | 1


def link_keys(
    session: str | None, continues: str | None, names: Sequence[str], seed: bytes
) -> tuple[int, bytes]:
    """(the key of the link a request continues, NO_LINK for none or none keyed; the keys of
    the links naming it, LINK_SIZE bytes each): HashedRequest.parent_key and link_keys."""
    # A row's parent is a row of its own session (trace_format.PARENT_SCOPE, which the audit
    # holds every parent to): only a link keyed within the session is continued.
    parent = (
        link_key(session, continues, seed)
        if continues is not None and in_conversation(continues)
        else None
    )
    keys = (link_key(session, name, seed) for name in names)
    named = b"".join(key.to_bytes(LINK_SIZE, "little") for key in keys if key is not None)
    return NO_LINK if parent is None else parent, named


REQUEST = np.dtype(
    [
        ("timestamp_ms", "<i8"),
        ("fingerprint", "<u8"),
        ("input_length", "<i8"),
        ("output_length", "<i8"),
        ("num_blocks", "<i8"),
        ("has_session", "?"),
        ("session_hi", "<u8"),
        ("session_lo", "<u8"),
        ("without_output_length", "?"),
        ("message_not_rendered", "?"),
        ("num_output_blocks", "<i8"),
        ("response_ms", "<i8"),
        ("cached_tokens", "<i8"),
        ("parent_key", "<u8"),  # NO_LINK when the request continues none
        ("num_links", "<i8"),
        ("links_digest", "<u8"),
    ]
)


@dataclass(frozen=True)
class HashedBatch:
    requests: np.ndarray  # REQUEST, one row per request
    # (total blocks, 2) uint64: each request's prompt block hashes then its output block hashes,
    # in request order
    block_hashes: np.ndarray
    # uint64: each request's link keys (HashedRequest.link_keys), concatenated in request order
    links: np.ndarray = field(default_factory=lambda: np.empty(0, "<u8"))

    def __len__(self) -> int:
        return len(self.requests)

    @staticmethod
    def pack(requests: Sequence[HashedRequest]) -> HashedBatch:
        columns = np.zeros(len(requests), dtype=REQUEST)
        columns["timestamp_ms"] = [r.timestamp_ms for r in requests]
        columns["fingerprint"] = [r.fingerprint for r in requests]
        columns["input_length"] = [r.input_length for r in requests]
        columns["output_length"] = [r.output_length for r in requests]
        columns["num_blocks"] = [len(r.block_hashes) // DIGEST_SIZE for r in requests]
        columns["without_output_length"] = ["output_length" in r.defaulted for r in requests]
        columns["message_not_rendered"] = ["message_not_rendered" in r.defaulted for r in requests]
        columns["num_output_blocks"] = [len(r.output_block_hashes) // DIGEST_SIZE for r in requests]
        columns["response_ms"] = [r.response_ms for r in requests]
        columns["cached_tokens"] = [r.cached_tokens for r in requests]
        columns["parent_key"] = [r.parent_key for r in requests]
        columns["num_links"] = [len(r.link_keys) // LINK_SIZE for r in requests]
        columns["links_digest"] = [r.links_digest for r in requests]
        sessions = [(i, r.session_key) for i, r in enumerate(requests) if r.session_key]
        if sessions:
            index = [i for i, _ in sessions]
            keys = np.frombuffer(b"".join(k for _, k in sessions), dtype="<u8").reshape(-1, 2)
            columns["has_session"][index] = True
            columns["session_hi"][index], columns["session_lo"][index] = keys[:, 0], keys[:, 1]
        hashes = np.frombuffer(
            b"".join(r.block_hashes + r.output_block_hashes for r in requests), dtype="<u8"
        )
        links = np.frombuffer(b"".join(r.link_keys for r in requests), dtype="<u8")
        return HashedBatch(columns, hashes.reshape(-1, 2), links)

    @staticmethod
    def concat(batches: Sequence[HashedBatch]) -> HashedBatch:
        return HashedBatch(
            np.concatenate([b.requests for b in batches]),
            np.concatenate([b.block_hashes for b in batches]),
            np.concatenate([b.links for b in batches]),
        )

    def select(self, keep: np.ndarray) -> HashedBatch:
        """The requests where the boolean mask `keep` holds, with their blocks."""
        block_mask = np.repeat(keep, self.blocks_per_request())
        links = self.links[np.repeat(keep, self.requests["num_links"])]
        return HashedBatch(self.requests[keep], self.block_hashes[block_mask], links)

    def earliest_ms(self) -> int | None:
        """The earliest request's timestamp; None for an empty batch."""
        timestamps = self.requests["timestamp_ms"]
        return int(timestamps.min()) if len(timestamps) else None

    def blocks_per_request(self) -> np.ndarray:
        """Prompt blocks plus output blocks (these only with --emit-output-hashes)."""
        return self.requests["num_blocks"] + self.requests["num_output_blocks"]

    def block_positions(self) -> np.ndarray:
        """Each block's position within its request (output blocks after the prompt's)."""
        counts = self.blocks_per_request()
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        return np.arange(len(self.block_hashes)) - starts
