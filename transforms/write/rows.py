"""Trace rows, held column-wise per batch: a request's lengths and timestamp, its dense block ids
and its session number, without one Python object per row."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

from kvtrace.transforms.ids.buckets import buckets_of, shards_of
from kvtrace.transforms.ids.dense_ids import ids_in_request_order
from kvtrace.transforms.ids.row_order import published_order
from kvtrace.transforms.trace_format import NO_SESSION

ROW = np.dtype(
    [
        ("timestamp_ms", "<i8"),  # absolute; made relative to the export's origin when written
        ("fingerprint", "<u8"),  # tie-break for rows equal in all they publish; never written
        ("input_length", "<i8"),
        ("output_length", "<i8"),
        ("session_id", "<i8"),  # NO_SESSION when the request had none
        ("ids_digest", "<u8"),  # breaks the (2^-64) ties the fingerprint leaves
        ("num_ids", "<i8"),
        ("num_output_ids", "<i8"),  # with --emit-output-hashes, else 0
        ("response_ms", "<i8"),  # NO_RESPONSE_MS when the log did not say
        ("cached_tokens", "<i8"),  # the engine's count (NOT_MEASURED if none): never published
        ("links_digest", "<u8"),  # orders rows alike but for their links; never written
        # With --emit-parents (write/parents.py): the parent row + 1, so that 0 (a row built
        # zeroed) is none; published as parent - 1 (NO_PARENT for none).
        ("parent", "<i8"),
        ("parent_key", "<u8"),  # the link the row continues (encode/hashed_batch.NO_LINK: none)
        ("num_links", "<i8"),  # the links naming it, in RowBatch.links
    ]
)


@dataclass(frozen=True)
class RowBatch:
    rows: np.ndarray  # ROW
    ids: np.ndarray  # int64: each row's hash ids, concatenated in row order
    # uint64 beside ids: each block's engine hash, only with --emit-block-hashes (never published)
    hashes: np.ndarray | None = None
    # int64: each row's output block ids, concatenated, only with --emit-output-hashes
    output_ids: np.ndarray | None = None
    # uint64: the link keys naming each row, concatenated, only with --emit-parents (private)
    links: np.ndarray | None = None

    @staticmethod
    def concat(batches: Sequence[RowBatch]) -> RowBatch:
        if not batches:
            return RowBatch(np.empty(0, ROW), np.empty(0, np.int64))

        def joined(name: str) -> np.ndarray | None:
            parts = [getattr(b, name) for b in batches]
            return None if any(p is None for p in parts) else np.concatenate(parts)

        return RowBatch(
            np.concatenate([b.rows for b in batches]),
            joined("ids"),
            joined("hashes"),
            joined("output_ids"),
            joined("links"),
        )

    def select(self, order: np.ndarray) -> RowBatch:
        """The rows at positions order (in that order), each with its ids."""
        blocks = _picked(self.rows["num_ids"], order)
        outputs = (
            None
            if self.output_ids is None
            else self.output_ids[_picked(self.rows["num_output_ids"], order)]
        )
        links = None if self.links is None else self.links[_picked(self.rows["num_links"], order)]
        return RowBatch(
            self.rows[order],
            self.ids[blocks],
            None if self.hashes is None else self.hashes[blocks],
            outputs,
            links,
        )

    def sorted(self) -> RowBatch:
        """In published order (row_order.py): timestamp and tie key, then content fingerprint,
        then the other published fields and the ids' digest. Ids are numbered in the order of the
        first three (dense_ids.number); the fingerprint covers all a row's ids are made of, its
        hashed answer included, so the rest only orders rows of the same ids. The rows must hold
        published timestamps and output lengths (coarsen.published_requests)."""
        return self.select(self.order())

    def order(self) -> np.ndarray:
        """The rows' positions in published order (sorted)."""
        r = self.rows
        return published_order(
            r["timestamp_ms"],
            r["input_length"],
            r["output_length"],
            r["fingerprint"],
            r["session_id"],
            r["response_ms"],
            r["ids_digest"],
            # Last: rows alike in all they publish keep one order for their private counts,
            # and for their links (a child's parent is a row number).
            r["cached_tokens"],
            r["links_digest"],
        )

    def row_ids(self) -> list[np.ndarray]:
        return np.split(self.ids, np.cumsum(self.rows["num_ids"])[:-1]) if len(self.rows) else []

    def row_output_ids(self) -> list[np.ndarray]:
        """Each row's output ids, or [] without them."""
        if self.output_ids is None or not len(self.rows):
            return []
        return np.split(self.output_ids, np.cumsum(self.rows["num_output_ids"])[:-1])


