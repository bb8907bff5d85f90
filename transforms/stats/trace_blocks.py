"""A set of trace blocks as columns, in file order and grouped by row: what every statistic that
looks across rows is measured on (key_shards.py). The local engine holds the whole trace as one
such set; the Beam engine one per key shard, holding every occurrence of its keys but only some
blocks of each row (trace_shards.py builds those).

Also the chunked array helpers that keep per-block temporaries small, and the row-level
functions (causal order, exact prefix ids, last-block tokens) the cache, synth and replay stages
share.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from kvtrace.transforms.read.trace_io import Trace

# Per-block temporaries (gathers, comparisons, int64 intermediates) are made this many blocks at
# a time: 1M blocks is 8 MB per int64 temporary, so memory stays near the trace's own
# 4-byte-per-block columns instead of doubling at each step. (At 16M, a 240k-row trace of 7.3M
# blocks was one chunk and analyze peaked at 455 MiB; at 1M, 299 MiB and 8% faster.)
CHUNK_BLOCKS = 1 << 20


@dataclass(frozen=True)
class Blocks:
    """Blocks grouped by row, rows in file order (only rows with a block here)."""

    offsets: np.ndarray  # row r's blocks are [offsets[r], offsets[r + 1])
    row_keys: np.ndarray  # int64 per row, ascending in file order: names the row to the caller
    timestamp: np.ndarray  # float64 per row
    position: np.ndarray  # each block's position in its row (int16 where rows allow, else int32)
    ids: np.ndarray  # each block's hash id
    prefix: (
        np.ndarray | None
    )  # int32: dense id of hash_ids[:position + 1], equal for equal prefixes
    parents: np.ndarray | None = None  # the id before each block, -1 first; None: whole rows here
    id_divisor: int = 1  # ids // id_divisor are dense where a shard holds every id_divisor-th id

    @staticmethod
    def of(trace: Trace) -> Blocks:
        """A whole trace: every row (row keys are row indices), every block."""
        lengths = trace.lengths
        narrow = np.int16 if lengths.max(initial=0) < 2**15 else np.int32
        position = np.empty(len(trace.ids), dtype=narrow)
        blocks = Blocks(
            trace.offsets,
            np.arange(len(trace), dtype=np.int64),
            trace.timestamp,
            position,
            trace.ids,
            prefix_ids(trace),
        )
        for start, end in chunks(len(position)):  # traces hold < 2^31 blocks
            position[start:end] = np.arange(start, end) - trace.offsets[blocks.rows(start, end)]
        return blocks

    @property
    def row_count(self) -> int:
        return len(self.offsets) - 1

    @cached_property
    def _id_groups(self) -> tuple[np.ndarray, np.ndarray]:
        values = self.ids // self.id_divisor if self.id_divisor > 1 else self.ids
        return dense_groups(values)

    @property
    def id_group(self) -> np.ndarray:
        """Dense index of each block's hash id among the distinct ids."""
        return self._id_groups[0]

    @property
    def id_first(self) -> np.ndarray:
        """Per distinct id, the index of its first block (file order)."""
        return self._id_groups[1]

    def rows(self, start: int, end: int) -> np.ndarray:
        """The row of each block in [start, end). Computed, not stored: a row per block would
        be the largest array of a big trace's analysis after the ids."""
        first, last = np.searchsorted(self.offsets, [start, end - 1], "right") - 1
        spans = np.diff(np.clip(self.offsets[first : last + 2], start, end))
        return np.repeat(np.arange(first, last + 1, dtype=np.int32), spans)

    def rows_at(self, index: np.ndarray) -> np.ndarray:
        """The row of each block in index."""
        return (np.searchsorted(self.offsets, index, "right") - 1).astype(np.int32)

    def parent(self, index: np.ndarray) -> np.ndarray:
        """The id before each block in its row, -1 for a row's first block."""
        if self.parents is not None:
            return self.parents[index]
        return np.where(self.position[index] > 0, self.ids[index - 1], -1)

    def causal_rank(self) -> np.ndarray:
        """Each row's rank among these rows in (timestamp, file order)."""
        return causal_rank(self.timestamp, self.row_keys)


def chunks(size: int) -> list[tuple[int, int]]:
    return [(start, min(size, start + CHUNK_BLOCKS)) for start in range(0, size, CHUNK_BLOCKS)]


