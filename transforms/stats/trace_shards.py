"""Statistics shard by shard, for `analyze --engine beam` (its steps: steps.py): the measures of
trace_stats, computed shard by shard.

Every metric that looks across rows reduces to "per key, the first or the count of its
occurrences" for one of three keys: the hash id (seen sets, chaining checks), the (position, id)
pair (context length) and the prefix (reuse and causal hit rates). Blocks go to shards of each key;
each shard emits small per-row partials, which meet their rows in row shards. Nothing needs every
block in one place, and only the warm-up cut needs a global order (a bucketed rank).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import xxhash

from transforms.stats.histograms import histogram
from transforms.read.trace_io import Trace
from transforms.ids.dense_ids import split_by
from transforms.read.trace_io import read_trace
from transforms.stats.trace_stats import (last_block_tokens, row_problems,
                                          session_counts)

ROW = np.dtype([("rowkey", "<i8"), ("ts", "<f8"), ("isl", "<i8"), ("osl", "<i8"), ("n", "<i8")])
BLOCK = np.dtype([("rowkey", "<i8"), ("ts", "<f8"), ("pos", "<i8"), ("id", "<i8"),
                  ("parent", "<i8"), ("prefix_hi", "<u8"), ("prefix_lo", "<u8"),
                  ("weight", "<i8")])
PARTIAL = np.dtype([("rowkey", "<i8"), ("unseen_pos", "<i8"), ("singles", "<i8"),
                    ("misses", "<i8"), ("miss_tokens", "<i8")])
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


def _first_rows(keys: tuple[np.ndarray, ...], order_by: tuple[np.ndarray, ...]) -> np.ndarray:
    """Indices of each distinct key's smallest occurrence by order_by."""
    order = np.lexsort((*reversed(order_by), *reversed(keys)))
    changed = np.zeros(len(order), dtype=bool)
    changed[:1] = True
    for key in keys:
        sorted_key = key[order]
        changed[1:] |= sorted_key[1:] != sorted_key[:-1]
    return order[changed]


def _partials(rowkeys_: np.ndarray, **columns: np.ndarray) -> np.ndarray:
    table = np.zeros(len(rowkeys_), dtype=PARTIAL)
    table["rowkey"] = rowkeys_
    table["unseen_pos"] = -1
    for name, values in columns.items():
        table[name] = values
    return table


@dataclass
class ShardResult:
    """What one key shard contributes: per-row partials, and whole-trace counts."""

    partials: np.ndarray
    counts: Counter = field(default_factory=Counter)
    problem_ids: dict = field(default_factory=dict)


def id_shard(blocks: np.ndarray) -> ShardResult:
    """Seen sets (aiperf's hit rate), prefix groups and chaining checks, for one id shard."""
    first = _first_rows((blocks["id"],), (blocks["rowkey"], blocks["pos"]))
    partials = _partials(blocks["rowkey"][first], unseen_pos=blocks["pos"][first])
    starts = blocks[blocks["pos"] == 0]
    _, per_first_id = np.unique(starts["id"], return_counts=True)
    problems = {}
    for name, attribute in (("ids_at_several_positions", "pos"),
                            ("ids_behind_several_parents", "parent")):
        pairs = _first_rows((blocks["id"], blocks[attribute]), (blocks["rowkey"],))
        ids, counts = np.unique(blocks["id"][pairs], return_counts=True)
        problems[name] = ids[counts > 1].tolist()
    return ShardResult(partials, Counter(num_prefix_groups=int((per_first_id >= 2).sum())),
                       problems)


def pair_shard(blocks: np.ndarray) -> ShardResult:
    """(position, id) pairs seen once: each is a block of one row that is not repeated."""
    order = np.lexsort((blocks["id"], blocks["pos"]))
    pos, ids = blocks["pos"][order], blocks["id"][order]
    start = np.ones(len(order), dtype=bool)
    start[1:] = (pos[1:] != pos[:-1]) | (ids[1:] != ids[:-1])
    group = np.cumsum(start) - 1
    single = np.bincount(group)[group] == 1
    return ShardResult(_partials(blocks["rowkey"][order][single], singles=1))


