"""Reshape a trace's requests into new rows whose ids stay valid.

Each output row is first built as a sequence of labels, one per output block; ids are then the
exact prefixes of those label sequences (stats.trace_blocks.prefix_ids), numbered densely in
order of first appearance. So an id always sits at the same position behind the same parent,
and `len(hash_ids) == ceil(input_length / block_size)` holds by construction: lengths are
computed in tokens, and the blocks are cut from them.

- shared run (parts.py): its d-th block becomes the blocks between round((d-1) P) and round(d P)
  (prefix multiplier P), labelled by the source prefix: rows that shared j blocks share
  round(j P);
- history: the previous turn's output blocks covering the shared part: so a turn starts with
  the previous turn's whole (reshaped) input when it did in the source;
- own run: its tokens times Q (prompt multiplier), at least one, in fresh blocks of its own;
- a tree copy (root multiplier K) per session, or per request without one, marks every label:
  copies share no id.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.synth.parts import RowParts

# Label layout, int64: source prefix id (< 2^31) | sub-block (< 2^21) | tree copy (< 2^10) |
# kind (shared 0, own 1).
SUB_BITS, COPY_BITS = 21, 10
MAX_TREE_COPIES = 1 << COPY_BITS


@dataclass(frozen=True)
class Knobs:
    prefix_len_multiplier: float = 1.0
    prompt_len_multiplier: float = 1.0
    prefix_root_multiplier: int = 1


@dataclass(frozen=True)
class Reshaped:
    """Per source row (file order): its output labels and input length."""

    labels: list[np.ndarray]
    input_length: np.ndarray  # int64


# (prefix, sub-block, tree copy, kind) -> one int64 label per output block.
Labeller = Callable[[np.ndarray, np.ndarray, "np.ndarray | int", int], np.ndarray]


def packed_label(
    prefix: np.ndarray, sub: np.ndarray, copy: np.ndarray | int, kind: int
) -> np.ndarray:
    """Exact: dense prefix ids, as the local engine numbers them."""
    return ((((prefix.astype(np.int64) << SUB_BITS) | sub) << COPY_BITS | copy) << 1) | kind


def hashed_label(
    prefix: np.ndarray, sub: np.ndarray, copy: np.ndarray | int, kind: int
) -> np.ndarray:
    """For 64-bit prefix keys (the Beam engine's): the packed fields mixed into the key. Output
    ids are numbered from exact label prefixes, so distinct labels give the same ids as
    packed_label; two labels would merge only if they collided among one node's children."""
    fields = packed_label(np.zeros_like(np.asarray(sub)), sub, copy, kind).astype(np.uint64)
    return mix64(prefix.astype(np.uint64) ^ mix64(fields)).view(np.int64)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64 that spreads every input bit."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _rounded(x: np.ndarray | float) -> np.ndarray:
    """Round half up (deterministic, unlike Python's round half to even)."""
    return np.floor(np.asarray(x, dtype=np.float64) + 0.5).astype(np.int64)


def reshape(
    trace: Trace,
    parts: RowParts,
    knobs: Knobs,
    copies: np.ndarray,
    block_size: int,
    label: Labeller = packed_label,
) -> Reshaped:
    """copies: the tree copy of each row (all 0 without a root multiplier). Rows that do not
    build on a previous turn are reshaped together (numpy over all of them); turns that do are
    then reshaped one by one in causal order, each from its previous turn's output."""
    chained = (parts.previous_turn >= 0) & (parts.common > 0) & (parts.common >= parts.shared)
    labels, input_length = _reshape_unchained(
        trace, parts, knobs, copies, block_size, ~chained, label
    )
    ends: dict[int, np.ndarray] = {}  # output blocks up to each source block, of rows in use
    for row in parts.order[chained[parts.order]].tolist():
        previous = int(parts.previous_turn[row])
        if previous not in ends:
            ends[previous] = _ends(trace, parts, knobs, block_size, previous, label)
        common = int(parts.common[row])
        end = ends[previous][:common]
        base = labels[previous][: int(end[-1])]
        own_end, own, length = _own_run(
            trace, parts, knobs, block_size, row, common, len(base), int(copies[row]), label
        )
        labels[row] = np.concatenate([base, own])
        ends[row] = np.concatenate([end, own_end])
        input_length[row] = length
    return Reshaped(labels, input_length)


def _reshape_unchained(
    trace: Trace,
    parts: RowParts,
    knobs: Knobs,
    copies: np.ndarray,
    block_size: int,
    rows: np.ndarray,
    label: Labeller,
) -> tuple[list[np.ndarray], np.ndarray]:
    """Rows (a mask) reshaped from their own blocks: a shared run, then an own run."""
    n, shared = trace.lengths, parts.shared
    p, q = knobs.prefix_len_multiplier, knobs.prompt_len_multiplier
    position = np.arange(len(trace.ids)) - np.repeat(trace.offsets[:-1], n)
    row_of = np.repeat(np.arange(len(trace)), n)
    in_shared = rows[row_of] & (position < shared[row_of])
    counts = _rounded((position[in_shared] + 1) * p) - _rounded(position[in_shared] * p)
    base_len = np.where(rows, _rounded(shared * p), 0)
    own_blocks_in = np.where(rows, n - shared, 0)
    own_tokens = np.where(
        own_blocks_in > 0, (own_blocks_in - 1) * block_size + parts.last_tokens, 0
    )
    scaled = np.where(own_blocks_in > 0, np.maximum(1, _rounded(own_tokens * q)), 0)
    own_len = -(-scaled // block_size)
    if len(own_len) and own_len.max() >= 1 << SUB_BITS:
        raise ValueError(
            f"a request's own part would take {int(own_len.max()):,} blocks: lower "
            f"--prompt-len-multiplier"
        )
    row_len = base_len + own_len
    starts = np.concatenate([[0], np.cumsum(row_len)])
    flat = np.empty(int(starts[-1]), dtype=np.int64)
    # The shared runs: each source block repeated `counts` times, sub-blocks numbered.
    shared_rows = np.repeat(row_of[in_shared], counts)
    shared_first = np.concatenate([[0], np.cumsum(base_len[rows])])[:-1]
    within = np.arange(len(shared_rows)) - np.repeat(shared_first, base_len[rows])
    sub = np.arange(len(shared_rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    flat[starts[shared_rows] + within] = label(
        np.repeat(parts.prefix[in_shared], counts), sub, copies[shared_rows], 0
    )
    # The own runs: fresh blocks labelled by the row's last prefix, which only it has.
    own_rows = np.repeat(np.arange(len(trace)), own_len)
    k = np.arange(len(own_rows)) - np.repeat(np.cumsum(own_len) - own_len, own_len)
    last_prefix = (
        parts.prefix[np.maximum(trace.offsets[1:] - 1, 0)]
        if len(trace.ids)
        else np.zeros(len(trace), np.int64)
    )
    flat[starts[own_rows] + base_len[own_rows] + k] = label(
        last_prefix[own_rows], k, copies[own_rows], 1
    )
    # Input lengths: own tokens after whole blocks; a row ending inside its shared run keeps
    # its real last block if that block kept an output block of its own.
    kept_last = _rounded(shared * p) > _rounded((shared - 1) * p)
    ends_inside = np.where(kept_last, parts.last_tokens, block_size)
    input_length = np.where(
        own_len > 0,
        base_len * block_size + scaled,
        np.where(base_len > 0, (base_len - 1) * block_size + ends_inside, 0),
    )
    labels = [flat[a:b] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]
    return labels, np.where(rows, input_length, 0)


def _own_run(
    trace: Trace,
    parts: RowParts,
    knobs: Knobs,
    block_size: int,
    row: int,
    base_end: int,
    base_blocks: int,
    copy: int,
    label: Labeller,
) -> tuple[np.ndarray, np.ndarray, int]:
    """(output blocks up to each own source block, own labels, input length) of a row whose
    first base_end source blocks became base_blocks output blocks."""
    own = int(trace.lengths[row]) - base_end
    last = int(parts.last_tokens[row])
    if own == 0:  # the row ends inside its base: its real last block
        return (
            np.empty(0, np.int64),
            np.empty(0, np.int64),
            (base_blocks - 1) * block_size + last if base_blocks else 0,
        )
    own_tokens = np.full(own, block_size, dtype=np.int64)
    own_tokens[-1] = last
    scaled = np.maximum(1, _rounded(np.cumsum(own_tokens) * knobs.prompt_len_multiplier))
    own_end = base_blocks + -(-scaled // block_size)
    blocks = int(own_end[-1]) - base_blocks
    if blocks >= 1 << SUB_BITS:
        raise ValueError(
            f"a request's own part would take {blocks:,} blocks: lower --prompt-len-multiplier"
        )
    prefix = parts.prefix[trace.offsets[row + 1] - 1]
    labels = label(np.full(blocks, prefix), np.arange(blocks), copy, 1)
    return own_end, labels, base_blocks * block_size + int(scaled[-1])


def _ends(
    trace: Trace, parts: RowParts, knobs: Knobs, block_size: int, row: int, label: Labeller
) -> np.ndarray:
    """Output blocks up to each source block of a row reshaped from its own blocks."""
    shared = int(parts.shared[row])
    end = _rounded(np.arange(1, shared + 1) * knobs.prefix_len_multiplier)
    base_blocks = int(end[-1]) if shared else 0
    own_end, _, _ = _own_run(trace, parts, knobs, block_size, row, shared, base_blocks, 0, label)
    return np.concatenate([end, own_end])
