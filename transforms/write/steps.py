"""The Beam step of writing: one trace shard per worker call."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np

from kvtrace.transforms.write.coarsen import Coarsening
from kvtrace.transforms.write.rows import RowBatch, shard_count
from kvtrace.transforms.write.shards import write_shard


class WriteShard(beam.DoFn):
    """(shard, row batches) in, (written path, sha256) out. `gate` is a side input that must be
    computed, and may fail the job, before any file is written."""

    def __init__(
        self,
        directory: str,
        coarsening: Coarsening = Coarsening(),
        hashes_directory: str | None = None,
        measured_directory: str | None = None,
    ):
        self._directory = directory
        self._coarsening = coarsening
        self._hashes_directory = hashes_directory
        self._measured_directory = measured_directory

    def process(
        self,
        element: tuple[int, Iterable[RowBatch | None]],
        plan: np.ndarray,
        origin: int,
        gate: object,
    ) -> Iterator[tuple[str, str]]:
        shard, batches = element
        # None marks shard 0, which always exists so that an empty trace still has its files.
        yield from write_shard(
            self._directory,
            shard,
            shard_count(plan),
            (b for b in batches if b),
            origin,
            self._coarsening,
            self._hashes_directory,
            self._measured_directory,
        )
