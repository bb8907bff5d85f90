"""Trace rows: a request's lengths and timestamp with its dense block ids (and session number)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvtrace.transforms.blocks import DIGEST_SIZE
from kvtrace.transforms.dense_ids import ids_per_request


@dataclass(frozen=True)
class TraceRow:
    timestamp_ms: int  # absolute; made relative to the export's first request when written
    fingerprint: int  # tie-break for equal timestamps; never written
    input_length: int
    output_length: int
    hash_ids: np.ndarray  # int64 dense ids, one per block
    session_id: int | None
    defaulted: tuple[str, ...] = ()

    def sort_key(self) -> tuple[Any, ...]:
        """Timestamp, then fingerprint; the published fields break the (2^-64) remaining ties."""
        return (
            self.timestamp_ms,
            self.fingerprint,
            self.input_length,
            self.output_length,
            -1 if self.session_id is None else self.session_id,
            self.hash_ids.tolist(),
        )


def assemble_rows(element: tuple[int, dict[str, list]]) -> Iterator[TraceRow]:
    """One batch's requests joined with their block ids and session numbers."""
    _, groups = element
    for requests in groups["requests"]:  # one batch per id; a list keeps the join symmetric
        block_ids = ids_per_request(
            groups["blocks"], [len(r.block_hashes) // DIGEST_SIZE for r in requests]
        )
        session_ids = ids_per_request(
            groups["sessions"], [int(r.session_key is not None) for r in requests]
        )
        for request, ids, session in zip(requests, block_ids, session_ids):
            yield TraceRow(
                timestamp_ms=request.timestamp_ms,
                fingerprint=request.fingerprint,
                input_length=request.input_length,
                output_length=request.output_length,
                hash_ids=ids,
                session_id=int(session[0]) if len(session) else None,
                defaulted=request.defaulted,
            )
