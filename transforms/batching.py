"""Batches bounded by weight (blocks, bytes) as well as count, never empty.

Beam's BatchElements emits an empty batch when the first element of a bundle alone outweighs
max_batch_size, and adapts sizes to timings, which we do not need: a long request is simply a
batch of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any


class WeightedBatcher:
    """A batch closes before the element that would take it past max_weight or max_count, so an
    element heavier than max_weight is a batch alone."""

    def __init__(self, max_weight: int, weight: Callable[[Any], int], max_count: int | None = None):
        self._max_weight = max_weight
        self._weight = weight
        self._max_count = max_count
        self._batch: list[Any] = []
        self._batch_weight = 0

    def add(self, element: Any) -> list[Any] | None:
        """Adds element; returns the batch it closed, if any."""
        weight = self._weight(element)
        full = self._max_count is not None and len(self._batch) >= self._max_count
        closed = None
        if self._batch and (full or self._batch_weight + weight > self._max_weight):
            closed = self.flush()
        self._batch.append(element)
        self._batch_weight += weight
        return closed

    def flush(self) -> list[Any] | None:
        """The open batch, if it holds anything; the batcher starts afresh."""
        batch, self._batch, self._batch_weight = self._batch, [], 0
        return batch or None


def batches_by_weight(
    elements: Iterable[Any],
    max_weight: int,
    weight: Callable[[Any], int],
    max_count: int | None = None,
) -> Iterator[list[Any]]:
    batcher = WeightedBatcher(max_weight, weight, max_count)
    for element in elements:
        if (batch := batcher.add(element)) is not None:
            yield batch
    if (batch := batcher.flush()) is not None:
        yield batch
