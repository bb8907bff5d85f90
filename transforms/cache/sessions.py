"""Sessions as a cache sees them: how many, how long, and whether reuse stays inside them.

A session is the trace's own conversation where a row names one (kvtrace's `session`, others'
`session_id`), else the requests sharing a first block (a conversation's opening, or a system
prompt). Reused tokens are split by whether the block's previous use was in a request of the
same session or of another one. Sessions by first block keep every reuse within: a block is its
exact prefix, so its previous use began with the same first block.
"""

from __future__ import annotations

import numpy as np

from kvtrace.transforms.cache.cache_trace import CacheTrace
from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.stats.trace_blocks import causal_order
from kvtrace.transforms.stats.trace_stats import describe

NO_SESSION = -1  # a row with no block and no session id: a session of no one


def session_of_rows(trace: Trace, cache: CacheTrace) -> tuple[np.ndarray, str]:
    """Each row's session (an int code per row, causal order, NO_SESSION for none) and what
    defined them: "session ids" or "first block"."""
    has_blocks = np.diff(cache.row_starts) > 0
    first_block = np.full(cache.rows, NO_SESSION, dtype=np.int64)
    first_block[has_blocks] = cache.block[cache.row_starts[:-1][has_blocks]]
    if trace.session is None:
        return first_block, "first block"
    named = trace.session[np.argsort(causal_order(trace), kind="stable")].tolist()
    # A row without a session id is a session of its first block, kept apart from the named.
    keys = np.array(
        [
            f"s{s}" if s is not None else (f"b{b}" if b != NO_SESSION else "")
            for s, b in zip(named, first_block.tolist())
        ]
    )
    codes = np.unique(keys, return_inverse=True)[1].astype(np.int64).reshape(-1)
    codes[keys == ""] = NO_SESSION
    return codes, "session ids"


def session_report(trace: Trace, cache: CacheTrace) -> dict:
    """Sessions: count, requests per session, and reused tokens within a session vs across."""
    session, defined_by = session_of_rows(trace, cache)
    named = session[session != NO_SESSION]
    per_session = np.unique(named, return_counts=True)[1]
    row = cache.row_of_block()
    # Each block occurrence after the first, paired with the previous one (causal order).
    order = np.argsort(cache.block, kind="stable")
    repeat = cache.block[order[1:]] == cache.block[order[:-1]]
    later, earlier = order[1:][repeat], order[:-1][repeat]
    tokens = cache.tokens[later].astype(np.int64)
    within = session[row[later]] == session[row[earlier]]
    reused = int(tokens.sum())
    within_tokens = int(tokens[within].sum())
    return {
        "defined_by": defined_by,
        "sessions": len(per_session),
        "requests_per_session": describe(per_session),
        "single_request_sessions": int((per_session == 1).sum()),
        "reused_tokens": reused,
        "reused_within_session": within_tokens / reused if reused else 0.0,
        "reused_across_sessions": (reused - within_tokens) / reused if reused else 0.0,
    }
