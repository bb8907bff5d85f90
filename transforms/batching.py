"""Batches bounded by weight (blocks, bytes) as well as count, never empty.

Beam's BatchElements emits an empty batch when the first element of a bundle alone outweighs
max_batch_size, and adapts sizes to timings, which we do not need: a long request is simply a
batch of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue


class BatchByWeight(beam.DoFn):
    """Elements in, lists of them out: a batch closes before the element that would take it
    past max_weight or max_count, so an element heavier than max_weight is a batch alone.
    For batch pipelines in the global window."""

    def __init__(self, max_weight: int, weight: Callable[[Any], int], max_count: int | None = None):
        self._max_weight = max_weight
        self._weight = weight
        self._max_count = max_count

    def start_bundle(self) -> None:
        self._batch: list[Any] = []
        self._batch_weight = 0

    def process(self, element: Any) -> Iterator[list[Any]]:
        weight = self._weight(element)
        full = self._max_count is not None and len(self._batch) >= self._max_count
        if self._batch and (full or self._batch_weight + weight > self._max_weight):
            yield self._batch
            self.start_bundle()
        self._batch.append(element)
        self._batch_weight += weight

    def finish_bundle(self) -> Iterator[WindowedValue]:
        if self._batch:
            yield WindowedValue(self._batch, GlobalWindow().max_timestamp(), [GlobalWindow()])
            self.start_bundle()
