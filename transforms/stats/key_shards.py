"""The measures of `kvtrace analyze`, as one algorithm over key shards (both engines run it).

Every metric that looks across rows reduces to "per key, the first or the last of its
occurrences" for one of two keys:
- the hash id: aiperf's seen sets, the (position, id) pairs of context length (all pairs of an id
  live with it), rows starting with an id (prefix groups), chaining checks;
- the prefix: reuse, and each prefix's first occurrence in causal order (a miss).
A key shard (trace_blocks.Blocks: every occurrence of its keys, in file order) yields per-row
partials and whole-trace counts; row_measures meets each row with every partial about it. The
local engine runs one id shard, one prefix shard and one row shard over the whole trace; the Beam
engine runs N of each (stats/steps.py).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from kvtrace.transforms.stats.trace_blocks import (
    Blocks,
    chunks,
    covered_tokens,
    first_index,
    gathered,
    gathered_compare,
    last_index,
    last_tokens,
)

# Per row, what one key shard found about it. unseen_pos: the row's first block whose id no
# earlier row has (-1: none here); repeated: its blocks whose (position, id) pair occurs twice or
# more in the trace; misses: its blocks whose prefix first occurs there in causal order.
PARTIAL = np.dtype(
    [("rowkey", "<i8"), ("unseen_pos", "<i8"), ("repeated", "<i8"), ("misses", "<i8")]
)
CHAINING_PROBLEMS = ("ids_at_several_positions", "ids_behind_several_parents")


@dataclass
class ShardResult:
    """What one key shard contributes: per-row partials, whole-trace counts and problem ids."""

    partials: np.ndarray  # PARTIAL
    counts: Counter = field(default_factory=Counter)
    problem_ids: dict[str, np.ndarray] = field(default_factory=dict)


def _partials(blocks: Blocks, **columns: np.ndarray) -> np.ndarray:
    table = np.zeros(blocks.row_count, dtype=PARTIAL)
    table["rowkey"], table["unseen_pos"] = blocks.row_keys, -1
    for name, values in columns.items():
        table[name] = values
    return table


def id_shard(blocks: Blocks) -> ShardResult:
    """Seen sets (aiperf's hit rate), repeated (position, id) pairs (context length), prefix
    groups and chaining checks, for blocks holding every occurrence of their ids."""
    starts = blocks.ids[blocks.position == 0]
    _, per_first_id = np.unique(starts, return_counts=True)
    return ShardResult(
        _partials(blocks, unseen_pos=_first_unseen(blocks), repeated=_repeated_per_row(blocks)),
        Counter(num_prefix_groups=int((per_first_id >= 2).sum())),
        chaining_problems(blocks),
    )


def _first_unseen(blocks: Blocks) -> np.ndarray:
    """Per row, the position of its first block whose id no earlier row (file order) has, or -1."""
    first_row = np.concatenate(
        [np.zeros(0, np.int32)]
        + [
            blocks.rows_at(blocks.id_first[start:end])
            for start, end in chunks(len(blocks.id_first))
        ]
    )
    result = np.full(blocks.row_count, -1, dtype=np.int64)
    done = np.zeros(blocks.row_count, dtype=bool)
    for start, end in chunks(len(blocks.id_group)):  # in block order: a row's earlier chunk wins
        rows = blocks.rows(start, end)
        flagged = np.flatnonzero(first_row[blocks.id_group[start:end]] >= rows) + start
        flagged_rows, first = np.unique(rows[flagged - start], return_index=True)
        new = ~done[flagged_rows]
        result[flagged_rows[new]] = blocks.position[flagged[first[new]]]
        done[flagged_rows] = True
    return result


def _repeated_per_row(blocks: Blocks) -> np.ndarray:
    """Per row, its blocks whose (position, id) pair occurs twice or more. An id that keeps one
    position (every chained trace) has as many pairs as occurrences; others are counted by
    sorting. An id occurs twice or more exactly when its first and last occurrences differ (a
    count per id would convert every block's group to int64 first: 2.4 GB at 305M blocks)."""
    group, first = blocks.id_group, blocks.id_first
    repeated = gathered(first != last_index(group, len(first)), group)
    moved = gathered_compare(blocks.position[first], group, blocks.position, np.not_equal)
    if moved.any():
        moved_ids = np.zeros(len(first), dtype=bool)
        moved_ids[group[moved]] = True
        mixed = gathered(moved_ids, group)
        pair = group[mixed].astype(np.int64) * (int(blocks.position.max()) + 1)
        pair += blocks.position[mixed]
        _, pair_group, pair_count = np.unique(pair, return_inverse=True, return_counts=True)
        repeated[mixed] = pair_count[pair_group] >= 2
    del moved
    counts = np.zeros(blocks.row_count, dtype=np.int64)
    for start, end in chunks(len(repeated)):
        counts += np.bincount(
            blocks.rows(start, end)[repeated[start:end]], minlength=blocks.row_count
        )
    return counts


def chaining_problems(blocks: Blocks) -> dict[str, np.ndarray]:
    """The ids not always at the position, or behind the parent, of their first occurrence."""
    return {
        "ids_at_several_positions": _ids_differing(blocks, lambda i: blocks.position[i]),
        "ids_behind_several_parents": _ids_differing(blocks, blocks.parent),
    }


def _ids_differing(blocks: Blocks, attribute) -> np.ndarray:
    """The ids whose attribute (a function of block indices) somewhere differs from its value
    at the id's first occurrence."""
    first = attribute(np.maximum(blocks.id_first, 0))  # -1: an id value absent, never looked up
    found = [np.zeros(0, dtype=blocks.ids.dtype)]
    for start, end in chunks(len(blocks.ids)):
        differs = first[blocks.id_group[start:end]] != attribute(np.arange(start, end))
        found.append(np.unique(blocks.ids[start:end][differs]))
    return np.unique(np.concatenate(found))


def prefix_shard(blocks: Blocks) -> ShardResult:
    """Prefix reuse, and each prefix's first occurrence in causal order (a miss), for blocks
    holding every occurrence of their prefixes. A prefix occurs once exactly when its first and
    last occurrences coincide (a count per prefix would widen every block's id to int64)."""
    prefixes = int(blocks.prefix.max(initial=-1)) + 1
    once = int(
        np.count_nonzero(
            first_index(blocks.prefix, prefixes) == last_index(blocks.prefix, prefixes)
        )
    )
    misses = np.zeros(blocks.row_count, dtype=np.int64)
    missed = _first_in_causal_order(blocks, prefixes)
    for start, end in chunks(len(missed)):
        misses += np.bincount(blocks.rows_at(missed[start:end]), minlength=blocks.row_count)
    occurrences = len(blocks.prefix)
    return ShardResult(
        _partials(blocks, misses=misses),
        Counter(
            unique_prefixes=prefixes, occurrences=occurrences, reused_occurrences=occurrences - once
        ),
    )


def _first_in_causal_order(blocks: Blocks, prefixes: int) -> np.ndarray:
    """Per prefix, the block where it first occurs in (timestamp, file order), as block indices
    in no particular order. When timestamps never go back, that is file order: no ranks."""
    if (np.diff(blocks.timestamp) >= 0).all():
        return first_index(blocks.prefix, prefixes)
    rank = blocks.causal_rank()
    earliest = np.full(prefixes, blocks.row_count, dtype=np.int64)
    for start, end in chunks(len(blocks.prefix)):
        np.minimum.at(earliest, blocks.prefix[start:end], rank[blocks.rows(start, end)])
    # A prefix occurs at most once per row and ranks are distinct: one block per prefix matches.
    return np.concatenate(
        [np.zeros(0, dtype=np.int64)]
        + [
            np.flatnonzero(earliest[blocks.prefix[start:end]] == rank[blocks.rows(start, end)])
            + start
            for start, end in chunks(len(blocks.prefix))
        ]
    )


@dataclass(frozen=True)
class Rows:
    """Rows as columns, ascending by key (file order)."""

    keys: np.ndarray
    timestamp: np.ndarray
    input_length: np.ndarray
    output_length: np.ndarray
    lengths: np.ndarray  # hash ids per row


@dataclass(frozen=True)
class RowMeasures:
    """Per row, what the report describes and sums (hit_rate and per_request: rows with ids)."""

    context: np.ndarray
    hit_rate: np.ndarray
    per_request: np.ndarray
    tokens: np.ndarray
    miss_tokens: np.ndarray
    misses: np.ndarray
    after_warmup: np.ndarray  # bool


def row_measures(
    rows: Rows, partials: np.ndarray, block_size: int, warmup_key: tuple[float, int] | None
) -> RowMeasures:
    """Each row met with every partial about it (each row's in this row shard)."""
    index = np.searchsorted(rows.keys, partials["rowkey"])
    n = rows.lengths
    unseen = n.astype(np.int64)
    has_unseen = partials["unseen_pos"] >= 0
    np.minimum.at(unseen, index[has_unseen], partials["unseen_pos"][has_unseen])
    repeated = np.bincount(index, weights=partials["repeated"], minlength=len(n)).astype(np.int64)
    misses = np.bincount(index, weights=partials["misses"], minlength=len(n)).astype(np.int64)
    with_ids = n > 0
    # A row's hits form a prefix of it (a prefix occurs once per row, and every shorter prefix
    # of an earlier occurrence occurred with it), so its misses end with its last block.
    last = last_tokens(rows.input_length, n, block_size)
    miss_tokens = np.where(misses > 0, (misses - 1) * block_size + last, 0)
    if warmup_key is None:
        after = np.ones(len(n), dtype=bool)
    else:
        at, key = warmup_key
        after = (rows.timestamp > at) | ((rows.timestamp == at) & (rows.keys >= key))
    return RowMeasures(
        context=np.where(repeated == n, rows.input_length, repeated * block_size),
        hit_rate=unseen[with_ids] / n[with_ids],
        per_request=1 - misses[with_ids] / n[with_ids],
        tokens=covered_tokens(rows.input_length, n, block_size),
        miss_tokens=miss_tokens,
        misses=misses,
        after_warmup=after,
    )


def row_sums(rows: Rows, measured: RowMeasures) -> Counter:
    """The whole-trace sums of one row shard's measures (they add across row shards)."""
    after = measured.after_warmup
    return Counter(
        rows=len(rows.keys),
        blocks=int(rows.lengths.sum()),
        misses=int(measured.misses.sum()),
        tokens=int(measured.tokens.sum()),
        miss_tokens=int(measured.miss_tokens.sum()),
        tokens_after=int(measured.tokens[after].sum()),
        miss_tokens_after=int(measured.miss_tokens[after].sum()),
    )


def first_after_warmup(
    timestamp: np.ndarray, keys: np.ndarray, fraction: float
) -> tuple[float, int] | None:
    """The causal key (timestamp, key) of the row at rank floor(fraction x rows), or None."""
    rank = math.floor(fraction * len(keys))
    if rank >= len(keys):
        return None
    at = np.lexsort((keys, timestamp))[rank]
    return float(timestamp[at]), int(keys[at])