def prefix_shard(blocks: np.ndarray) -> ShardResult:
    """Prefix reuse, and each prefix's first occurrence in (timestamp, file order): a miss."""
    keys = (blocks["prefix_hi"], blocks["prefix_lo"])
    first = _first_rows(keys, (blocks["ts"], blocks["rowkey"]))
    order = np.lexsort((blocks["prefix_lo"], blocks["prefix_hi"]))
    hi, lo = blocks["prefix_hi"][order], blocks["prefix_lo"][order]
    start = np.ones(len(order), dtype=bool)
    start[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    counts = np.bincount(np.cumsum(start) - 1)
    partials = _partials(blocks["rowkey"][first], misses=1, miss_tokens=blocks["weight"][first])
    return ShardResult(partials, Counter(unique_prefixes=int(len(counts)),
                                         reused_occurrences=int(counts[counts > 1].sum()),
                                         occurrences=int(counts.sum())))


@dataclass
class RowShardResult:
    histograms: dict[str, Counter]
    sums: Counter


def row_shard(rows: np.ndarray, partials: np.ndarray, block_size: int,
              warmup_key: tuple[float, int] | None) -> RowShardResult:
    """Per-row metrics for one row shard, from its rows and every partial about them."""
    order = np.argsort(rows["rowkey"])
    rows = rows[order]
    index = np.searchsorted(rows["rowkey"], partials["rowkey"])
    n = rows["n"]
    unseen = n.copy()
    has_unseen = partials["unseen_pos"] >= 0
    np.minimum.at(unseen, index[has_unseen], partials["unseen_pos"][has_unseen])
    singles = np.bincount(index, weights=partials["singles"], minlength=len(rows))
    misses = np.bincount(index, weights=partials["misses"], minlength=len(rows))
    miss_tokens = np.bincount(index, weights=partials["miss_tokens"], minlength=len(rows))
    with_ids = n > 0
    repeated = n - singles.astype(np.int64)
    context = np.where(repeated == n, rows["isl"], repeated * block_size)
    # As trace_stats.row_tokens: full blocks, and the real remainder in the last one.
    last = np.clip(rows["isl"] - (n - 1) * block_size, 1, block_size)
    tokens = np.where(with_ids, (n - 1) * block_size + last, 0)
    if warmup_key is None:
        after = np.ones(len(rows), dtype=bool)
    else:
        after = (rows["ts"] > warmup_key[0]) | ((rows["ts"] == warmup_key[0]) & (rows["rowkey"] >= warmup_key[1]))
    sums = Counter(
        rows=len(rows), blocks=int(n.sum()), misses=int(misses.sum()),
        tokens=int(tokens.sum()), miss_tokens=int(miss_tokens.sum()),
        tokens_after=int(tokens[after].sum()), miss_tokens_after=int(miss_tokens[after].sum()),
        rows_with_ids=int(with_ids.sum()),
    )
    per_request = 1 - misses[with_ids] / n[with_ids]
    return RowShardResult(
        histograms={
            "isl": histogram(rows["isl"]), "osl": histogram(rows["osl"]),
            "context": histogram(context), "unique_prompt": histogram(rows["isl"] - context),
            "hit_rate": histogram(unseen[with_ids] / n[with_ids]),
            "per_request": histogram(per_request),
        },
        sums=sums,
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


def read_chunk(indexed: tuple[int, str], files: tuple[str, ...], block_size: int) -> Iterator[FileChunk]:
    """One file of a trace as tables (the unit the Beam engines of analyze and reuse shard)."""
    index, path = indexed
    trace = read_trace([path])
    trace.file_index[:] = index
    trace.files = list(files)
    rows, blocks = chunk_tables(trace, block_size)
    has_rows = len(trace) > 0
    yield FileChunk(
        index, rows, blocks, row_problems(trace, block_size), session_counts(trace),
        float(trace.timestamp[0]) if has_rows else None,
        float(trace.timestamp[-1]) if has_rows else None,
        int(trace.line[0]) if has_rows else 0,
    )


def by_shard(table: np.ndarray, keys: np.ndarray, shards: int) -> Iterator[tuple[int, np.ndarray]]:
    """The table split by key modulo shards: (shard, its rows)."""
    return split_by(table, (keys % shards).astype(np.int64))


def pair_key(blocks: np.ndarray) -> np.ndarray:
    """A (position, id) pair's shard key."""
    return blocks["id"].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + blocks["pos"].astype(np.uint64)


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