def _picked(counts: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Indices of the items of the rows at order, for rows of counts[r] items each."""
    picked = counts[order]
    starts = _exclusive_cumsum(counts)
    return np.repeat(starts[order] - _exclusive_cumsum(picked), picked) + np.arange(picked.sum())


def _exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    out = np.zeros(len(values), dtype=np.int64)
    np.cumsum(values[:-1], out=out[1:])
    return out


def row_batch(
    requests: np.ndarray,
    block_ids: np.ndarray,
    session_ids: np.ndarray,
    hashes: np.ndarray | None = None,
    with_outputs: bool = False,
    links: np.ndarray | None = None,
) -> RowBatch:
    """Rows for a batch's REQUEST columns, given its ids in request order (each request's
    prompt blocks, then its output blocks) and one session number per request that has a
    session (and, to emit them, each block's engine hash; to number parents, the requests'
    link keys)."""
    rows = np.empty(len(requests), dtype=ROW)
    for name in (
        "timestamp_ms",
        "fingerprint",
        "input_length",
        "output_length",
        "response_ms",
        "cached_tokens",
        "links_digest",
        "parent_key",
        "num_links",
    ):
        rows[name] = requests[name]
    rows["parent"] = 0  # none
    rows["num_ids"] = requests["num_blocks"]
    rows["num_output_ids"] = requests["num_output_blocks"]
    rows["session_id"] = NO_SESSION
    rows["session_id"][requests["has_session"]] = session_ids
    per_request = requests["num_blocks"] + requests["num_output_blocks"]
    is_prompt = (
        np.arange(len(block_ids)) - np.repeat(np.cumsum(per_request) - per_request, per_request)
    ) < np.repeat(requests["num_blocks"], per_request)
    block_ids = block_ids.astype(np.int64, copy=False)
    row = RowBatch(
        rows,
        block_ids[is_prompt],
        None if hashes is None else hashes[is_prompt],
        block_ids[~is_prompt] if with_outputs else None,
        links,
    )
    # Everything a row publishes is in the sort key, its output ids too: two requests alike but
    # for their responses must not come out in input order.
    outputs = row.row_output_ids() or [b""] * len(rows)
    rows["ids_digest"] = [
        xxhash.xxh3_64_intdigest(ids.tobytes() + bytes(out))
        for ids, out in zip(row.row_ids(), outputs)
    ]
    return row


def assemble_rows(
    element: tuple[int, dict[str, list]],
    plan: np.ndarray,
    origin_ms: int,
    with_outputs: bool = False,
) -> Iterator[tuple[int, RowBatch]]:
    """One batch's requests joined with their block ids and session numbers, split by the output
    shard each row belongs to."""
    _, groups = element
    # One batch per id (a list keeps the join symmetric): its REQUEST columns, its blocks'
    # engine hashes or None, and its requests' link keys or None.
    for requests, hashes, links in groups["requests"]:
        block_ids = ids_in_request_order(
            groups["blocks"], requests["num_blocks"] + requests["num_output_blocks"]
        )
        session_ids = ids_in_request_order(groups["sessions"], requests["has_session"].astype(int))
        yield from rows_by_shard(
            row_batch(requests, block_ids, session_ids, hashes, with_outputs, links),
            plan,
            origin_ms,
        )


def rows_by_shard(
    batch: RowBatch, plan: np.ndarray, origin_ms: int
) -> Iterator[tuple[int, RowBatch]]:
    """(output shard, the batch's rows in it) for each shard the batch has rows in. The rows
    hold published times (coarsen.published_requests), made relative to the origin here."""
    shards = output_shards(batch.rows["timestamp_ms"] - origin_ms, plan)
    for shard in np.unique(shards).tolist():
        yield shard, batch.select(np.flatnonzero(shards == shard))


# The shard plan is a function of the published rows alone (their published times and block
# counts), so that `kvtrace audit` recomputes it from the rows it reads: a shard takes
# consecutive published minutes up to shards.MAX_BLOCKS_PER_SHARD of room, never part of one.


def output_shards(published_ms: np.ndarray, plan: np.ndarray) -> np.ndarray:
    """Each row's output shard: its published minute's, as the plan (shards.shard_plan) says."""
    return shards_of(buckets_of(published_ms), plan)


def shard_count(plan: np.ndarray) -> int:
    """Output shards of a plan; an empty trace still has shard 0."""
    return max(len(plan), 1)


def published_room(published_ms: np.ndarray, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each published minute, ascending; room its rows take in an output shard): their blocks
    (prompt and output), +1 per row so that a row without blocks still counts."""
    return room_by_minute(buckets_of(published_ms), blocks + 1)


def room_by_minute(minutes: np.ndarray, rooms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rooms summed per minute: (distinct minutes ascending, each one's total)."""
    labels, index = np.unique(minutes, return_inverse=True)
    return labels, np.bincount(index, weights=rooms, minlength=len(labels)).astype(np.int64)


def request_room(
    timestamps_ms: np.ndarray, blocks: np.ndarray, origin_ms: int
) -> list[tuple[int, int]]:
    """(published minute, room) of requests of these published, yet absolute, timestamps
    (coarsen.published_requests) and blocks (HashedBatch.blocks_per_request)."""
    minutes, rooms = published_room(timestamps_ms - origin_ms, blocks)
    return list(zip(minutes.tolist(), rooms.tolist()))
