"""`kvtrace simulate --decode-cache`: a trace whose rows carry output_hash_ids (anonymize
--emit-output-hashes) replayed with the blocks each request leaves in the cache after decoding.

Each request is followed, at its own time, by an output row: its prompt's full blocks and its
output blocks (the prompt's partial block completed by generated tokens, and the full blocks
after it). The output row's blocks weigh 0 tokens: they enter the cache (taking pages like any
block) and refresh the prompt's, but count neither as hits nor as tokens; a later turn whose
prompt repeats them hits them as it would hit any cached block.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from kvtrace.transforms.cache.cache_trace import CacheTrace
from kvtrace.transforms.read.json_tree import containers_over
from kvtrace.transforms.read.paths import lines_within, read_parquet_within
from kvtrace.transforms.read.trace_io import (
    MAX_ROW_CONTAINERS,
    MAX_TRACE_LINE_BYTES,
    PARQUET_SUFFIXES,
    Trace,
)
from kvtrace.transforms.trace_format import OUTPUT_IDS_FIELD


def read_output_ids(files: Sequence[str], trace: Trace) -> list[list[int]]:
    """Each trace row's output_hash_ids (file order), [] where a row has none."""
    by_line: dict[tuple[int, int], list[int]] = {}
    for index, path in enumerate(files):
        for line, ids in _output_ids(path):
            by_line[(index, line)] = ids
    if not by_line:
        raise ValueError(
            f"no {OUTPUT_IDS_FIELD} in the trace: make it with kvtrace anonymize "
            f"--emit-output-hashes"
        )
    return [by_line.get((int(f), int(n)), []) for f, n in zip(trace.file_index, trace.line)]


def _output_ids(path: str):
    if path.lower().endswith(PARQUET_SUFFIXES):
        try:
            table, numbers, _ = read_parquet_within(path, MAX_TRACE_LINE_BYTES, (OUTPUT_IDS_FIELD,))
        except (OSError, ValueError, pa.ArrowException):
            return  # a file the trace reader cannot read either: it reports it, no row is read
        if OUTPUT_IDS_FIELD in table.column_names:
            yield from zip(numbers.tolist(), table.column(OUTPUT_IDS_FIELD).to_pylist())
        return
    for line, raw in enumerate(lines_within(path, MAX_TRACE_LINE_BYTES), 1):
        # A line of more containers than a row holds is malformed to the trace reader too.
        if OUTPUT_IDS_FIELD.encode() in raw and containers_over(raw, MAX_ROW_CONTAINERS) is None:
            try:
                ids = json.loads(raw).get(OUTPUT_IDS_FIELD)
            except (ValueError, AttributeError):
                continue
            if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
                yield line, ids


def with_decode_cache(trace: Trace, output_ids: list[list[int]], block_size: int) -> CacheTrace:
    """The cache's view of the trace with an output row after every request."""
    rows = len(trace)
    full = np.minimum(trace.input_length // block_size, trace.lengths)
    out_lengths = full + np.array([len(o) for o in output_ids], dtype=np.int64)
    lengths = np.empty(2 * rows, dtype=np.int64)
    lengths[0::2], lengths[1::2] = trace.lengths, out_lengths
    offsets = np.zeros(2 * rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.empty(int(offsets[-1]), dtype=np.int64)
    for row in range(rows):
        start, end = int(trace.offsets[row]), int(trace.offsets[row + 1])
        prompt_at, out_at = int(offsets[2 * row]), int(offsets[2 * row + 1])
        ids[prompt_at : prompt_at + end - start] = trace.ids[start:end]
        ids[out_at : out_at + full[row]] = trace.ids[start : start + full[row]]
        ids[out_at + full[row] : int(offsets[2 * row + 2])] = output_ids[row]
    interleaved = Trace(
        np.repeat(trace.timestamp, 2),
        np.ravel(np.column_stack([trace.input_length, out_lengths * block_size])),
        np.repeat(trace.output_length, 2),
        offsets,
        ids,
        None,
        np.repeat(trace.line, 2),
        np.repeat(trace.file_index, 2),
        trace.files,
    )
    cache = CacheTrace.of(interleaved, block_size)
    # Causal order keeps each output row right after its request (same time, next in file order).
    is_output = np.repeat(np.arange(cache.rows) % 2 == 1, np.diff(cache.row_starts))
    cache.tokens[is_output] = 0
    return cache
