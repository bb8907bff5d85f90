"""One kind of timestamp per input: epoch dates or relative times, decided by the majority of its
records (read/timestamps.input_kind); the others are dead letters before any id is numbered or
the origin is fixed. Pure: encode/steps.py runs it on Beam workers, the local engine calls it."""

from __future__ import annotations

import json

import numpy as np

from transforms.dead_letters import DeadLetter
from transforms.encode.hashed_batch import HashedBatch
from transforms.read.timestamps import EPOCH_FLOOR_MS, RELATIVE, input_kind

TIMESTAMP_KIND_MISMATCH = "timestamp_kind_mismatch"


def kind_counts(batch: HashedBatch) -> tuple[int, int]:
    """(relative, epoch) timestamps in a batch."""
    relative = int(np.count_nonzero(batch.requests["timestamp_ms"] < EPOCH_FLOOR_MS))
    return relative, len(batch) - relative


def sum_kind_counts(counts: list[tuple[int, int]]) -> tuple[int, int]:
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def keep_input_kind(batch: HashedBatch, counts: tuple[int, int]
                    ) -> tuple[HashedBatch | None, list[DeadLetter]]:
    """The batch's requests whose timestamp is of the input's kind, and a dead letter for each
    other one. The record's text is gone by now (only hashes leave the encoder), so the letter
    names what identifies the row: its timestamp and lengths."""
    kind = input_kind(*counts)
    relative = batch.requests["timestamp_ms"] < EPOCH_FLOOR_MS
    keep = relative if kind == RELATIVE else ~relative
    if keep.all():
        return batch, []
    letters = [
        DeadLetter("", json.dumps({key: int(row[key]) for key in
                                   ("timestamp_ms", "input_length", "output_length")}).encode(),
                   TIMESTAMP_KIND_MISMATCH,
                   f"timestamp {int(row['timestamp_ms'])} ms is "
                   f"{'an epoch date' if kind == RELATIVE else 'a relative time'}, but "
                   f"{max(counts)} of {sum(counts)} of the input's timestamps are "
                   f"{'relative times' if kind == RELATIVE else 'epoch dates'}")
        for row in batch.requests[~keep]
    ]
    return (batch.select(keep) if keep.any() else None), letters
