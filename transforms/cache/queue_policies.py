"""The queue-based policies the caching literature uses: S3-FIFO, SIEVE, ARC, W-TinyLFU
(numba-compiled; policies.py `hit_rates` chooses them by name, as it does the others).

They are block policies, as lru and fifo are: each decides which block to evict by its own
queues, knowing nothing of prefixes; a block may outlive its parent, and then helps no request
until the parent is back, since a hit counts only while the whole prefix is cached (the longest
cached prefix, `cached_prefix_tokens`). A leaf-first variant would no longer be the published
algorithm, and no other simulator could check it; prefix-lru is the leaf-first policy.

Every block of a request is touched in order, missing ones inserted: on a stream of single-block
requests each equals the published algorithm (libCacheSim's replays agree, tests/transforms/
cache/test_queue_policies.py). Parameters are the papers' defaults:

- s3-fifo: a small FIFO of a tenth of the pages (at least one), a main FIFO of the rest, a
  ghost FIFO of the ids of nine tenths of the pages; 2-bit access counts. Evicted from small:
  a block hit at least twice moves to main, any other leaves its id in the ghost; a ghost's id
  comes back into main. Evicted from main: a block with a count goes back to main's head, one
  count less. Until the first eviction, a newcomer that finds the small queue full goes to main
  (libCacheSim's current S3-FIFO; the paper's first version filled the small queue further).
- sieve: one FIFO with a visited bit; the hand walks from the oldest block towards the newest,
  clearing bits, and evicts the first block not visited since the hand last passed.
- arc: recency (T1) and frequency (T2) lists with their ghosts (B1, B2) and the adaptive target
  p for T1, as Megiddo and Modha's ARC.
- tinylfu: W-TinyLFU: a window LRU of 1% of the pages (at least one), a segmented LRU of the
  rest (80% protected); a block leaving the window enters the main cache only if a count-min
  sketch (4 rows of 4-bit counters, halved every 10 x pages accesses) has seen it more often
  than the main cache's victim. The sketch's hashes are fixed: replays are deterministic.

Memory: per distinct block of the trace 10 bytes (list links, list, counter), and the sketch's
4 bytes per page (up to the trace's distinct blocks): proportional to the trace's ids plus the
capacity, as the other replays.
"""

from __future__ import annotations

import numba
import numpy as np

_S3FIFO, _SIEVE, _ARC, _TINYLFU = range(4)
QUEUE_POLICIES = {"s3-fifo": _S3FIFO, "sieve": _SIEVE, "arc": _ARC, "tinylfu": _TINYLFU}

# Lists a block can be in (where[b]): cached ones positive, ghosts (ids only) negative; a list's
# row in `lists` is the code's absolute value. head = newest, tail = oldest.
_SMALL, _MAIN, _S3_GHOST = 1, 2, -3  # s3-fifo
_QUEUE = 1  # sieve
_T1, _T2, _B1, _B2 = 1, 2, -3, -4  # arc
_WINDOW, _PROBATION, _PROTECTED = 1, 2, 3  # tinylfu
_HEAD, _TAIL, _LEN = 0, 1, 2
_SKETCH_ROWS = 4
_SKETCH_SEEDS = np.array(
    [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93],
    dtype=np.uint64,
)


@numba.njit(cache=True, nogil=True)
def cached_prefix_tokens(block, tokens, start, end, cached) -> int:
    """Real tokens of the longest prefix of block[start:end] cached now (cached[b] > 0)."""
    hit = 0
    i = start
    while i < end and cached[block[i]] > 0:
        hit += tokens[i]
        i += 1
    return hit


@numba.njit(cache=True, nogil=True)
def _push_head(lists, prev, nxt, where, code, b) -> None:
    row = abs(code)
    head = lists[row, _HEAD]
    prev[b], nxt[b] = -1, head
    if head >= 0:
        prev[head] = b
    else:
        lists[row, _TAIL] = b
    lists[row, _HEAD] = b
    lists[row, _LEN] += 1
    where[b] = code


@numba.njit(cache=True, nogil=True)
def _unlink(lists, prev, nxt, where, b) -> None:
    row = abs(where[b])
    before, after = prev[b], nxt[b]
    if before >= 0:
        nxt[before] = after
    else:
        lists[row, _HEAD] = after
    if after >= 0:
        prev[after] = before
    else:
        lists[row, _TAIL] = before
    lists[row, _LEN] -= 1
    where[b] = 0


@numba.njit(cache=True, nogil=True)
def _to_head(lists, prev, nxt, where, code, b) -> None:
    _unlink(lists, prev, nxt, where, b)
    _push_head(lists, prev, nxt, where, code, b)


