"""write/shards.py's files: a shard written is what the readers and the gate read back, the same
bytes however its rows arrived; its block hashes file, row by row; the names a block-hashes
folder may hold."""

from __future__ import annotations

import hashlib
import io
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.trace_format import (
    MAX_OUTPUT_LENGTH,
    columns_of_jsonl,
    is_jsonl_of,
    parquet_forms,
    shard_name,
)
from kvtrace.transforms.write.coarsen import Coarsening
from kvtrace.transforms.write.rows import ROW, RowBatch
from kvtrace.transforms.write.shards import (
    BLOCK_HASHES_OUTPUT,
    BLOCK_HASHES_SCHEMA,
    block_hashes_bytes,
    block_hashes_files,
    write_shard,
)

ORIGIN = 1_700_000_000_000
# (ms after the origin, input_length, output_length, session, response, ids, output ids)
ROWS = st.lists(
    st.tuples(
        st.integers(0, 10**6),
        st.integers(0, 99),
        st.integers(0, 99),
        st.integers(-1, 3),
        st.one_of(st.just(-1), st.integers(0, 10**5)),
        st.lists(st.integers(0, 50), max_size=4),
        st.lists(st.integers(51, 60), max_size=2),
    ),
    max_size=20,
)


def batch_of(rows: list, with_outputs: bool) -> RowBatch:
    table = np.zeros(len(rows), dtype=ROW)
    for i, (ms, isl, osl, session, response, ids, outputs) in enumerate(rows):
        table[i] = (
            ORIGIN + ms,
            hash((ms, isl, osl)) & 0xFFFF,
            isl,
            osl,
            session,
            i,
            len(ids),
            len(outputs) if with_outputs else 0,
            response,
            -1,  # no measured cached tokens
            0,  # no links
            i // 2 + 1 if i % 2 else 0,  # a parent (ROW: + 1) rides along as written
            0,  # continues nothing
            0,  # named by nothing
        )
    ids = np.array([i for row in rows for i in row[5]], dtype=np.int64)
    outputs = np.array([o for row in rows for o in row[6]], dtype=np.int64)
    return RowBatch(
        table, ids, ids.astype(np.uint64) + np.uint64(2**63), outputs if with_outputs else None
    )


def _written(
    batches: list[RowBatch], coarsening: Coarsening, shard: int = 1, shards: int = 3
) -> tuple[list[tuple[str, str]], dict[str, bytes]]:
    with tempfile.TemporaryDirectory() as folder:
        written = write_shard(folder, shard, shards, batches, ORIGIN, coarsening)
        files = {Path(p).name: Path(p).read_bytes() for p, _ in written}
    return [(Path(p).name, sha) for p, sha in written], files


@settings(max_examples=20, deadline=None)
@given(ROWS, st.booleans(), st.sampled_from([Coarsening(), Coarsening(250, 10)]))
def test_a_written_shard_reads_back_as_the_gate_reads_it(rows, with_outputs, coarsening):
    written, files = _written([batch_of(rows, with_outputs)], coarsening)
    jsonl, parquet = shard_name(1, 3, ".jsonl"), shard_name(1, 3, ".parquet")
    assert [name for name, _ in written] == [jsonl, parquet]
    assert all(hashlib.sha256(files[name]).hexdigest() == sha for name, sha in written)
    from_jsonl = columns_of_jsonl(files[jsonl])
    assert is_jsonl_of(files[jsonl], from_jsonl)
    assert files[parquet] in parquet_forms(from_jsonl)  # the twins hold the same rows
    assert len(from_jsonl) == len(rows)
    assert from_jsonl.timestamp.tolist() == sorted(from_jsonl.timestamp.tolist())
    assert (from_jsonl.timestamp % coarsening.timestamp_ms == 0).all()
    assert sorted(from_jsonl.ids.tolist()) == sorted(i for row in rows for i in row[5])


@settings(max_examples=20, deadline=None)
@given(ROWS, st.booleans(), st.randoms(use_true_random=False))
def test_the_bytes_do_not_depend_on_how_the_rows_arrived(rows, with_outputs, random):
    """Workers hand a shard its rows in batches of any size and order: same files."""
    whole = batch_of(rows, with_outputs)
    order = list(range(len(rows)))
    random.shuffle(order)
    cuts = sorted(random.sample(range(len(order) + 1), min(3, len(order) + 1)))
    pieces = [
        whole.select(np.array(order[a:b], dtype=np.int64))
        for a, b in zip([0, *cuts], [*cuts, len(order)])
    ]
    assert _written(pieces, Coarsening(100, 5)) == _written([whole], Coarsening(100, 5))


def test_an_empty_shard_still_has_both_files_and_they_read_back_empty():
    _, files = _written([], Coarsening(), shard=0, shards=1)
    assert files[shard_name(0, 1, ".jsonl")] == b""
    assert files[shard_name(0, 1, ".parquet")] in parquet_forms(columns_of_jsonl(b""))


def test_the_block_hashes_file_gives_each_blocks_row_position_id_and_hash():
    batch = batch_of(
        [(0, 1, 1, -1, -1, [5, 6], []), (1, 1, 1, -1, -1, [], []), (2, 1, 1, -1, -1, [7], [])],
        with_outputs=False,
    )
    table = pq.read_table(io.BytesIO(block_hashes_bytes(batch)))
    assert table.schema.equals(BLOCK_HASHES_SCHEMA, check_metadata=True)
    assert table.to_pydict() == {
        "row": [0, 0, 2],
        "position": [0, 1, 0],
        "id": [5, 6, 7],
        "hash": [2**63 + 5, 2**63 + 6, 2**63 + 7],
    }
    assert b"never publish" in table.schema.metadata[b"private"]


def test_a_block_hashes_folder_holds_only_the_names_kvtrace_writes_there(tmp_path):
    assert block_hashes_files(str(tmp_path / "absent")) == frozenset()
    names = [
        "block-hashes-00000-of-00002.parquet",
        "block-hashes-00001-of-00002.parquet",
        BLOCK_HASHES_OUTPUT,
        "block-hashes-0-of-2.parquet",
        "notes.txt",
        shard_name(0, 1, ".jsonl"),
        "block-hashes-00000-of-00002.parquet.bak",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert block_hashes_files(str(tmp_path)) == frozenset(names[:3])


@pytest.mark.parametrize(
    "column, value, field",
    [("output_length", MAX_OUTPUT_LENGTH + 1, "output_length"), ("timestamp_ms", -1, "timestamp")],
)
def test_a_row_past_the_published_ranges_stops_the_run_before_any_write(
    tmp_path, column, value, field
):
    """The writer holds each shard to the ranges the audit holds rows to (trace_format.
    check_values): a row past them stops the night in one line, no file written."""
    batch = batch_of([(0, 4, 1, -1, -1, [0], [])], with_outputs=False)
    batch.rows[column] = value if column != "timestamp_ms" else ORIGIN + value
    with pytest.raises(JobStopped, match=f"trace shard 1: integers outside .*: {field};"):
        write_shard(str(tmp_path), 1, 3, [batch], ORIGIN, Coarsening(), str(tmp_path / "h"))
    assert list(tmp_path.iterdir()) == []