def first_index(groups: np.ndarray, size: int) -> np.ndarray:
    """Per group value in [0, size), the index of its first occurrence (-1 where absent)."""
    first = np.full(size, -1, dtype=np.int32)  # traces hold < 2^31 blocks
    # Written backwards, so the earliest occurrence is the last write and wins.
    for start, end in reversed(chunks(len(groups))):
        first[groups[start:end][::-1]] = np.arange(end - 1, start - 1, -1, dtype=np.int32)
    return first


def last_index(groups: np.ndarray, size: int) -> np.ndarray:
    """Per group value in [0, size), the index of its last occurrence (-1 where absent)."""
    last = np.full(size, -1, dtype=np.int32)
    for start, end in chunks(len(groups)):  # forwards: the latest write wins
        last[groups[start:end]] = np.arange(start, end, dtype=np.int32)
    return last


def gathered(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """table[index], gathered chunk by chunk (numpy widens a whole int32 index to int64 first)."""
    out = np.empty(len(index), dtype=table.dtype)
    for start, end in chunks(len(index)):
        out[start:end] = table[index[start:end]]
    return out


def gathered_compare(
    table: np.ndarray, index: np.ndarray, other: np.ndarray, compare
) -> np.ndarray:
    """compare(table[index], other) as a bool array, built chunk by chunk."""
    out = np.empty(len(index), dtype=bool)
    for start, end in chunks(len(index)):
        out[start:end] = compare(table[index[start:end]], other[start:end])
    return out


def dense_groups(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group of each value, first index of each group). Trace ids are usually dense from 0, so
    the values themselves serve as groups without sorting; sparse ids are numbered by sorting."""
    if len(values) and values.min() >= 0 and values.max() < 4 * len(values):
        return values, first_index(values, int(values.max()) + 1)
    _, first, groups = np.unique(values, return_index=True, return_inverse=True)
    return groups, first


def prefix_ids(trace: Trace) -> np.ndarray:
    """A dense id per block for the prefix it ends, exact (no hashing): level by level, each
    (parent prefix, id) pair is numbered by sorting."""
    lengths = trace.lengths
    prefix = np.empty(len(trace.ids), dtype=np.int32)
    by_length = np.argsort(-lengths, kind="stable")
    # rows with more than `level` ids: a prefix of by_length
    active_counts = np.searchsorted(-lengths[by_length], -np.arange(lengths.max(initial=0)), "left")
    next_id, parents = 0, None
    for level, active in enumerate(active_counts):
        rows = by_length[:active]
        at = trace.offsets[rows] + level
        values = trace.ids[at]
        parent = parents[:active] if parents is not None else np.zeros(active, np.int64)
        order = np.lexsort((values, parent))
        new = np.ones(active, dtype=bool)
        new[1:] = (np.diff(parent[order]) != 0) | (np.diff(values[order]) != 0)
        numbered = np.empty(active, dtype=np.int64)
        numbered[order] = next_id + np.cumsum(new) - 1
        next_id += int(new.sum())
        prefix[at] = numbered
        parents = numbered
    return prefix


def causal_rank(timestamp: np.ndarray, file_order: np.ndarray) -> np.ndarray:
    """Each row's rank in (timestamp, file order)."""
    order = np.lexsort((file_order, timestamp))
    rank = np.empty(len(timestamp), dtype=np.int64)
    rank[order] = np.arange(len(timestamp))
    return rank


def causal_order(trace: Trace) -> np.ndarray:
    """Each row of a trace's rank in (timestamp, file order)."""
    return causal_rank(trace.timestamp, np.arange(len(trace)))


def last_tokens(input_length: np.ndarray, lengths: np.ndarray, block_size: int) -> np.ndarray:
    """Per row, the tokens in its last block: the real remainder (clipped to 1..block_size for
    rows whose length disagrees with their ids); 0 for rows without ids."""
    last = np.clip(input_length - (lengths - 1) * block_size, 1, block_size)
    return np.where(lengths > 0, last, 0)


def last_block_tokens(trace: Trace, block_size: int) -> np.ndarray:
    return last_tokens(trace.input_length, trace.lengths, block_size)


def covered_tokens(input_length: np.ndarray, lengths: np.ndarray, block_size: int) -> np.ndarray:
    """Per row, the tokens its blocks cover: full blocks plus the real last block."""
    full = np.where(lengths > 0, (lengths - 1) * block_size, 0)
    return full + last_tokens(input_length, lengths, block_size)
