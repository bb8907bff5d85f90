"""What each request of a trace is made of, as synthesis reshapes it.

A request's blocks split into up to three runs, in this order:
- shared: the leading blocks it shares with other conversations (a system prompt, a document):
  blocks whose prefix is visited by two or more units, a unit being a session, or a request of
  its own when it has none. Visits by earlier turns of the same conversation do not count, so a
  conversation's history is never mistaken for a shared prefix (aiperf#1393);
- history: in a multi-turn session, the leading blocks it has in common with the session's
  previous turn (normally that turn's whole input), beyond the shared run (when the common
  part covers the shared run; shared-ness is a property of the prefix, so both turns agree on
  it);
- own: the rest, this request's unique part.
Blocks are exact prefixes (stats.trace_blocks.prefix_ids): a block is shared only when every
block before it is too, so the shared run is a prefix of the request.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.stats.trace_blocks import causal_order, last_block_tokens, prefix_ids


@dataclass(frozen=True)
class RowParts:
    """Per row, file order: how many leading blocks are shared, how many it has in common with
    the row before it in its session, and that row (-1 for none); rows in causal order."""

    shared: np.ndarray  # int64
    common: np.ndarray  # int64: leading blocks in common with previous_turn (0 without one)
    previous_turn: np.ndarray  # int64 row index, -1
    order: np.ndarray  # row indices in causal order (timestamp, file order)
    prefix: np.ndarray  # per block (file order): the exact prefix's id (or 64-bit key)
    last_tokens: np.ndarray  # per row: tokens of its last block (0 without blocks)

    @staticmethod
    def of(
        trace: Trace,
        block_size: int,
        shared: np.ndarray | None = None,
        prefix: np.ndarray | None = None,
    ) -> RowParts:
        """shared and prefix are computed from the trace unless given: the Beam engine gives
        them for a shard of conversations (shared-ness is counted over the whole trace, and
        prefixes are identified by their 64-bit keys, the same in every shard)."""
        prefix = prefix_ids(trace) if prefix is None else prefix
        order = np.argsort(causal_order(trace), kind="stable")
        if shared is None:
            shared = _shared_lengths(trace, prefix, _units(trace))
        previous = _previous_turns(trace, order)
        common = np.zeros(len(trace), dtype=np.int64)
        for row in np.flatnonzero(previous >= 0).tolist():
            common[row] = _common_prefix(trace, prefix, row, int(previous[row]))
        return RowParts(
            shared, common, previous, order, prefix, last_block_tokens(trace, block_size)
        )


def session_text(session: object) -> str:
    """A session id as hashed: its JSON type and value (1 and "1" are different sessions)."""
    return f"{type(session).__name__}:{session}"


def _units(trace: Trace) -> np.ndarray:
    """A dense unit per row: its session's, or its own when it has none."""
    rows = len(trace)
    if trace.session is None:
        return np.arange(rows, dtype=np.int64)
    keys = [("s", s) if s is not None else ("r", i) for i, s in enumerate(trace.session.tolist())]
    index: dict = {}
    return np.array([index.setdefault(key, len(index)) for key in keys], dtype=np.int64)


def _shared_lengths(trace: Trace, prefix: np.ndarray, units: np.ndarray) -> np.ndarray:
    """Per row, the leading blocks whose prefix two or more units visit."""
    lengths = trace.lengths
    row_of_block = np.repeat(np.arange(len(trace)), lengths)
    span = int(units.max(initial=0)) + 1
    pairs = np.sort(prefix.astype(np.int64) * span + units[row_of_block])  # (prefix, unit)
    distinct = pairs[np.concatenate([[True], pairs[1:] != pairs[:-1]])] if len(pairs) else pairs
    visitors = np.bincount(distinct // span, minlength=int(prefix.max(initial=-1)) + 1)
    shared_block = visitors[prefix] >= 2
    # The shared blocks of a row form a prefix of it: count them.
    return np.bincount(row_of_block[shared_block], minlength=len(trace)).astype(np.int64)


def _previous_turns(trace: Trace, order: np.ndarray) -> np.ndarray:
    previous = np.full(len(trace), -1, dtype=np.int64)
    if trace.session is None:
        return previous
    last: dict = {}
    for row in order.tolist():
        session = trace.session[row]
        if session is not None:
            previous[row] = last.get(session, -1)
            last[session] = row
    return previous


def _common_prefix(trace: Trace, prefix: np.ndarray, row: int, other: int) -> int:
    a = prefix[trace.offsets[row] : trace.offsets[row + 1]]
    b = prefix[trace.offsets[other] : trace.offsets[other + 1]]
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
