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

from kvtrace.transforms.encode.blocks import shared_length
from kvtrace.transforms.ids.row_order import published_order
from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.stats.trace_blocks import last_block_tokens, prefix_ids


@dataclass(frozen=True)
class RowParts:
    """Per row, file order: how many leading blocks are shared, how many it has in common with
    the row before it in its session, and that row (-1 for none); rows in content order (time
    first, so causal; turns of one session at one time by what they hold, not where they sit)."""

    shared: np.ndarray  # int64
    common: np.ndarray  # int64: leading blocks in common with previous_turn (0 without one)
    previous_turn: np.ndarray  # int64 row index, -1
    order: np.ndarray  # row indices in content_order: causal, ties by content, never position
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
        exact = prefix_ids(trace)
        prefix = exact if prefix is None else prefix
        # Exact ids order rows alike in a shard and in the whole trace (by length, then as id
        # sequences); 64-bit keys would order a session's tied turns otherwise than locally.
        order = content_order(trace, exact)
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


def content_order(trace: Trace, prefix: np.ndarray) -> np.ndarray:
    """Row indices in the order of what the rows hold: published order (time, input and output
    length: ids/row_order.py), then the ids (the exact prefix id of a row's last block names its
    whole sequence), then the session. Time first, so a session's turns stay causal; rows equal
    in all of it are alike to a draw."""
    sequence = np.full(len(trace), -1, dtype=np.int64)
    has_ids = trace.lengths > 0
    sequence[has_ids] = prefix[trace.offsets[1:][has_ids] - 1]
    return published_order(
        trace.timestamp, trace.input_length, trace.output_length, sequence, _session_ranks(trace)
    )


def _session_ranks(trace: Trace) -> np.ndarray:
    """Per row, its session's rank among the sessions as hashed (session_text); -1 for none."""
    if trace.session is None:
        return np.full(len(trace), -1, dtype=np.int64)
    texts = sorted({session_text(s) for s in trace.session.tolist() if s is not None})
    rank = {text: i for i, text in enumerate(texts)}
    return np.array(
        [-1 if s is None else rank[session_text(s)] for s in trace.session.tolist()], dtype=np.int64
    )


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
    return shared_length(
        prefix[trace.offsets[row] : trace.offsets[row + 1]],
        prefix[trace.offsets[other] : trace.offsets[other + 1]],
    )
