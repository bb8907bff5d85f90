"""The statistics stage's Beam step: a trace's blocks through one shard function per shard."""

from __future__ import annotations

from collections.abc import Callable

import apache_beam as beam
import numpy as np

from transforms.stats.trace_shards import by_shard


class ShardStep(beam.PTransform):
    """Blocks to shards of one key; each shard's whole table through one shard function."""

    def __init__(self, key: Callable[[np.ndarray], np.ndarray], analyse: Callable[[np.ndarray], object],
                 shards: int):
        super().__init__()
        self._key, self._analyse, self._shards = key, analyse, shards

    def expand(self, chunks: beam.PCollection) -> beam.PCollection:
        key, analyse, shards = self._key, self._analyse, self._shards
        return (
            chunks
            | "Split" >> beam.FlatMap(lambda c: by_shard(c.blocks, key(c.blocks), shards))
            | "Group" >> beam.GroupByKey()
            | "Analyse" >> beam.MapTuple(lambda _, tables: analyse(np.concatenate(list(tables))))
        )
