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
# prefix_ids compares and lists blocks with ~10 int64 temporaries each: an eighth of a chunk at
# a time keeps them near one chunk's int64 temporary (7.3M blocks: 68 MiB at a chunk, 22 at this).
PREFIX_STEP_BLOCKS = CHUNK_BLOCKS >> 3


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
    """A dense id per block for the prefix it ends, exact (no hashing), numbered breadth first:
    by length, then prefixes of one length in their order as id sequences. Linear in the blocks
    once the rows are sorted, whatever the rows' lengths (one pass per position of the longest
    row cost 28 s for one row of 1M ids): with rows sorted as id sequences, a block ends a prefix
    no earlier row ends exactly where its row has left the row before it, and one stable sort
    of all blocks by position lists each length's prefixes in order."""
    order = rows_in_sequence_order(trace.ids, trace.offsets)
    return _numbered_breadth_first(trace.offsets, order, _shared_lengths(trace, order))


def rows_in_sequence_order(ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Row indices sorted by their ids as sequences (a row before every longer row it begins),
    ties in file order. Each row is compared as bytes, ids written big-endian unsigned so byte
    order is the ids' order: Python's sort, one memcmp per comparison."""
    if len(ids) == 0:
        return np.arange(len(offsets) - 1, dtype=np.int64)
    low = int(ids.min())
    as_bytes = np.dtype(">u8" if int(ids.max()) - low >= 2**32 else ">u4")
    rows: list[bytes] = []
    first = 0
    while first < len(offsets) - 1:  # rows of about a chunk of ids at a time, at least one
        last = max(first + 1, int(np.searchsorted(offsets, offsets[first] + CHUNK_BLOCKS)) - 1)
        text = (ids[offsets[first] : offsets[last]] - low).astype(as_bytes).tobytes()
        bounds = ((offsets[first : last + 1] - offsets[first]) * as_bytes.itemsize).tolist()
        rows.extend(text[start:end] for start, end in zip(bounds[:-1], bounds[1:]))
        first = last
    return np.array(sorted(range(len(rows)), key=rows.__getitem__), dtype=np.int64)


def _shared_lengths(trace: Trace, order: np.ndarray) -> np.ndarray:
    """Per row in order, how many leading ids it shares with the row before it (0 first).
    Each pair compares its shorter row's length of ids, so all pairs compare at most every
    block once, a chunk of pairs at a time."""
    lengths = trace.lengths
    before, after = order[:-1], order[1:]
    span = np.minimum(lengths[before], lengths[after])
    shared = np.zeros(len(order), dtype=np.int64)
    ends = np.cumsum(span)
    pair = 0
    while pair < len(span):  # pairs spanning PREFIX_STEP_BLOCKS ids at a time, at least one
        last = max(
            pair + 1, int(np.searchsorted(ends, ends[pair] - span[pair] + PREFIX_STEP_BLOCKS))
        )
        shared[pair + 1 : last + 1] = _first_differences(
            trace, before[pair:last], after[pair:last], span[pair:last]
        )
        pair = last
    return shared


def _first_differences(
    trace: Trace, before: np.ndarray, after: np.ndarray, span: np.ndarray
) -> np.ndarray:
    """Per pair of rows, the first position in span where their ids differ (span if none)."""
    starts = np.cumsum(span) - span
    step = np.arange(int(span.sum())) - np.repeat(starts, span)
    differ = np.flatnonzero(
        trace.ids[np.repeat(trace.offsets[before], span) + step]
        != trace.ids[np.repeat(trace.offsets[after], span) + step]
    )
    first = span.copy()
    pairs, at = np.unique(np.searchsorted(starts, differ, "right") - 1, return_index=True)
    first[pairs] = differ[at] - starts[pairs]
    return first


def _numbered_breadth_first(
    offsets: np.ndarray, order: np.ndarray, shared: np.ndarray
) -> np.ndarray:
    """Each block's prefix id. A block past its row's shared length ends a new prefix; blocks
    listed by position, rows in order within one, a running count of new prefixes numbers
    every block (a shared one as the row before it). Listed a band of positions at a time,
    PREFIX_STEP_BLOCKS blocks each (or one position's)."""
    lengths = np.diff(offsets)[order]
    reaching = len(order) - np.cumsum(np.bincount(lengths, minlength=1))[:-1]  # per position
    band = (np.cumsum(reaching) - reaching) // PREFIX_STEP_BLOCKS  # of each position's first
    cuts = [*np.flatnonzero(np.diff(band, prepend=-1)).tolist(), len(reaching)]
    longest_first = np.argsort(-lengths, kind="stable")
    prefix = np.empty(int(offsets[-1]), dtype=np.int32)  # traces hold < 2^31 blocks
    count = 0
    for low, high in zip(cuts[:-1], cuts[1:]):
        rows = np.sort(longest_first[: reaching[low]])  # the rows reaching low, in order
        width = np.minimum(lengths[rows], high) - low
        starts = np.cumsum(width) - width
        step = np.arange(int(width.sum())) - np.repeat(starts, width)
        narrow = np.int16 if high - low < 2**15 else np.int32  # int16 sorts by radix
        listed = np.argsort(step.astype(narrow), kind="stable")
        row = np.repeat(rows, width)[listed]
        position = low + step[listed]
        new = position >= shared[row]
        prefix[offsets[order[row]] + position] = count + np.cumsum(new) - 1
        count += int(np.count_nonzero(new))
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