@numba.njit(cache=True, nogil=True)
def replay_queues(block, tokens, row_starts, distinct, pages, policy, hits) -> None:
    """Replay the trace through the policy, adding each row's hit tokens to hits[row]."""
    where = np.zeros(distinct, dtype=np.int8)
    prev = np.full(distinct, -1, dtype=np.int32)
    nxt = np.full(distinct, -1, dtype=np.int32)
    count = np.zeros(distinct, dtype=np.uint8)  # s3-fifo's count, sieve's visited bit
    lists = np.full((5, 3), -1, dtype=np.int64)
    lists[:, _LEN] = 0
    width = 1
    while policy == _TINYLFU and width < min(max(pages, 1), distinct):
        width *= 2
    sketch = np.zeros((_SKETCH_ROWS, width), dtype=np.uint8)
    # Scalars: sieve's hand, arc's target p, the sketch's accesses since it was last halved,
    # whether s3-fifo has evicted yet.
    state = np.array([-1.0, 0.0, 0.0, 0.0])
    for row in range(len(row_starts) - 1):
        start, end = row_starts[row], row_starts[row + 1]
        hits[row] += cached_prefix_tokens(block, tokens, start, end, where)
        if pages == 0:
            continue
        for i in range(start, end):
            b = block[i]
            if policy == _S3FIFO:
                _s3fifo(b, lists, prev, nxt, where, count, pages, state)
            elif policy == _SIEVE:
                _sieve(b, lists, prev, nxt, where, count, pages, state)
            elif policy == _ARC:
                _arc(b, lists, prev, nxt, where, pages, state)
            else:
                _tinylfu(b, lists, prev, nxt, where, sketch, pages, state)


