"""A synthesized trace as Mooncake JSONL, formatted as kvtrace anonymize writes its rows."""

from __future__ import annotations

import numpy as np
from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.trace_format import SESSION_FIELD


def dense_sessions(sessions: np.ndarray | None) -> list[int | None]:
    """Sessions as 0, 1, 2, ... in order of first appearance (None stays None): no source
    identifier is published."""
    if sessions is None:
        return []
    numbered: dict = {}
    return [None if s is None else numbered.setdefault(s, len(numbered)) for s in sessions.tolist()]


def jsonl_bytes(trace: Trace) -> bytes:
    return rows_jsonl(trace.timestamp.astype(np.int64), trace.input_length, trace.output_length,
                      trace.ids, trace.offsets, dense_sessions(trace.session) or [None] * len(trace))


def rows_jsonl(timestamp: np.ndarray, input_length: np.ndarray, output_length: np.ndarray,
               ids: np.ndarray, offsets: np.ndarray, sessions: list[int | None]) -> bytes:
    """Rows as JSON lines; sessions already published numbers (or None)."""
    ids_list, offsets_list = ids.tolist(), offsets.tolist()
    lines = []
    for row, (ts, isl, osl, session) in enumerate(zip(
            timestamp.tolist(), input_length.tolist(), output_length.tolist(), sessions)):
        tail = "]}" if session is None else f'], "{SESSION_FIELD}": {session}}}'
        lines.append(f'{{"timestamp": {ts}, "input_length": {isl}, '
                     f'"output_length": {osl}, "hash_ids": ['
                     f'{", ".join(map(str, ids_list[offsets_list[row]:offsets_list[row + 1]]))}'
                     f'{tail}\n')
    return "".join(lines).encode()
