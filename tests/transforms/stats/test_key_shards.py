"""analyze's one algorithm: the key-shard functions by hand, and N shards (the Beam engine's
split) giving exactly what one shard (the local engine) gives."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import trace_of
from kvtrace.transforms.read.trace_io import Trace
from kvtrace.transforms.stats import trace_blocks as blocks_module
from kvtrace.transforms.stats.key_shards import (
    PARTIAL,
    Rows,
    first_after_warmup,
    id_shard,
    prefix_shard,
    row_measures,
    row_sums,
)
from kvtrace.transforms.stats.trace_blocks import Blocks
from kvtrace.transforms.stats.trace_shards import by_shard, chunk_tables, rowkeys, shard_blocks
from kvtrace.transforms.stats.trace_stats import analyze

BLOCK_SIZE = 4  # as helpers.trace_of


def local_partials(trace: Trace) -> tuple[np.ndarray, Counter, dict]:
    blocks = Blocks.of(trace)
    by_id, by_prefix = id_shard(blocks), prefix_shard(blocks)
    return (
        np.concatenate([by_id.partials, by_prefix.partials]),
        by_id.counts + by_prefix.counts,
        by_id.problem_ids,
    )


def test_id_shard_by_hand():
    # Rows: [0 1 2], [0 1 3], [3 0]: row 1's first unseen id is 3 (position 2); row 2 has none
    # unseen (3 was seen in row 1); pairs (0,0) (1,1) repeat; id 0 sits at two positions.
    trace = trace_of([(0, 0.0, [0, 1, 2]), (0, 1.0, [0, 1, 3]), (0, 2.0, [3, 0])])
    result = id_shard(Blocks.of(trace))
    assert result.partials["unseen_pos"].tolist() == [0, 2, -1]
    assert result.partials["repeated"].tolist() == [2, 2, 0]
    assert result.counts["num_prefix_groups"] == 1  # rows starting with 0
    assert result.problem_ids["ids_at_several_positions"].tolist() == [0, 3]
    assert result.problem_ids["ids_behind_several_parents"].tolist() == [0, 3]


def test_misses_end_with_the_last_block_and_weigh_its_real_tokens():
    # Second row shares one block: it misses blocks 1 and 2, the last one holding 3 tokens.
    trace = trace_of([(0, 0.0, [0, 1]), (0, 1.0, [0, 2, 3])])
    partials, _, _ = local_partials(trace)
    rows = Rows(
        np.arange(2), trace.timestamp, trace.input_length, trace.output_length, trace.lengths
    )
    measured = row_measures(rows, partials, BLOCK_SIZE, None)
    assert measured.misses.tolist() == [2, 2]
    assert measured.miss_tokens.tolist() == [7, 7]  # 4 + 3, and 4 + 3 of 11 tokens
    assert row_sums(rows, measured)["tokens"] == 7 + 11


# (file, timestamp, hash ids): few ids and times, so that ids repeat, move and tie.
rows_strategy = st.lists(
    st.tuples(
        st.integers(0, 2), st.integers(0, 6).map(float), st.lists(st.integers(0, 9), max_size=6)
    ),
    min_size=1,
    max_size=25,
)


def beam_like(trace: Trace, shards: int) -> tuple[np.ndarray, Counter, dict]:
    """The Beam engine's split: each file's block table to id and prefix shards, the key-shard
    functions on each, partials and counts gathered."""
    tables = [chunk_tables(_file(trace, f), BLOCK_SIZE)[1] for f in np.unique(trace.file_index)]
    partials, counts, problems = [], Counter(), {}
    for key, measure, options in (
        ("id", id_shard, {"id_divisor": shards}),
        ("prefix_lo", prefix_shard, {"with_prefix": True}),
    ):
        grouped: dict[int, list[np.ndarray]] = {}
        for table in tables:
            for shard, part in by_shard(table, table[key], shards):
                grouped.setdefault(shard, []).append(part)
        for parts in grouped.values():
            result = measure(shard_blocks(parts, **options))
            partials.append(result.partials)
            counts += result.counts
            for name, ids in result.problem_ids.items():
                problems[name] = np.union1d(problems.get(name, np.zeros(0, np.int64)), ids)
    return np.concatenate(partials or [np.zeros(0, PARTIAL)]), counts, problems


def _file(trace: Trace, index: int) -> Trace:
    rows = np.flatnonzero(trace.file_index == index)
    offsets = trace.offsets[rows[0] : rows[-1] + 2]
    return Trace(
        trace.timestamp[rows],
        trace.input_length[rows],
        trace.output_length[rows],
        offsets - offsets[0],
        trace.ids[offsets[0] : offsets[-1]],
        None,
        trace.line[rows],
        trace.file_index[rows],
        trace.files,
    )


@settings(max_examples=60, deadline=None)
@given(rows_strategy, st.integers(1, 5), st.sampled_from([0.0, 0.5, 0.9]))
def test_n_key_shards_measure_what_one_shard_measures(rows, shards, warmup):
    trace = trace_of(rows)
    keys = rowkeys(trace)  # the Beam engine names rows by file and line
    columns = Rows(keys, trace.timestamp, trace.input_length, trace.output_length, trace.lengths)
    key = first_after_warmup(columns.timestamp, keys, warmup)
    local, local_counts, local_problems = local_partials(trace)
    local["rowkey"] = keys[local["rowkey"]]
    sharded, counts, problems = beam_like(trace, shards)
    one, many = (row_measures(columns, p, BLOCK_SIZE, key) for p in (local, sharded))
    for name in ("context", "hit_rate", "per_request", "miss_tokens", "misses", "after_warmup"):
        assert getattr(one, name).tolist() == getattr(many, name).tolist(), name
    assert row_sums(columns, one) == row_sums(columns, many)
    assert +counts == +local_counts
    for name, ids in local_problems.items():
        assert ids.tolist() == problems.get(name, np.zeros(0)).tolist()


@settings(max_examples=40, deadline=None)
@given(rows_strategy, st.integers(1, 9))
def test_the_report_does_not_depend_on_how_many_blocks_a_temporary_holds(rows, chunk):
    """Per-block temporaries are built CHUNK_BLOCKS at a time: any chunk size, the same report
    (rows straddle chunk edges whenever chunk is below their length)."""
    trace = trace_of(rows)
    whole = analyze(trace, BLOCK_SIZE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(blocks_module, "CHUNK_BLOCKS", chunk)
        assert analyze(trace, BLOCK_SIZE) == whole