@numba.njit(cache=True, nogil=True)
def _s3fifo(b, lists, prev, nxt, where, count, pages, state) -> None:
    if where[b] > 0:
        count[b] = min(count[b] + 1, 3)
        return
    from_ghost = where[b] == _S3_GHOST
    if from_ghost:
        _unlink(lists, prev, nxt, where, b)
    small = max(1, pages // 10)
    ghost = (pages * 9) // 10
    while lists[_SMALL, _LEN] + lists[_MAIN, _LEN] >= pages:
        state[3] = 1.0
        if lists[_MAIN, _LEN] > pages - small or lists[_SMALL, _LEN] == 0:
            while True:  # main: blocks with a count go round again, one count less
                victim = lists[_MAIN, _TAIL]
                if count[victim] == 0:
                    _unlink(lists, prev, nxt, where, victim)
                    break
                _to_head(lists, prev, nxt, where, _MAIN, victim)
                count[victim] -= 1
        else:
            while lists[_SMALL, _LEN] > 0:  # small: evict one, moving the popular to main
                victim = lists[_SMALL, _TAIL]
                _unlink(lists, prev, nxt, where, victim)
                if count[victim] >= 2:
                    _push_head(lists, prev, nxt, where, _MAIN, victim)
                    count[victim] = 0
                    continue
                if ghost > 0:
                    if lists[abs(_S3_GHOST), _LEN] >= ghost:
                        _unlink(lists, prev, nxt, where, lists[abs(_S3_GHOST), _TAIL])
                    _push_head(lists, prev, nxt, where, _S3_GHOST, victim)
                break
    # Until the first eviction a full small queue sends newcomers to main: the cache fills
    # with them, and later newcomers pass through the small queue sooner.
    to_main = from_ghost or (state[3] == 0.0 and lists[_SMALL, _LEN] >= small)
    _push_head(lists, prev, nxt, where, _MAIN if to_main else _SMALL, b)
    count[b] = 0


@numba.njit(cache=True, nogil=True)
def _sieve(b, lists, prev, nxt, where, visited, pages, state) -> None:
    if where[b] == _QUEUE:
        visited[b] = 1
        return
    if lists[_QUEUE, _LEN] >= pages:
        hand = int(state[0])
        victim = hand if hand >= 0 else lists[_QUEUE, _TAIL]
        while visited[victim]:
            visited[victim] = 0
            victim = prev[victim] if prev[victim] >= 0 else lists[_QUEUE, _TAIL]
        state[0] = prev[victim]  # towards the newer blocks; -1: from the tail again
        _unlink(lists, prev, nxt, where, victim)
    _push_head(lists, prev, nxt, where, _QUEUE, b)
    visited[b] = 0


@numba.njit(cache=True, nogil=True)
def _arc_replace(lists, prev, nxt, where, p, in_b2) -> None:
    """Move T1's or T2's oldest block to its ghost list, as ARC's target p says."""
    t1 = lists[_T1, _LEN]
    if t1 > 0 and (t1 > p or (in_b2 and t1 == p)):
        victim, ghost = lists[_T1, _TAIL], _B1
    else:
        victim, ghost = lists[_T2, _TAIL], _B2
    _unlink(lists, prev, nxt, where, victim)
    _push_head(lists, prev, nxt, where, ghost, victim)


@numba.njit(cache=True, nogil=True)
def _arc(b, lists, prev, nxt, where, pages, state) -> None:
    w = where[b]
    if w == _T1 or w == _T2:
        _to_head(lists, prev, nxt, where, _T2, b)
        return
    b1, b2 = lists[abs(_B1), _LEN], lists[abs(_B2), _LEN]
    if w == _B1 or w == _B2:
        if w == _B1:
            state[1] = min(state[1] + max(b2 / b1, 1.0), pages)
        else:
            state[1] = max(state[1] - max(b1 / b2, 1.0), 0.0)
        _arc_replace(lists, prev, nxt, where, state[1], w == _B2)
        _to_head(lists, prev, nxt, where, _T2, b)
        return
    t1, t2 = lists[_T1, _LEN], lists[_T2, _LEN]
    if t1 + b1 == pages:
        if t1 < pages:
            _unlink(lists, prev, nxt, where, lists[abs(_B1), _TAIL])
            _arc_replace(lists, prev, nxt, where, state[1], False)
        else:
            _unlink(lists, prev, nxt, where, lists[_T1, _TAIL])
    elif t1 + t2 + b1 + b2 >= pages:
        if t1 + t2 + b1 + b2 == 2 * pages:
            _unlink(lists, prev, nxt, where, lists[abs(_B2), _TAIL])
        _arc_replace(lists, prev, nxt, where, state[1], False)
    _push_head(lists, prev, nxt, where, _T1, b)


@numba.njit(cache=True, nogil=True)
def _column(sketch, row, b) -> int:
    """The block's counter in the sketch's row: a fixed multiplicative hash's high bits."""
    mixed = (np.uint64(b + 1) * _SKETCH_SEEDS[row]) >> np.uint64(32)
    return int(mixed & np.uint64(sketch.shape[1] - 1))


@numba.njit(cache=True, nogil=True)
def _estimate(sketch, b) -> int:
    least = 15
    for row in range(_SKETCH_ROWS):
        least = min(least, sketch[row, _column(sketch, row, b)])
    return least


@numba.njit(cache=True, nogil=True)
def _record(sketch, b, pages, state) -> None:
    for row in range(_SKETCH_ROWS):
        column = _column(sketch, row, b)
        if sketch[row, column] < 15:
            sketch[row, column] += 1
    state[2] += 1
    if state[2] >= 10 * pages:  # ageing: old popularity fades
        for row in range(_SKETCH_ROWS):
            for column in range(sketch.shape[1]):
                sketch[row, column] >>= 1
        state[2] = state[2] // 2


@numba.njit(cache=True, nogil=True)
def _tinylfu(b, lists, prev, nxt, where, sketch, pages, state) -> None:
    _record(sketch, b, pages, state)
    window = max(1, pages // 100)
    main = pages - window
    w = where[b]
    if w == _WINDOW:
        _to_head(lists, prev, nxt, where, _WINDOW, b)
        return
    if w == _PROTECTED:
        _to_head(lists, prev, nxt, where, _PROTECTED, b)
        return
    if w == _PROBATION:
        _to_head(lists, prev, nxt, where, _PROTECTED, b)
        if lists[_PROTECTED, _LEN] > (main * 8) // 10:
            _to_head(lists, prev, nxt, where, _PROBATION, lists[_PROTECTED, _TAIL])
        return
    _push_head(lists, prev, nxt, where, _WINDOW, b)
    if lists[_WINDOW, _LEN] <= window:
        return
    candidate = lists[_WINDOW, _TAIL]
    _unlink(lists, prev, nxt, where, candidate)
    if lists[_PROBATION, _LEN] + lists[_PROTECTED, _LEN] < main:
        _push_head(lists, prev, nxt, where, _PROBATION, candidate)
        return
    if main == 0:
        return
    victim = lists[_PROBATION, _TAIL]
    if victim < 0:
        victim = lists[_PROTECTED, _TAIL]
    if _estimate(sketch, candidate) > _estimate(sketch, victim):
        _unlink(lists, prev, nxt, where, victim)
        _push_head(lists, prev, nxt, where, _PROBATION, candidate)
