"""Routing a conversation's requests to one worker (`--route-sessions`, Beam engine).

Each worker's segment cache learns the history a session re-sends; on Beam a session's requests
are spread over whichever workers read the file ranges holding them, and each of those workers
tokenizes the history again. Keying requests by session before encoding sends a session to one
worker, at the price of a shuffle of the requests themselves. The output is the same either way
(encoding is per request); docs/SCALE.md weighs the two.

A request travels as its JSONL line, parsed again after the shuffle (half the bytes of the parsed
request pickled, and cheaper to decode); a Parquet row's line is a rendering of the row, not the
row, so a request read from Parquet travels whole.
"""

from __future__ import annotations

from typing import Union

import xxhash

from kvtrace.transforms.dead_letters import DeadLetter
from kvtrace.transforms.read.paths import PARQUET_SUFFIXES
from kvtrace.transforms.read.records import ParseOptions, Request
from kvtrace.transforms.read.sources import parse_one

# A request without a session has no history to share with others: keyed by its own bytes,
# such requests spread evenly, never gathering on one worker the way a shared key would.
_SESSION, _ALONE = "s:", "r:"

Routed = Union[tuple[str, bytes], Request]


def route_key(request: Request) -> str:
    """The shuffle key: a digest of the session when the request has one, else of its record
    (digests keep keys short whatever a log puts in its session ids)."""
    if request.session is not None:
        session = request.session.encode("utf-8", "surrogatepass")
        return _SESSION + xxhash.xxh3_128_hexdigest(session)
    return _ALONE + xxhash.xxh3_128_hexdigest(request.line)


def routed(request: Request) -> Routed:
    """What crosses the shuffle: (source, line) for a JSONL request, the request itself else."""
    if request.source.lower().endswith(PARQUET_SUFFIXES):
        return request
    return request.source, request.line


def arrived(payload: Routed, options: ParseOptions) -> Request | DeadLetter:
    """The request again after the shuffle (parsing is pure: the same Request as before)."""
    if isinstance(payload, Request):
        return payload
    return parse_one(*payload, options)
