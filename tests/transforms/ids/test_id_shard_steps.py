"""The stream's id map as keyed Beam steps (ids/steps.py: SeenShard, NumberNew, ShardStore):
windows delivered in any order, each window's ids are those of the one-process numbering."""

import random

import numpy as np
import pytest

from kvtrace.transforms.ids.dense_ids import OCCURRENCE
from kvtrace.transforms.ids.id_shards import empty_shard, number_window, placed, window_parts

KINDS = ("blocks", "sessions")


def window_keys(window: int, kind: int, rng: np.random.Generator) -> np.ndarray:
    """A window's occurrences: few distinct hashes, so windows share many; some high halves
    shared, as the stores' searches must tell apart."""
    count = int(rng.integers(0, 40))
    keys = np.zeros(count, OCCURRENCE)
    drawn = rng.integers(0, 60, count).astype(np.uint64) + np.uint64(1000 * kind)
    keys["hi"], keys["lo"] = drawn // np.uint64(4), drawn * np.uint64(0x9E3779B97F4A7C15)
    keys["ts"] = window * 100 + rng.integers(0, 100, count)
    keys["fp"], keys["pos"], keys["weight"] = (
        rng.integers(0, 3, count),
        rng.integers(0, 5, count),
        1,
    )
    return keys


@pytest.mark.beam
@pytest.mark.parametrize("shards", [1, 3])
def test_keyed_steps_number_windows_delivered_in_any_order_as_one_process(shards):
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.ids.steps import QUERY, NumberNew, SeenShard, ShardStore

    rng = np.random.default_rng(36)
    tables = {kind: [window_keys(w, k, rng) for w in range(5)] for k, kind in enumerate(KINDS)}
    expected, added = [], []
    for kind, windows in tables.items():
        parts = [empty_shard()] * shards
        for window, keys in enumerate(windows):
            numbered, parts = number_window(keys, parts, sum(len(p.ids) for p in parts))
            expected.append((window, kind, numbered.ids.tolist()))
            added.append((window, kind, numbered.added_count))
    seen_in, queries = [], []
    for kind, windows in tables.items():
        for window, keys in enumerate(windows):
            firsts, asked = window_parts(keys, shards)
            seen_in += [((kind, s), (window, part)) for s, part in enumerate(firsts)]
            queries += [((kind, s), (window, QUERY, query)) for s, query in enumerate(asked)]
    random.Random(36).shuffle(seen_in)  # the runner's delivery order: the steps restore it
    random.Random(37).shuffle(queries)

    def ids_of_window(key, answers):
        window, kind = key
        ids = placed(len(tables[kind][window]), [(rows, ids) for rows, ids in answers])
        return window, kind, ids.tolist()

    with TestPipeline() as pipeline:
        new = pipeline | "Seen" >> beam.Create(seen_in) | "SeenShard" >> beam.ParDo(SeenShard())
        numbered = new | "Number" >> beam.ParDo(NumberNew(shards)).with_outputs(
            NumberNew.ADDED, main="ids"
        )
        asked = pipeline | "Queries" >> beam.Create(queries)
        answers = (
            (numbered.ids, asked)
            | beam.Flatten()
            | "Store" >> beam.ParDo(ShardStore())
            | beam.MapTuple(lambda window, answer: ((window, answer[0]), answer[1:]))
            | beam.GroupByKey()
            | beam.MapTuple(ids_of_window)
        )
        assert_that(answers, equal_to(expected))
        counts = numbered[NumberNew.ADDED] | beam.MapTuple(lambda w, kind, new: (w, kind, len(new)))
        assert_that(counts, equal_to(added), label="added")
