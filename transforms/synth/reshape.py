"""Reshape a trace's requests (seed 002's knobs) into new rows whose ids stay valid.

Each output row is first built as a sequence of labels, one per output block; ids are then the
exact prefixes of those label sequences (stats.trace_stats.prefix_ids), numbered densely in
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

from dataclasses import dataclass

import numpy as np
from transforms.stats.trace_io import Trace
from transforms.synth.parts import RowParts

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
    """Per source row (file order): its output labels, input length and block ends."""

    labels: list[np.ndarray]
    input_length: np.ndarray  # int64


def _label(prefix: np.ndarray, sub: np.ndarray, copy: int, kind: int) -> np.ndarray:
    return ((((prefix.astype(np.int64) << SUB_BITS) | sub) << COPY_BITS | copy) << 1) | kind


def _rounded(x: np.ndarray | float) -> np.ndarray:
    """Round half up (deterministic, unlike Python's round half to even)."""
    return np.floor(np.asarray(x, dtype=np.float64) + 0.5).astype(np.int64)


def reshape(trace: Trace, parts: RowParts, knobs: Knobs, copies: np.ndarray,
            block_size: int) -> Reshaped:
    """copies: the tree copy of each row (all 0 without a root multiplier)."""
    rows = len(trace)
    labels: list[np.ndarray] = [np.empty(0, np.int64)] * rows
    ends: list[np.ndarray] = [np.empty(0, np.int64)] * rows  # output blocks up to source block j
    input_length = np.zeros(rows, dtype=np.int64)
    lengths = trace.lengths
    for row in parts.order.tolist():
        n = int(lengths[row])
        if n == 0:
            continue
        prefix = parts.prefix[trace.offsets[row]:trace.offsets[row + 1]]
        shared, common = int(parts.shared[row]), int(parts.common[row])
        previous = int(parts.previous_turn[row])
        if previous >= 0 and common > 0 and common >= shared:
            base_end = common  # the previous turn's output up to the common part
            end = ends[previous][:common]
            base = labels[previous][:int(end[-1])]
        else:
            base_end = shared
            end, base = _shared_run(prefix[:shared], knobs.prefix_len_multiplier,
                                    int(copies[row]))
        last = int(parts.last_tokens[row])
        if base_end == n:  # the row ends inside its base: its real last block, if it kept one
            kept_last = len(end) == 1 or (len(end) > 1 and end[-1] > end[-2])
            input_length[row] = ((len(base) - 1) * block_size + (last if kept_last else block_size)
                                 if len(base) else 0)
            labels[row], ends[row] = base, end
            continue
        own_tokens = np.full(n - base_end, block_size, dtype=np.int64)
        own_tokens[-1] = last
        scaled = np.maximum(1, _rounded(np.cumsum(own_tokens) * knobs.prompt_len_multiplier))
        own_end = len(base) + -(-scaled // block_size)
        own_blocks = int(own_end[-1]) - len(base)
        if own_blocks >= 1 << SUB_BITS:
            raise ValueError(f"a request's own part would take {own_blocks:,} blocks: lower "
                             f"--prompt-len-multiplier")
        # Labelled by the row's last prefix, which no other request has (its own run is its).
        own = _label(np.full(own_blocks, prefix[-1]), np.arange(own_blocks), int(copies[row]), 1)
        labels[row] = np.concatenate([base, own])
        ends[row] = np.concatenate([end, own_end])
        input_length[row] = len(base) * block_size + int(scaled[-1])
    return Reshaped(labels, input_length)


def _shared_run(prefix: np.ndarray, multiplier: float, copy: int) -> tuple[np.ndarray, np.ndarray]:
    """(output blocks up to each source block, labels) of a shared run scaled by multiplier."""
    end = _rounded(np.arange(1, len(prefix) + 1) * multiplier)
    counts = np.diff(np.concatenate([[0], end]))
    total = int(end[-1]) if len(end) else 0
    sub = np.arange(total) - np.repeat(end - counts, counts)
    return end, _label(np.repeat(prefix, counts), sub, copy, 0)
