"""Coarser published values, to lower what timing and output lengths reveal (`kvtrace audit`
measures it): timestamps rounded to a granularity relative to the export's origin, output
lengths rounded to a multiple. input_length stays exact: hash_ids must match it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtrace.transforms.encode.hashed_batch import HashedBatch
from kvtrace.transforms.write.rows import RowBatch


@dataclass(frozen=True)
class Coarsening:
    timestamp_ms: int = 1  # publish timestamps as multiples of this (ms from the origin)
    output_length: int = 1  # publish output lengths as multiples of this

    def check(self) -> None:
        if self.timestamp_ms < 1 or self.output_length < 1:
            raise ValueError("--timestamp-granularity-ms and --length-granularity must be >= 1")

    @property
    def is_identity(self) -> bool:
        return self.timestamp_ms == 1 and self.output_length == 1


def round_to(values: np.ndarray, step: int) -> np.ndarray:
    """Round half up to a multiple of step (monotone: time order survives)."""
    return (values + step // 2) // step * step


def coarse_output_lengths(lengths: np.ndarray, step: int) -> np.ndarray:
    """Output lengths as published: multiples of step, a positive one never 0 (a request that
    generated something stays one that did)."""
    rounded = round_to(lengths, step)
    return np.where((lengths > 0) & (rounded == 0), step, rounded)


def coarsen(batch: RowBatch, origin_ms: int, coarsening: Coarsening) -> RowBatch:
    """The rows with coarsened timestamps, response times and output lengths."""
    if coarsening.is_identity:
        return batch
    rows = batch.rows.copy()
    rows["timestamp_ms"] = origin_ms + round_to(rows["timestamp_ms"] - origin_ms,
                                                coarsening.timestamp_ms)
    rows["output_length"] = coarse_output_lengths(rows["output_length"], coarsening.output_length)
    known = rows["response_ms"] >= 0
    rows["response_ms"][known] = round_to(rows["response_ms"][known], coarsening.timestamp_ms)
    return RowBatch(rows, batch.ids, batch.hashes, batch.output_ids)


def published_requests(batch: HashedBatch, origin_ms: int, coarsening: Coarsening) -> HashedBatch:
    """The requests with their timestamps and output lengths as their rows publish them. Ids
    are numbered, shards planned and rows sorted on these (ids/row_order.py): raw ones would
    put the rows of one published time in their finer, unpublished order."""
    if coarsening.is_identity:
        return batch
    requests = batch.requests.copy()
    requests["timestamp_ms"] = origin_ms + round_to(requests["timestamp_ms"] - origin_ms,
                                                    coarsening.timestamp_ms)
    requests["output_length"] = coarse_output_lengths(requests["output_length"],
                                                      coarsening.output_length)
    return HashedBatch(requests, batch.block_hashes)
