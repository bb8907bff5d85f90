"""Coarser published values, to lower what timing and lengths reveal (`kvtrace audit` measures
it): timestamps rounded to a granularity relative to the export's origin, output lengths rounded
to a multiple, and with them input lengths within their last block (a session's next prompt
holds the reply: an exact input_length would give the reply's length back to the token) and
response times dropped (coarse_response_ms), and timestamps at least as coarse as the lengths
need (timestamp_floor)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtrace.transforms.encode.hashed_batch import HashedBatch
from kvtrace.transforms.trace_format import (
    MAX_INPUT_LENGTH,
    MAX_OUTPUT_LENGTH,
    MAX_PUBLISHED_INT,
    MAX_RESPONSE_MS,
    NO_RESPONSE_MS,
)
from kvtrace.transforms.write.rows import RowBatch

# The slowest decode a coarse length must hide, per token: a session's next request follows its
# reply's end, so its arrival is TTFT + tokens x per-token time (+ a tool's few ms) after the
# last, and a timestamp finer than N tokens' decode gives a length rounded to N back to the
# token. 100 ms a token is slower than any engine serves interactively (a busy large model
# decodes at 20-60 ms). What the floor bounds: two replies fewer than N tokens apart, decoded
# at most 100 ms a token, put the next arrival less than a granule G = N x 100 ms apart, so the
# published arrivals are equal or one granule apart, never more. Equal (the length hidden)
# except where a granule boundary falls between them, at a share (tokens apart x per-token
# ms) / G of the arrival's phases, under 1/N for one token: there the next arrival's granule
# tells which side of the boundary the length lies, narrowed, not hidden. A slower decode is
# not bounded at all.
SLOWEST_TOKEN_MS = 100


def timestamp_floor(output_length: int) -> int:
    """The finest timestamp granularity (ms) that hides output lengths rounded to
    output_length: 1 when they are exact."""
    return 1 if output_length <= 1 else output_length * SLOWEST_TOKEN_MS


def timing_problem(timestamp_ms: int, output_length: int) -> str | None:
    """Why timestamps at timestamp_ms would give lengths rounded to output_length back (None:
    they would not). The one rule, for the run that writes and the gate that reads."""
    floor = timestamp_floor(output_length)
    if timestamp_ms >= floor:
        return None
    return (
        f"timestamps at {timestamp_ms} ms beside lengths rounded to {output_length} give each "
        f"length back to the token (a session's next request arrives as the reply's decode "
        f"ends): the floor is {floor} ms ({output_length} x {SLOWEST_TOKEN_MS} ms, the slowest "
        f"per-token decode hidden)"
    )


def granularity_problem(block_size: int, output_length: int) -> str | None:
    """Why lengths rounded to output_length over blocks of block_size would hide less than the
    rounding promises (None: they would not). A session's next prompt holds the reply and keeps
    its full blocks (hash_ids count them), so a reply's length is known to within a block
    whatever the rounding: a multiple above the block size hides nothing more. The one rule,
    for the run that writes and the gate that reads."""
    if output_length <= block_size:
        return None
    return (
        f"lengths rounded to {output_length} over blocks of {block_size} tokens: the next "
        f"turn's prompt keeps its full blocks, so a length is known to within a block and a "
        f"granularity above the block size hides nothing more; use at most {block_size}"
    )


@dataclass(frozen=True)
class Coarsening:
    timestamp_ms: int = 1  # publish timestamps as multiples of this (ms from the origin)
    output_length: int = 1  # publish output lengths as multiples of this
    # The run's block size, within which input lengths are coarsened (coarse_input_lengths)
    # when output lengths are; 0 keeps them exact (the gate refuses such a folder).
    block_size: int = 0

    @property
    def is_identity(self) -> bool:
        return self.timestamp_ms == 1 and self.output_length == 1


def round_to(values: np.ndarray, step: int, highest: int = MAX_PUBLISHED_INT - 1) -> np.ndarray:
    """Round half up to a multiple of step, within the published range: a value that would
    round past highest (the field's largest, trace_format's bound the audit holds rows to)
    takes the largest multiple of step not over it. Monotone: time order survives."""
    return np.minimum((values + step // 2) // step * step, highest // step * step)


def coarse_output_lengths(lengths: np.ndarray, step: int) -> np.ndarray:
    """Output lengths as published: multiples of step up to MAX_OUTPUT_LENGTH, a positive one
    never 0 (a request that generated something stays one that did) while a multiple of step
    lies in the range, that is while step is at most MAX_OUTPUT_LENGTH."""
    rounded = round_to(lengths, step, MAX_OUTPUT_LENGTH)
    smallest = min(step, MAX_OUTPUT_LENGTH // step * step)  # 0 when no multiple is in range
    return np.where((lengths > 0) & (rounded == 0), smallest, rounded)


def coarse_input_lengths(lengths: np.ndarray, block_size: int, step: int) -> np.ndarray:
    """Input lengths as published beside output lengths rounded to step: the full blocks kept,
    the last block's fill rounded up to a multiple of step and capped at the block size, so
    every row keeps its block count (hash_ids match it) and the length is known only to within
    step, as the reply a later turn's prompt holds is, while step is at most the block size:
    the full blocks stay, so a larger step hides no more than the block (granularity_problem
    refuses it). A multiple of block_size stays as it is;
    so does every length when step is 1 or block_size is 0 (not known). Capped at
    MAX_INPUT_LENGTH: the cap is past the length's full blocks, so its block count holds."""
    if step == 1 or block_size == 0:
        return lengths
    full = np.maximum(lengths - 1, 0) // block_size * block_size
    fill = lengths - full
    return np.minimum(full + np.minimum(block_size, -(-fill // step) * step), MAX_INPUT_LENGTH)


def coarse_response_ms(response_ms: np.ndarray, coarsening: Coarsening) -> np.ndarray:
    """Response times as published: rounded to the timestamp granularity, and none beside
    coarsened lengths. A response time is TTFT + output tokens x TPOT, both fitted from the
    trace itself, so to the millisecond it gives a rounded length back to the token; no
    rounding of it is safe without knowing the engine's decode speed, so it goes (as for a
    log that does not say when responses end)."""
    if coarsening.output_length > 1:
        return np.full_like(response_ms, NO_RESPONSE_MS)
    known = response_ms != NO_RESPONSE_MS
    rounded = round_to(response_ms, coarsening.timestamp_ms, MAX_RESPONSE_MS)
    return np.where(known, rounded, response_ms)


def coarsen(batch: RowBatch, origin_ms: int, coarsening: Coarsening) -> RowBatch:
    """The rows with coarsened timestamps, response times, output and input lengths."""
    if coarsening.is_identity:
        return batch
    rows = batch.rows.copy()
    rows["timestamp_ms"] = origin_ms + round_to(
        rows["timestamp_ms"] - origin_ms, coarsening.timestamp_ms
    )
    rows["output_length"] = coarse_output_lengths(rows["output_length"], coarsening.output_length)
    rows["input_length"] = coarse_input_lengths(
        rows["input_length"], coarsening.block_size, coarsening.output_length
    )
    rows["response_ms"] = coarse_response_ms(rows["response_ms"], coarsening)
    return RowBatch(rows, batch.ids, batch.hashes, batch.output_ids)


def published_requests(batch: HashedBatch, origin_ms: int, coarsening: Coarsening) -> HashedBatch:
    """The requests with their timestamps and lengths as their rows publish them. Ids are
    numbered, shards planned, rows sorted and totals summed on these (ids/row_order.py,
    dense_ids.block_keys' token weights, totals.py): raw ones would put the rows of one
    published time in their finer, unpublished order, or publish the exact lengths in sums."""
    if coarsening.is_identity:
        return batch
    requests = batch.requests.copy()
    requests["timestamp_ms"] = origin_ms + round_to(
        requests["timestamp_ms"] - origin_ms, coarsening.timestamp_ms
    )
    requests["output_length"] = coarse_output_lengths(
        requests["output_length"], coarsening.output_length
    )
    requests["input_length"] = coarse_input_lengths(
        requests["input_length"], coarsening.block_size, coarsening.output_length
    )
    requests["response_ms"] = coarse_response_ms(requests["response_ms"], coarsening)
    return HashedBatch(requests, batch.block_hashes, batch.links)
