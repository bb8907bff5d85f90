"""Cache policies replayed request by request, one capacity per pass (numba-compiled loops).

Every policy works in pages: a block, the partial last block of a request too, takes one page of
block_size tokens, so a cache of C tokens holds C // block_size blocks. Per request, the hit is
the longest prefix of its blocks that is cached when it arrives (token-weighted: the real tokens
of those blocks, so a rate never exceeds 1); then its blocks are touched in order, and missing
ones inserted, evicting as the policy says:

- lru: the least recently used block. A stack algorithm: stack_distance.py gives every capacity
  in one pass; the replay here exists to check it.
- prefix-lru: the least recently used leaf (a block none of whose descendants is cached), never
  a block of the running request: as serving engines' radix caches do. When only the running
  request's blocks are left, the rest of it is not cached.
- fifo: the block inserted first; hits do not refresh it.
- belady: the block whose next use is furthest (offline optimum, the upper bound); a tie (a
  block and its descendants are next used together) evicts the deepest first; a block needed
  later than every cached one is not cached at all (nor the rest of its request).
- s3-fifo, sieve, arc, tinylfu: the literature's queue policies, block by block as lru and
  fifo (queue_policies.py).

Every replay is sequential by nature (each eviction depends on the whole history): a capacity
replays on one core, capacities in parallel on one machine's cores; no Beam path.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from kvtrace.transforms.cache.cache_trace import CacheTrace
from kvtrace.transforms.cache.queue_policies import (
    QUEUE_POLICIES,
    cached_prefix_tokens,
    replay_queues,
)

_LRU, _PREFIX_LRU, _FIFO, _BELADY = range(4)
_HEAP_POLICIES = {"lru": _LRU, "prefix-lru": _PREFIX_LRU, "fifo": _FIFO, "belady": _BELADY}
_NEVER = np.iinfo(np.int32).max  # traces hold < 2^31 blocks
# Heap entries beyond twice the capacity before stale ones are dropped: fewer drops for small
# capacities, at 8 KB.
HEAP_SLACK = 1024


def hit_rates(
    trace: CacheTrace,
    policy: str,
    capacities: Sequence[int],
    warmup_fraction: float = 0.0,
    done: Callable[[int], None] | None = None,
) -> list[float]:
    """Token-weighted hit rate of the policy at each capacity (tokens), counting only rows
    after the first warmup_fraction of rows (earlier ones still fill the cache). Capacities
    replay in parallel threads (the compiled replay releases the GIL), one per core; done(i)
    is called as capacity i finishes."""
    first_row = math.floor(warmup_fraction * trace.rows)
    total = int(trace.tokens[trace.row_starts[first_row] :].sum())
    return [
        int(hits[first_row:].sum()) / total if total else 0.0
        for hits in row_hits(trace, policy, capacities, done)
    ]


def row_hits(
    trace: CacheTrace,
    policy: str,
    capacities: Sequence[int],
    done: Callable[[int], None] | None = None,
) -> list[np.ndarray]:
    """Each row's hit tokens (causal order) under the policy at each capacity (tokens), the
    capacities replayed as hit_rates says."""
    if policy in QUEUE_POLICIES:
        parent = next_use = np.empty(0, dtype=np.int32)
    else:
        parent = _parents(trace.block, trace.row_starts, trace.distinct_blocks)
        next_use = _next_uses(trace.block) if policy == "belady" else np.empty(0, dtype=np.int32)

    def replay(index: int) -> np.ndarray:
        pages = capacities[index] // trace.block_size
        hits = np.zeros(trace.rows, dtype=np.int64)
        if policy in QUEUE_POLICIES:
            replay_queues(
                trace.block,
                trace.tokens,
                trace.row_starts,
                trace.distinct_blocks,
                pages,
                QUEUE_POLICIES[policy],
                hits,
            )
        else:
            # Stale heap entries pile up as blocks are re-keyed; they are dropped whenever the
            # heap is full, which leaves at most one per cached block (<= pages): memory
            # follows pages.
            room = 2 * min(pages, trace.distinct_blocks) + HEAP_SLACK
            _replay(
                trace.block,
                trace.tokens,
                trace.row_starts,
                parent,
                next_use,
                trace.distinct_blocks,
                pages,
                _HEAP_POLICIES[policy],
                room,
                hits,
            )
        if done:
            done(index)
        return hits

    with ThreadPoolExecutor(max_workers=min(len(capacities), os.cpu_count() or 1) or 1) as pool:
        return list(pool.map(replay, range(len(capacities))))


def hit_rate(
    trace: CacheTrace, policy: str, capacity_tokens: int, warmup_fraction: float = 0.0
) -> float:
    """hit_rates at one capacity."""
    return hit_rates(trace, policy, [capacity_tokens], warmup_fraction)[0]


def _parents(block: np.ndarray, row_starts: np.ndarray, distinct: int) -> np.ndarray:
    """Each prefix's parent prefix (-1 at a request's first block): exact prefixes have one."""
    parent = np.full(distinct, -1, dtype=np.int32)
    position = np.arange(len(block)) - np.repeat(row_starts[:-1], np.diff(row_starts))
    inner = np.flatnonzero(position > 0)
    parent[block[inner]] = block[inner - 1]
    return parent


def _next_uses(block: np.ndarray) -> np.ndarray:
    """For each occurrence, the index of the same block's next occurrence (_NEVER if none)."""
    order = np.argsort(block, kind="stable").astype(np.int32)
    next_use = np.full(len(block), _NEVER, dtype=np.int32)
    same = block[order][1:] == block[order][:-1]
    next_use[order[:-1][same]] = order[1:][same]
    return next_use


