"""A Parquet row's size as JSON, at least, before it is decoded (arrow_sizes.py), and the read
that refuses or decodes rows by it (sources.read_range)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import records_of
from kvtrace.transforms.dead_letters import DeadLetter
from kvtrace.transforms.read.arrow_sizes import (
    CONTAINER_BYTES,
    column_json_bytes,
    fixed_value_bytes,
    largest_value_bytes,
)
from kvtrace.transforms.read.paths import group_reader, parquet_file
from kvtrace.transforms.read.records import CONTAINERS_BOUND_MULTIPLE, PARSED_CONTAINER_BYTES
from kvtrace.transforms.read.sources import FileRange


def least_bytes(batch: pa.RecordBatch) -> list[int]:
    """Each row's size: its columns' summed (arrow_sizes.column_json_bytes)."""
    return column_json_bytes(batch).sum(axis=1)


TEXT = st.one_of(st.none(), st.text(max_size=12))
MESSAGE = st.one_of(st.none(), st.fixed_dictionaries({"role": TEXT, "content": TEXT}))
ROW = st.fixed_dictionaries(
    {
        "prompt": TEXT,
        "n": st.one_of(st.none(), st.integers(-(2**40), 2**40)),
        "messages": st.one_of(st.none(), st.lists(MESSAGE, max_size=4)),
        "tags": st.one_of(st.none(), st.lists(TEXT, max_size=3)),
        "pair": st.one_of(st.none(), st.lists(TEXT, min_size=2, max_size=2)),
        "grid": st.one_of(
            st.none(),
            st.lists(
                st.one_of(
                    st.none(), st.lists(st.one_of(st.none(), st.integers(0, 99)), max_size=3)
                ),
                max_size=3,
            ),
        ),
    }
)
SCHEMA = pa.schema(
    [
        ("prompt", pa.string()),
        ("n", pa.int64()),
        ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("tags", pa.list_(pa.string())),
        ("pair", pa.list_(pa.string(), 2)),
    ]
)

# Lists of lists of numbers are sized per row from offsets (arrow_sizes._lists_of_alike_bytes).
ROW_SCHEMA = SCHEMA.append(pa.field("grid", pa.list_(pa.list_(pa.int64()))))


@settings(max_examples=80, deadline=None)
@given(st.lists(ROW, min_size=1, max_size=12), st.booleans(), st.integers(0, 11))
def test_the_count_never_exceeds_the_rows_json(rows, as_dictionaries, start):
    """A lower bound: a row refused by it is over the bound as a JSON line too (its bytes, or
    its containers at CONTAINER_BYTES each), whatever its shape, its nulls, its encoding
    (dictionary or not) or where its batch was sliced."""
    table = pa.Table.from_pylist(rows, ROW_SCHEMA)
    if as_dictionaries:
        table = table.set_column(0, "prompt", table["prompt"].dictionary_encode())
    batch = table.combine_chunks().to_batches()[0].slice(min(start, len(rows) - 1))
    sizes = least_bytes(batch)
    decoded = batch.to_pylist()
    assert len(sizes) == len(decoded)
    for size, row in zip(sizes, decoded):
        containers = _containers(list(row.values()))
        assert (
            0
            <= size
            <= len(json.dumps(row, ensure_ascii=False).encode()) + (CONTAINER_BYTES * containers)
        )


def _containers(values: list) -> int:
    """The lists and dicts among values, however nested."""
    count, stack = 0, list(values)
    while stack:
        value = stack.pop()
        if isinstance(value, (list, dict)):
            count += 1
            stack.extend(value.values() if isinstance(value, dict) else value)
    return count


def test_an_empty_container_counts_what_it_costs_as_a_python_value():
    """`[]` is 2 bytes of JSON and a ~56-byte Python list: a row of 4 M empty lists (a few KB
    of Parquet) counts CONTAINER_BYTES each, over a 4 MiB bound before any is decoded, as a
    JSON line of them is (records.py: 2 x the bound / 64 containers at most)."""
    empties = 4_000_000
    inner = pa.ListArray.from_arrays(
        pa.array([0] * (empties + 1), pa.int32()), pa.array([], pa.int8())
    )
    batch = pa.record_batch(
        {
            "junk": pa.ListArray.from_arrays(pa.array([0, empties], pa.int32()), inner),
            "empty_struct": pa.array([{"a": None}], pa.struct([("a", pa.int8())])),
        }
    )
    assert least_bytes(batch).tolist() == [CONTAINER_BYTES * empties + CONTAINER_BYTES]
    assert CONTAINER_BYTES == PARSED_CONTAINER_BYTES // CONTAINERS_BOUND_MULTIPLE
    assert CONTAINER_BYTES * empties > 4 << 20


def test_a_shared_dictionary_entry_counts_for_every_row_that_references_it():
    big = "hello " * 1000
    column = pa.array([big, "x", big]).dictionary_encode()
    batch = pa.record_batch([column], names=["prompt"])
    assert list(least_bytes(batch)) == [len(big) + 2, 3, len(big) + 2]


def test_rows_of_a_dictionary_bomb_over_the_bound_are_refused_undecoded(tmp_path):
    """One dictionary entry of 60 KB referenced by 200 rows (a ~1 KB file): each row is over a
    50 KB bound, so each is a too_large dead letter; the small rows around them are read."""
    path = tmp_path / "bomb.parquet"
    prompts = ["small"] + ["a" * 60_000] * 200 + ["small"]
    pq.write_table(
        pa.table({"prompt": pa.array(prompts).dictionary_encode()}), path, compression="zstd"
    )
    assert path.stat().st_size < 4096
    read = list(records_of(FileRange(str(path), 0, None), 50_000))
    kept = [record for record in read if not isinstance(record, DeadLetter)]
    refused = [record for record in read if isinstance(record, DeadLetter)]
    assert kept == [(str(path), {"prompt": "small"})] * 2
    assert len(refused) == 200 and {letter.reason for letter in refused} == {"too_large"}
    assert "row 1 not decoded: 60002 bytes as JSON at least" in refused[0].message
    assert "row 200 not decoded" in refused[-1].message


def test_rows_within_the_bound_read_as_they_always_were(tmp_path):
    """Read as dictionaries or not, the rows are the same Python values (a null field left
    out: records.without_nulls)."""
    rows = [
        {
            "prompt": f"p{i}" * (i % 5),
            "messages": [{"role": "user", "content": "hi"}],
            "n": i,
            "tags": None,
            "pair": ["a", None],
        }
        for i in range(300)
    ]
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows, SCHEMA), path, row_group_size=100)
    expected = [{k: v for k, v in row.items() if k != "tags"} for row in rows]
    assert [record for _, record in records_of(FileRange(str(path), 0, None), 1 << 20)] == expected


def test_only_chunks_indexed_by_their_dictionary_throughout_are_read_as_dictionaries(tmp_path):
    """A chunk that fell back to plain pages is read dense: as a dictionary, Arrow would grow
    one over the chunk and copy it into every batch (quadratic)."""
    path = tmp_path / "mixed.parquet"
    pq.write_table(
        pa.table(
            {
                "role": ["user", "assistant"] * 5000,
                "prompt": [f"unique prompt {i}" for i in range(10_000)],
            }
        ),
        path,
        dictionary_pagesize_limit=4096,
    )
    with parquet_file(str(path), 1 << 20) as (raw, parquet):
        reader, dense_row_bytes = group_reader(raw, parquet, 0)
    assert pa.types.is_dictionary(reader.schema_arrow.field("role").type)
    assert reader.schema_arrow.field("prompt").type == pa.string()
    # a row that indexes the dictionary decodes to no more than its largest entry (as JSON),
    # not its whole dictionary page (~21 KB): the rows are still read 64 at a time
    assert 0 < dense_row_bytes <= len('"unique prompt 9999"')


def test_the_largest_value_is_the_longest_string_with_its_quotes():
    assert largest_value_bytes(pa.array(["a", None, "abc"])) == 5
    assert largest_value_bytes(pa.array(["x" * 9, "y"]).dictionary_encode()) == 11
    assert largest_value_bytes(pa.array([], pa.string())) == 0


def test_a_fixed_size_binary_value_is_its_width_with_quotes():
    assert largest_value_bytes(pa.array([b"abc", None], pa.binary(3))) == 5
    assert least_bytes(pa.record_batch({"b": pa.array([None, b"ab"], pa.binary(2))})).tolist() == [
        4,
        4,
    ]  # a null is `null` as JSON


def test_a_fixed_size_physical_type_decodes_to_its_width():
    assert fixed_value_bytes("FIXED_LEN_BYTE_ARRAY", 3_900_000) == 3_900_000
    assert fixed_value_bytes("INT96", 0) == 12 and fixed_value_bytes("BOOLEAN", 0) == 1
    assert fixed_value_bytes("BYTE_ARRAY", 0) is None


def test_a_fixed_size_dictionary_chunk_counts_its_width_per_row(tmp_path):
    """Arrow reads only strings as dictionaries: a dictionary-encoded FIXED_LEN_BYTE_ARRAY
    chunk is decoded dense, each row holding the type's width, so rows are read few at a time
    (one here: 64 x 100 KB is over the bound)."""
    path = tmp_path / "fixed.parquet"
    pq.write_table(
        pa.table({"b": pa.array([b"x" * 100_000] * 128, pa.binary(100_000))}),
        path,
        dictionary_pagesize_limit=1 << 20,
        compression="zstd",
    )
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).has_dictionary_page
    with parquet_file(str(path), 1 << 20) as (raw, parquet):
        reader, dense_row_bytes = group_reader(raw, parquet, 0)
    assert dense_row_bytes == 100_000
    rows = list(records_of(FileRange(str(path), 0, None), 150_000))
    assert len(rows) == 128 and not any(isinstance(row, DeadLetter) for row in rows)


def test_a_null_costs_what_json_spells_and_a_list_of_nulls_is_sized_from_its_offsets():
    """A list<null> holds no Arrow buffer for its values, yet each is `null` as JSON (and a
    None once decoded): 40 M of them are 160 MB at least, sized without an array per value."""
    import tracemalloc

    values = 40_000_000
    nulls = pa.ListArray.from_arrays(pa.array([0, values, values], pa.int32()), pa.nulls(values))
    numbers = pa.array([[1, None], None, []], pa.list_(pa.int64()))
    batch = pa.record_batch({"junk": nulls, "ids": numbers[:2], "prompt": pa.array([None, "a"])})
    tracemalloc.start()
    sizes = least_bytes(batch)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert sizes.tolist() == [4 * values + CONTAINER_BYTES + 4, CONTAINER_BYTES + 4 + 3]
    assert peak < 1 << 20, peak  # numpy's allocations are traced: nothing per value


@pytest.mark.parametrize("index", [3, -1, 1 << 30])
def test_a_dictionary_index_outside_its_entries_is_refused_not_read_past(index):
    """Arrow does not check a dictionary page's indices against its entries: a damaged page's
    index past them (or negative: numpy would read from the end) is a ValueError, not an
    IndexError or another entry's size."""
    damaged = pa.DictionaryArray.from_arrays(
        pa.array([0, index], pa.int32()), pa.array(["a", "bb", "ccc"]), safe=False
    )
    with pytest.raises(ValueError, match="outside its 3 entries"):
        least_bytes(pa.record_batch([damaged], ["s"]))


def test_a_null_rows_index_is_never_looked_at():
    indices = pa.array([2, None], pa.int32())
    column = pa.DictionaryArray.from_arrays(indices, pa.array(["a", "bb", "ccc"]))
    assert least_bytes(pa.record_batch([column], ["s"])).tolist() == [5, 4]
