"""A synthesized trace as Mooncake JSONL, formatted as kvtrace anonymize writes its rows."""

from __future__ import annotations

import numpy as np
from transforms.stats.trace_io import Trace
from transforms.write.shards import SESSION_FIELD


def dense_sessions(sessions: np.ndarray | None) -> list[int | None]:
    """Sessions as 0, 1, 2, ... in order of first appearance (None stays None): no source
    identifier is published."""
    if sessions is None:
        return []
    numbered: dict = {}
    return [None if s is None else numbered.setdefault(s, len(numbered)) for s in sessions.tolist()]


def jsonl_bytes(trace: Trace) -> bytes:
    ids = trace.ids.tolist()
    offsets = trace.offsets.tolist()
    sessions = dense_sessions(trace.session) or [None] * len(trace)
    lines = []
    for row, (timestamp, isl, osl, session) in enumerate(zip(
            trace.timestamp.astype(np.int64).tolist(), trace.input_length.tolist(),
            trace.output_length.tolist(), sessions)):
        tail = "]}" if session is None else f'], "{SESSION_FIELD}": {session}}}'
        lines.append(f'{{"timestamp": {timestamp}, "input_length": {isl}, '
                     f'"output_length": {osl}, "hash_ids": ['
                     f'{", ".join(map(str, ids[offsets[row]:offsets[row + 1]]))}{tail}\n')
    return "".join(lines).encode()