@numba.njit(cache=True)
def _push(keys: np.ndarray, values: np.ndarray, size: int, key: int, value: int) -> int:
    """Push onto a binary min-heap held in (keys, values)[:size]; returns the new size."""
    i = size
    keys[i], values[i] = key, value
    while i > 0:
        up = (i - 1) // 2
        if keys[up] <= keys[i]:
            break
        keys[up], keys[i] = keys[i], keys[up]
        values[up], values[i] = values[i], values[up]
        i = up
    return size + 1


@numba.njit(cache=True)
def _pop(keys: np.ndarray, values: np.ndarray, size: int) -> int:
    """Remove the heap's minimum (read it from keys[0], values[0] first); returns the new size."""
    size -= 1
    keys[0], values[0] = keys[size], values[size]
    _sift_down(keys, values, size, 0)
    return size


@numba.njit(cache=True)
def _sift_down(keys: np.ndarray, values: np.ndarray, size: int, i: int) -> None:
    while True:
        left, smallest = 2 * i + 1, i
        if left < size and keys[left] < keys[smallest]:
            smallest = left
        if left + 1 < size and keys[left + 1] < keys[smallest]:
            smallest = left + 1
        if smallest == i:
            return
        keys[smallest], keys[i] = keys[i], keys[smallest]
        values[smallest], values[i] = values[i], values[smallest]
        i = smallest


@numba.njit(cache=True)
def _without_stale(keys, values, size, cached, key_now, cached_children, policy) -> int:
    """Drop the heap's stale entries (re-keyed, evicted, or no leaf under prefix-lru) and
    re-heapify; returns the new size. What stays is at most one entry per cached block."""
    kept = 0
    for i in range(size):
        b = values[i]
        if (
            cached[b]
            and keys[i] == key_now[b]
            and not (policy == _PREFIX_LRU and cached_children[b] > 0)
        ):
            keys[kept], values[kept] = keys[i], b
            kept += 1
    for i in range(kept // 2 - 1, -1, -1):
        _sift_down(keys, values, kept, i)
    return kept


@numba.njit(cache=True, nogil=True)
def _replay(
    block, tokens, row_starts, parent, next_use, distinct, pages, policy, room, hits
) -> None:
    """Replay every row, adding each row's hit tokens to hits[row]."""
    cached = np.zeros(distinct, dtype=np.bool_)
    key_now = np.zeros(distinct, dtype=np.int64)  # the block's current eviction key
    cached_children = np.zeros(distinct, dtype=np.int32)
    touched_in_row = np.full(distinct, -1, dtype=np.int32)
    keys = np.empty(room, dtype=np.int64)
    values = np.empty(room, dtype=np.int32)
    size, used, now = 0, 0, 0
    for row in range(len(row_starts) - 1):
        start, end = row_starts[row], row_starts[row + 1]
        hits[row] += cached_prefix_tokens(block, tokens, start, end, cached)
        for i in range(start, end):
            b = block[i]
            now += 1
            touched_in_row[b] = row
            if policy == _FIFO:
                key = now if not cached[b] else key_now[b]
            elif policy == _BELADY:  # furthest next use first; deeper first on a tie
                key = -(min(next_use[i], 2**40) * 65536 + min(i - start, 65535))
            else:
                key = now
            if not cached[b]:
                if pages == 0:
                    break
                full = False
                while used >= pages:
                    if size == 0:
                        full = True
                        break
                    victim, victim_key = values[0], keys[0]
                    size = _pop(keys, values, size)
                    if not cached[victim] or victim_key != key_now[victim]:
                        continue  # stale: re-keyed, evicted, or not a leaf any more
                    if policy == _BELADY and victim_key >= key:
                        # Every cached block is needed no later than this one: keep them and
                        # do not cache it (nor, without it, the rest of the request).
                        size = _push(keys, values, size, victim_key, victim)  # room: popped
                        full = True
                        break
                    if policy == _PREFIX_LRU:
                        if cached_children[victim] > 0:
                            continue  # pushed again when it becomes a leaf
                        if touched_in_row[victim] == row:  # pinned: the running request's
                            size = _push(keys, values, size, victim_key, victim)  # room: popped
                            full = True
                            break
                    cached[victim] = False
                    used -= 1
                    p = parent[victim]
                    if p >= 0 and cached[p]:
                        cached_children[p] -= 1
                        if policy == _PREFIX_LRU and cached_children[p] == 0:
                            size = _push(keys, values, size, key_now[p], p)  # room: popped
                if full:
                    break
                cached[b] = True
                used += 1
                p = parent[b]
                if p >= 0 and cached[p]:
                    cached_children[p] += 1
            elif key == key_now[b]:
                continue  # FIFO: a hit keeps its place
            key_now[b] = key
            if size == len(keys):
                size = _without_stale(keys, values, size, cached, key_now, cached_children, policy)
            size = _push(keys, values, size, key, b)
    return hits
