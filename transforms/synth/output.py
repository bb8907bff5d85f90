"""A synthesized trace as Mooncake JSONL, formatted as kvtrace anonymize writes its rows."""

from __future__ import annotations

import numpy as np

from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.trace_format import NO_RESPONSE_MS, NO_SESSION, TraceColumns
from kvtrace.transforms.trace_format import jsonl_bytes as trace_jsonl


def dense_sessions(sessions: np.ndarray | None) -> list[int | None]:
    """Sessions as 0, 1, 2, ... in order of first appearance (None stays None): no source
    identifier is published."""
    if sessions is None:
        return []
    numbered: dict = {}
    return [None if s is None else numbered.setdefault(s, len(numbered)) for s in sessions.tolist()]


def jsonl_bytes(trace: Trace) -> bytes:
    return rows_jsonl(
        trace.timestamp.astype(np.int64),
        trace.input_length,
        trace.output_length,
        trace.ids,
        trace.offsets,
        dense_sessions(trace.session) or [None] * len(trace),
    )


def rows_jsonl(
    timestamp: np.ndarray,
    input_length: np.ndarray,
    output_length: np.ndarray,
    ids: np.ndarray,
    offsets: np.ndarray,
    sessions: list[int | None],
) -> bytes:
    """Rows as JSON lines; sessions already published numbers (or None). Formatted by the
    published format's own writer, so a synthesized row is byte for byte an anonymized one."""
    rows = len(timestamp)
    session = np.array([NO_SESSION if s is None else s for s in sessions], dtype=np.int64)
    return trace_jsonl(
        TraceColumns(
            _int64(timestamp),
            _int64(input_length),
            _int64(output_length),
            np.diff(_int64(offsets)),
            _int64(ids),
            session,
            np.full(rows, NO_RESPONSE_MS, dtype=np.int64),
        )
    )


def _int64(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)
