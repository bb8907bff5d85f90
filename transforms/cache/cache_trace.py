"""A trace as a cache sees it: every block occurrence in causal order, with its real size.

Causal order is timestamp, then file order (as `analyze`'s cache-sizing rates). A block is its
exact prefix (stats.trace_blocks.prefix_ids): two occurrences are the same cache entry only when
every block before them matches too, as in a serving engine's chained block hashes, whatever
the trace's own ids do. Within one request a prefix occurs once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvtrace.transforms.read.trace_io import Trace, read_trace
from kvtrace.transforms.stats.trace_blocks import causal_order, last_block_tokens, prefix_ids

_LOG = logging.getLogger("kvtrace")


@dataclass(frozen=True)
class CacheTrace:
    block: np.ndarray  # int32: dense prefix id of each block occurrence, rows in causal order
    tokens: np.ndarray  # int32: the occurrence's real tokens (the last block of a row: its rest)
    row_starts: np.ndarray  # int64, rows + 1: row r's blocks are [row_starts[r], row_starts[r+1])
    timestamp_ms: np.ndarray  # float64 per row, causal order
    input_length: np.ndarray  # int64 per row, causal order
    output_length: np.ndarray  # int64 per row, causal order
    block_size: int

    @property
    def rows(self) -> int:
        return len(self.row_starts) - 1

    @property
    def distinct_blocks(self) -> int:
        return int(self.block.max(initial=-1)) + 1

    def row_of_block(self) -> np.ndarray:
        return np.repeat(np.arange(self.rows, dtype=np.int32), np.diff(self.row_starts))

    @staticmethod
    def of(trace: Trace, block_size: int) -> CacheTrace:
        order = causal_rows(trace)
        lengths = trace.lengths[order]
        row_starts = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(lengths, out=row_starts[1:])
        # Block i of the causal sequence is file block offsets[row] + (i - row_starts[row]).
        source = np.repeat(trace.offsets[:-1][order] - row_starts[:-1], lengths)
        source += np.arange(len(source), dtype=np.int64)
        prefix = prefix_ids(trace)
        tokens = np.full(len(source), block_size, dtype=np.int32)
        has_blocks = lengths > 0
        tokens[row_starts[1:][has_blocks] - 1] = last_block_tokens(trace, block_size)[order][
            has_blocks
        ]
        return CacheTrace(
            prefix[source],
            tokens,
            row_starts,
            trace.timestamp[order],
            trace.input_length[order],
            trace.output_length[order],
            block_size,
        )


def causal_rows(trace: Trace) -> np.ndarray:
    """The trace's rows (their indices in file order) in causal order."""
    return np.argsort(causal_order(trace), kind="stable")


def read_cache_trace(files: Sequence[str], block_size: int) -> tuple[Trace, CacheTrace]:
    """The trace as read (for its statistics and malformed lines) and as a cache sees it."""
    started = time.perf_counter()
    trace = read_trace(files)
    cache = CacheTrace.of(trace, block_size)
    _LOG.info(
        "read %d rows, %d blocks (%d distinct prefixes) in %.1f s",
        cache.rows,
        len(cache.block),
        cache.distinct_blocks,
        time.perf_counter() - started,
    )
    return trace, cache
