"""The tables of `analyze --engine beam` (and `reuse --engine beam`): each trace file read as a row
table and a block table, blocks split into key shards and made into trace_blocks.Blocks for the
algorithm of key_shards.py, and the per-row measures of a row shard as mergeable histograms.

A prefix's identity across files is a 128-bit chain hash (the local engine numbers prefixes
exactly, but only within the rows it holds); only the warm-up cut needs a global order (a
bucketed rank).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import xxhash

from kvtrace.transforms.ids.dense_ids import split_by
from kvtrace.transforms.read.trace_io import Trace, read_trace
from kvtrace.transforms.stats.histograms import histogram
from kvtrace.transforms.stats.key_shards import Rows, row_measures, row_sums
from kvtrace.transforms.stats.trace_blocks import Blocks, last_block_tokens
from kvtrace.transforms.stats.trace_stats import row_problems, session_counts

ROW = np.dtype([("rowkey", "<i8"), ("ts", "<f8"), ("isl", "<i8"), ("osl", "<i8"), ("n", "<i8")])
BLOCK = np.dtype(
    [
        ("rowkey", "<i8"),
        ("ts", "<f8"),
        ("pos", "<i8"),
        ("id", "<i8"),
        ("parent", "<i8"),
        ("prefix_hi", "<u8"),
        ("prefix_lo", "<u8"),
        ("weight", "<i8"),
    ]
)
LINE_BITS = 40  # rowkey = file index << 40 | line: file order is rowkey order


def rowkeys(trace: Trace) -> np.ndarray:
    return (trace.file_index.astype(np.int64) << LINE_BITS) | trace.line


def chunk_tables(trace: Trace, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and block tables of a trace chunk (rows of one file, in order)."""
    keys = rowkeys(trace)
    lengths = trace.lengths
    rows = np.empty(len(trace), dtype=ROW)
    rows["rowkey"], rows["ts"] = keys, trace.timestamp
    rows["isl"], rows["osl"], rows["n"] = trace.input_length, trace.output_length, lengths
    row = np.repeat(np.arange(len(trace)), lengths)
    position = np.arange(len(trace.ids)) - np.repeat(trace.offsets[:-1], lengths)
    blocks = np.empty(len(trace.ids), dtype=BLOCK)
    blocks["rowkey"], blocks["ts"] = keys[row], trace.timestamp[row]
    blocks["pos"], blocks["id"] = position, trace.ids
    blocks["parent"] = np.where(position > 0, np.roll(trace.ids, 1), -1)
    at_end = position == lengths[row] - 1
    blocks["weight"] = np.where(at_end, last_block_tokens(trace, block_size)[row], block_size)
    blocks["prefix_hi"], blocks["prefix_lo"] = prefix_hashes(trace.ids, trace.offsets)
    return rows, blocks


def prefix_hashes(ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A 128-bit chain hash of hash_ids[:i + 1] per block: a prefix's identity across files
    (trace_stats numbers prefixes exactly, but only within the rows it holds)."""
    out = bytearray()
    data = ids.astype("<i8").tobytes()
    for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        digest = b""
        for at in range(start * 8, end * 8, 8):
            digest = xxhash.xxh3_128_digest(digest + data[at : at + 8])
            out += digest
    words = np.frombuffer(bytes(out), dtype="<u8").reshape(-1, 2)
    return words[:, 0].copy(), words[:, 1].copy()


def shard_blocks(
    tables: list[np.ndarray], id_divisor: int = 1, with_prefix: bool = False
) -> Blocks:
    """One key shard's block tables (one per file, each in file order) as Blocks: every
    occurrence of the shard's keys, in file order, grouped by row. Ids are dense once divided by
    id_divisor (the id shard count); prefixes are numbered when the shard measures them."""
    table = np.concatenate(sorted(tables, key=lambda t: int(t["rowkey"][0])))
    rowkey = table["rowkey"]
    starts = np.flatnonzero(np.concatenate([[True], rowkey[1:] != rowkey[:-1]]))
    offsets = np.append(starts, len(table))
    return Blocks(
        offsets,
        rowkey[starts],
        table["ts"][starts],
        table["pos"].astype(np.int32),
        table["id"],
        dense_prefixes(table) if with_prefix else None,
        parents=table["parent"],
        id_divisor=id_divisor,
    )


def dense_prefixes(table: np.ndarray) -> np.ndarray:
    """A dense id per distinct 128-bit prefix hash."""
    order = np.lexsort((table["prefix_lo"], table["prefix_hi"]))
    hi, lo = table["prefix_hi"][order], table["prefix_lo"][order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    prefix = np.empty(len(order), dtype=np.int32)
    prefix[order] = np.cumsum(new) - 1
    return prefix


@dataclass
class RowShardResult:
    histograms: dict[str, Counter]
    sums: Counter


def row_shard(
    rows: np.ndarray, partials: np.ndarray, block_size: int, warmup_key: tuple[float, int] | None
) -> RowShardResult:
    """One row shard's rows met with every partial about them: histograms and sums."""
    rows = rows[np.argsort(rows["rowkey"])]
    columns = Rows(rows["rowkey"], rows["ts"], rows["isl"], rows["osl"], rows["n"])
    measured = row_measures(columns, partials, block_size, warmup_key)
    return RowShardResult(
        histograms={
            "isl": histogram(rows["isl"]),
            "osl": histogram(rows["osl"]),
            "context": histogram(measured.context),
            "unique_prompt": histogram(rows["isl"] - measured.context),
            "hit_rate": histogram(measured.hit_rate),
            "per_request": histogram(measured.per_request),
        },
        sums=row_sums(columns, measured),
    )


@dataclass(frozen=True)
class FileChunk:
    """One file of the trace: its rows and blocks as tables, and what is known per file."""

    index: int
    rows: np.ndarray
    blocks: np.ndarray
    problems: dict  # row_problems of this file alone
    sessions: Counter
    first_ts: float | None
    last_ts: float | None
    first_line: int


def read_chunk(index: int, files: tuple[str, ...], block_size: int) -> Iterator[FileChunk]:
    """One file of a trace as tables (the unit the Beam engines of analyze and reuse shard),
    read as pinned when the files were listed (files[index] carries its pin: trace_inputs)."""
    trace = read_trace([files[index]])
    trace.file_index[:] = index
    trace.files = list(files)
    rows, blocks = chunk_tables(trace, block_size)
    has_rows = len(trace) > 0
    yield FileChunk(
        index,
        rows,
        blocks,
        row_problems(trace, block_size),
        session_counts(trace),
        float(trace.timestamp[0]) if has_rows else None,
        float(trace.timestamp[-1]) if has_rows else None,
        int(trace.line[0]) if has_rows else 0,
    )


def by_shard(table: np.ndarray, keys: np.ndarray, shards: int) -> Iterator[tuple[int, np.ndarray]]:
    """The table split by key modulo shards: (shard, its rows)."""
    return split_by(table, (keys % shards).astype(np.int64))


def warmup_plan(bucket_sizes: dict[int, int], fraction: float) -> tuple[int, int] | None:
    """(time bucket holding the first row after warm-up, its index within the bucket)."""
    rank = math.floor(fraction * sum(bucket_sizes.values()))
    seen = 0
    for bucket in sorted(bucket_sizes):
        if rank < seen + bucket_sizes[bucket]:
            return bucket, rank - seen
        seen += bucket_sizes[bucket]
    return None


def warmup_key(candidates: list[tuple[float, int]], plan: tuple[int, int] | None) -> tuple | None:
    """The first row after warm-up, of the candidates of its time bucket."""
    return sorted(candidates)[plan[1]] if plan else None
