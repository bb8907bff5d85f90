"""Plausible timestamps only: an input's requests outside the bulk of its own timestamps (a clock
reset to a plausible date, a relative time among epoch dates or the reverse) are dead letters
before any id is numbered or the origin is fixed (read/timestamps.plausible_days decides from
the count of requests per day, a sum any split of the input adds up alike). Pure: encode/steps.py
runs it on Beam workers, the local engine and the streaming windows call it."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping

import numpy as np

from kvtrace.transforms.dead_letters import DeadLetter
from kvtrace.transforms.encode.hashed_batch import HashedBatch
from kvtrace.transforms.read.timestamps import (
    DAY_MS,
    EPOCH,
    MAX_GAP_DAYS,
    RELATIVE,
    anchored_days,
    plausible_days,
    timestamp_kind,
)

TIMESTAMP_KIND_MISMATCH = "timestamp_kind_mismatch"
IMPLAUSIBLE_TIMESTAMP = "implausible_timestamp"
KIND_WORDS = {
    RELATIVE: ("a relative time", "relative times"),
    EPOCH: ("an epoch date", "epoch dates"),
}


def kind_counts(batch: HashedBatch) -> dict[int, int]:
    """The batch's requests per day (ms // DAY_MS): at most one entry per day before 2100."""
    days, counts = np.unique(batch.requests["timestamp_ms"] // DAY_MS, return_counts=True)
    return dict(zip(days.tolist(), counts.tolist()))


def sum_kind_counts(counts: list[dict[int, int]]) -> dict[int, int]:
    total: Counter[int] = Counter()
    for part in counts:
        total.update(part)
    return dict(total)


def keep_input_kind(
    batch: HashedBatch, counts: dict[int, int], withhold: bool = False
) -> tuple[HashedBatch | None, list[DeadLetter]]:
    """The batch's requests within the bulk of the input's timestamps (counts: the whole input's
    requests per day), and a dead letter for each other one. The record's text is gone by now
    (only hashes leave the encoder), so the letter names what identifies the row: its timestamp
    and lengths (withhold: the run's ParseOptions.withholds_letters, as every letter of it)."""
    return keep_days(batch, plausible_days(counts), withhold)


def keep_days(
    batch: HashedBatch, days: tuple[int, int], withhold: bool = False
) -> tuple[HashedBatch | None, list[DeadLetter]]:
    """The batch's requests on days (first, last), and a dead letter for each other one."""
    first, last = days
    on_day = batch.requests["timestamp_ms"] // DAY_MS
    keep = (on_day >= first) & (on_day <= last)
    if keep.all():
        return batch, []
    bulk_kind = timestamp_kind(first * DAY_MS)
    letters = [_letter(row, bulk_kind, first, last, withhold) for row in batch.requests[~keep]]
    return (batch.select(keep) if keep.any() else None), letters


def keep_plausible_windows(
    windows: list[tuple[int, HashedBatch]], established: Mapping[int, int] | None = None
) -> tuple[list[tuple[int, HashedBatch]], list[DeadLetter]]:
    """(window start, batch) pairs judged together as one input with what was established
    before them (a stream's published requests per day): the pairs with their requests in the
    run of days holding the established ones (read/timestamps.anchored_days: what a stream
    published is never outvoted by what waits), or, with none established, in the bulk; and a
    dead letter for each other. Judged among waiting windows alone, a clock reset arriving alone
    would be the bulk of its own judgement."""
    counts = sum_kind_counts([kind_counts(b) for _, b in windows])
    days = anchored_days(dict(established or {}), counts)
    kept, letters = [], []
    for window, batch in windows:
        plausible, stray = keep_days(batch, days)
        letters += stray
        if plausible is not None:
            kept.append((window, plausible))
    return kept, letters


def keep_arriving(
    batch: HashedBatch, anchor: Mapping[int, int]
) -> tuple[HashedBatch | None, list[DeadLetter]]:
    """A batch's requests judged one by one in arrival order against the run of days holding
    anchor (a stream's published and waiting requests per day: one run), as it stands: each
    request kept extends it (read/timestamps.anchored_days, the rule), and a dead letter for
    each other one. Only the order requests arrive in decides, never how a bundle batches
    them: judged with a batch's own days, a request days ahead is kept beside one between."""
    standing = dict(anchor)
    first, last = anchored_days(standing, {})
    days = (batch.requests["timestamp_ms"] // DAY_MS).tolist()
    keep = np.ones(len(days), bool)
    for place, day in enumerate(days):
        if not first <= day <= last:  # else within the run as it stands: it moves nothing
            reach = anchored_days(standing, {day: 1})
            if reach[0] <= day <= reach[1]:
                first, last = reach
                standing[day] = 1
            else:
                keep[place] = False
    if keep.all():
        return batch, []
    bulk_kind = timestamp_kind(first * DAY_MS)
    letters = [_letter(row, bulk_kind, first, last) for row in batch.requests[~keep]]
    return (batch.select(keep) if keep.any() else None), letters


def row_identity(row: np.void) -> bytes:
    """What a letter names of a hashed request, its text gone: its time and lengths."""
    return json.dumps(
        {key: int(row[key]) for key in ("timestamp_ms", "input_length", "output_length")}
    ).encode()


def _letter(
    row: np.void, bulk_kind: str, first: int, last: int, withhold: bool = False
) -> DeadLetter:
    ms = int(row["timestamp_ms"])
    identity = row_identity(row)
    kind = timestamp_kind(ms)
    if kind != bulk_kind:
        return DeadLetter(
            "",
            identity,
            TIMESTAMP_KIND_MISMATCH,
            f"timestamp {ms} ms is {KIND_WORDS[kind][0]}, but the bulk of the "
            f"input's timestamps are {KIND_WORDS[bulk_kind][1]}",
            withhold=withhold,
        )
    return DeadLetter(
        "",
        identity,
        IMPLAUSIBLE_TIMESTAMP,
        f"timestamp {ms} ms is more than {MAX_GAP_DAYS} days from the bulk of the "
        f"input's timestamps (days {first} to {last} of the epoch): a clock reset, "
        f"not a request of this input",
        withhold=withhold,
    )
