"""New requests drawn from a trace (`--num-requests`), as `datagen synthesize` does: a trace of
12k rows can drive a benchmark of a million with the same statistics.

A drawn conversation (a session, or a request without one) copies a source one's structure:
its turns' shared prefixes (the same prefix tree, so the same reuse), its turns' offsets in
time; each turn's own part gets fresh blocks of a length drawn from the trace's own parts, each
turn an output length drawn from the trace's, and conversations start at inter-arrival times
drawn from the trace's. Turns keep the previous turn's whole input as their prefix where the
source turn did. The result is a trace like any other, reshaped afterwards by the knobs.

Everything is drawn from rows in the order of what they hold (content_order), never of where
they sit: the same rows, in any order or split over any files, draw the same requests.
"""

from __future__ import annotations

import numpy as np

from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.synth.parts import RowParts, content_order

# The block ids the drawn requests may hold together: each is held as a Python int in a list
# while drawing (~40 bytes at the peak, with the int64 arrays built from them), so 2^28 ids
# are ~10 GB, a million requests of 268 ids; a typo's extra zeros otherwise run the machine
# out of memory with no line at all.
MAX_DRAWN_IDS = 1 << 28


def sample_requests(
    trace: Trace, parts: RowParts, requests: int, block_size: int, rng: np.random.Generator
) -> Trace:
    longest = int(trace.lengths.max(initial=0))
    _check_drawn(requests * longest, f"{requests:,} x the trace's longest row, {longest:,}")
    order = content_order(trace, parts.prefix)
    units = _conversations(trace, order)  # lists of rows, content order
    starts = np.array([trace.timestamp[turns[0]] for turns in units])
    gaps = np.diff(np.sort(starts)) if len(starts) > 1 else np.zeros(1)
    n = trace.lengths
    own_tokens = _own_tokens(trace, parts, block_size)[order]
    pool = own_tokens[own_tokens > 0]
    output_lengths = trace.output_length[order]
    # The source's ids renumbered densely (order kept), so fresh ones follow the count of ids,
    # never the largest (a foreign trace's near 2^63 would overflow int64); the output is
    # numbered by first appearance afterwards, so the same bytes come out either way.
    source_ids = np.unique(trace.ids, return_inverse=True)[1].reshape(-1).astype(np.int64)
    next_id = int(source_ids.max(initial=-1)) + 1
    rows: list[tuple[float, int, int, list[int], object]] = []
    clock, drawn, held = float(starts.min(initial=0.0)), 0, 0
    while drawn < requests:
        turns = units[int(rng.integers(len(units)))]
        session = (
            f"s{drawn}"
            if trace.session is not None and trace.session[turns[0]] is not None
            else None
        )
        previous: tuple[list[int], int] | None = None  # the drawn previous turn: ids, length
        for row in turns:
            if drawn == requests:
                break
            ids = source_ids[trace.offsets[row] : trace.offsets[row + 1]].tolist()
            shared, common = int(parts.shared[row]), int(parts.common[row])
            source_previous = int(parts.previous_turn[row])
            if previous is not None and common >= max(shared, 1):
                whole = common == n[source_previous]  # the source turn continued all of it
                base = previous[0] if whole else previous[0][:common]
                base_end, base_length = common, previous[1] if whole else None
            else:
                base, base_end, base_length = ids[:shared], shared, None
            if base_end == n[row]:  # the source turn ends inside its base: no own part
                own: list[int] = []
                length = base_length if base_length is not None else int(trace.input_length[row])
            else:
                tokens = int(pool[rng.integers(len(pool))]) if len(pool) else block_size
                blocks = -(-tokens // block_size)
                own = list(range(next_id, next_id + blocks))
                next_id += blocks
                length = len(base) * block_size + tokens
            offset = float(trace.timestamp[row] - trace.timestamp[turns[0]])
            osl = int(output_lengths[rng.integers(len(trace))])
            held += len(base) + len(own)  # a turn continuing a drawn one may outgrow its source
            _check_drawn(held, f"{drawn + 1:,} drawn so far")
            rows.append((clock + offset, length, osl, base + own, session))
            previous = (base + own, length)
            drawn += 1
        clock += float(gaps[rng.integers(len(gaps))])
    rows.sort(key=lambda r: r[0])
    return _as_trace(rows, trace.session is not None)


def _check_drawn(ids: int, counted: str) -> None:
    """A one-line refusal naming the flag, once the drawn requests would hold past the bound."""
    if ids > MAX_DRAWN_IDS:
        raise ConfigError(
            f"--num-requests would draw {ids:,} block ids ({counted}), over the "
            f"{MAX_DRAWN_IDS:,} synthesize holds: lower --num-requests"
        )


def _conversations(trace: Trace, order: np.ndarray) -> list[list[int]]:
    """Rows grouped by session (in the order given within), a request without one alone."""
    groups: dict = {}
    for row in order.tolist():
        session = trace.session[row] if trace.session is not None else None
        key = ("s", session) if session is not None else ("r", row)
        groups.setdefault(key, []).append(row)
    return [turns for turns in groups.values() if trace.lengths[turns].sum() > 0] or [
        [row] for row in order.tolist()
    ]


def _own_tokens(trace: Trace, parts: RowParts, block_size: int) -> np.ndarray:
    """Per row, the tokens of its own part (after its shared run, or its common part with the
    previous turn)."""
    base = np.where(
        (parts.previous_turn >= 0) & (parts.common >= np.maximum(parts.shared, 1)),
        parts.common,
        parts.shared,
    )
    own_blocks = trace.lengths - base
    return np.where(own_blocks > 0, (own_blocks - 1) * block_size + parts.last_tokens, 0)


def _as_trace(rows: list[tuple[float, int, int, list[int], object]], sessions: bool) -> Trace:
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r[3]) for r in rows], out=offsets[1:])
    return Trace(
        timestamp=np.array([r[0] for r in rows], dtype=np.float64),
        input_length=np.array([r[1] for r in rows], dtype=np.int64),
        output_length=np.array([r[2] for r in rows], dtype=np.int64),
        offsets=offsets,
        ids=np.array([i for r in rows for i in r[3]], dtype=np.int64),
        session=np.array([r[4] for r in rows], dtype=object) if sessions else None,
        line=np.arange(1, len(rows) + 1),
        file_index=np.zeros(len(rows), dtype=np.int32),
        files=["sampled"],
    )
