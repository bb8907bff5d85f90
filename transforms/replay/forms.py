"""The forms replayers read a trace in, made from its columns (pure numpy, no I/O).

- whole rows: each row its request's whole prompt, as kvtrace publishes it;
- turns: a conversation's rows in order, each follow-up turn with its `delay`, the ms the
  user took after the previous turn's response ended (think or tool time);
- deltas: follow-up turns as what they add to the previous turn's prompt and answer, the form
  replayers that rebuild a conversation's history themselves read;
- re-cut blocks: hash ids for another block size, for a replayer whose block size is fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.trace_format import NO_PARENT, NO_RESPONSE_MS

NO_TURN = -1


@dataclass(frozen=True)
class Turns:
    """Each row's place in its conversation: rows without a session stand alone."""

    previous: np.ndarray  # int64 per row: the conversation's previous row, or NO_TURN
    # int64 per row: the wait after the previous turn's response ended, or NO_TURN; where the
    # logs did not give that end, the gap between the two arrivals (response time included)
    delay_ms: np.ndarray


def turns(trace: Trace) -> Turns:
    previous = np.full(len(trace), NO_TURN, dtype=np.int64)
    delay = np.full(len(trace), NO_TURN, dtype=np.int64)
    if trace.session is None or not len(trace):
        return Turns(previous, delay)
    rows = np.flatnonzero(np.array([s is not None for s in trace.session], dtype=bool))
    names = np.array([str(s) for s in trace.session[rows]], dtype=object)
    _, conversation = np.unique(names, return_inverse=True)
    by_turn = np.lexsort((rows, trace.timestamp[rows], conversation))
    order, grouped = rows[by_turn], conversation[by_turn]
    follows = np.flatnonzero(grouped[1:] == grouped[:-1]) + 1
    later, earlier = order[follows], order[follows - 1]
    previous[later] = earlier
    delay[later] = _waits(trace, later, earlier)
    return Turns(previous, delay)


def linked_turns(trace: Trace) -> Turns:
    """turns, where a row's parent_row (the request it continues, anonymize --emit-parents)
    stands for its conversation's previous row: two rows continuing one request are two
    branches from it, and a row continuing a request of another conversation (a subagent's
    first, or a tool result's) waits on that request."""
    chain = turns(trace)
    parent = trace.parents()
    later = np.flatnonzero(parent != NO_PARENT)
    if not len(later):
        return chain
    previous, delay = chain.previous.copy(), chain.delay_ms.copy()
    previous[later] = parent[later]
    delay[later] = _waits(trace, later, parent[later])
    return Turns(previous, delay)


def _waits(trace: Trace, later: np.ndarray, earlier: np.ndarray) -> np.ndarray:
    """The ms each later row waited after its earlier row's response ended; where the logs did
    not give that end, the gap between the two arrivals."""
    gap = np.rint(trace.timestamp[later] - trace.timestamp[earlier]).astype(np.int64)
    response = trace.response_ends()[earlier]
    return np.where(response != NO_RESPONSE_MS, np.maximum(gap - response, 0), gap)


@dataclass(frozen=True)
class Deltas:
    """Per row: what it adds to its conversation (whole rows where it cannot be said so)."""

    input_length: np.ndarray  # int64
    offsets: np.ndarray  # int64, rows + 1, into ids
    ids: np.ndarray  # int64
    starts_conversation: np.ndarray  # bool: sent whole, at its timestamp
    # follow-up turns whose prompt is shorter than the previous prompt plus its answer (the
    # template dropped earlier reasoning, or the client cut the history): sent whole, as the
    # first turn of a new conversation
    restarted: int


def deltas(trace: Trace, chain: Turns, block_size: int) -> Deltas:
    """A follow-up turn adds input_length - (previous input_length + previous output_length)
    tokens; its ids are the last ceil(added / block_size) of its own, which name those tokens'
    blocks (equal ids, equal tokens)."""
    previous = chain.previous
    follow = previous != NO_TURN
    added = np.zeros(len(trace), dtype=np.int64)
    added[follow] = (
        trace.input_length[follow]
        - trace.input_length[previous[follow]]
        - trace.output_length[previous[follow]]
    )
    as_delta = follow & (added >= 1)
    lengths = np.diff(trace.offsets)
    kept = np.where(as_delta, -(-added // block_size), lengths)
    kept = np.minimum(kept, lengths)
    offsets = np.zeros(len(trace) + 1, dtype=np.int64)
    np.cumsum(kept, out=offsets[1:])
    first = np.repeat(trace.offsets[1:] - kept, kept)
    within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], kept)
    return Deltas(
        np.where(as_delta, added, trace.input_length),
        offsets,
        trace.ids[first + within].astype(np.int64),
        ~as_delta,
        int(np.count_nonzero(follow & ~as_delta)),
    )


def json_number(value: float) -> int | float:
    """A time as JSON writes it: whole ms as integers (published traces hold only those)."""
    return int(value) if float(value).is_integer() else float(value)


def recut_blocks(trace: Trace, block_size: int, new_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, ids) for blocks of new_size tokens, new_size a multiple or a divisor of
    block_size. A new block is named by the old block holding its last token (and, cut finer,
    its place in it), renumbered densely in order of first appearance: equal prefixes still get
    equal ids. Cut finer, two prompts that part inside an old block part at its start."""
    if new_size % block_size and block_size % new_size:
        raise ValueError(
            f"block size {block_size} is neither a multiple nor a divisor of {new_size}"
        )
    lengths = np.diff(trace.offsets)
    blocks = -(-trace.input_length // block_size)
    if np.any(blocks != lengths):
        row = int(np.flatnonzero(blocks != lengths)[0])
        raise ValueError(
            f"row {row + 1} has {lengths[row]} hash ids for {trace.input_length[row]}"
            f" tokens: not ceil(input_length / {block_size})"
        )
    count = -(-trace.input_length // new_size)
    offsets = np.zeros(len(trace) + 1, dtype=np.int64)
    np.cumsum(count, out=offsets[1:])
    row = np.repeat(np.arange(len(trace)), count)
    j = np.arange(offsets[-1]) - offsets[:-1][row]
    last_token = np.minimum((j + 1) * new_size, trace.input_length[row]) - 1
    old = trace.ids[trace.offsets[:-1][row] + last_token // block_size].astype(np.int64)
    parts = max(block_size // new_size, 1)
    key = old * parts + (last_token % block_size) // new_size
    unique, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    rank = np.empty(len(unique), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(unique))
    return offsets, rank[inverse]
