"""--input words: which files they name (paths.expand_inputs); Parquet read within a bound, one
row sized before it is decoded (paths.read_parquet_within, python_values)."""

from __future__ import annotations

import logging
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvtrace.transforms.read.paths import (
    _check_writer,
    expand_inputs,
    python_values,
    read_parquet_within,
)


def test_an_existing_path_is_the_file_whatever_its_characters(tmp_path):
    named = tmp_path / "x[1].jsonl"  # as a glob: x1.jsonl
    for path in (named, tmp_path / "x1.jsonl"):
        path.write_text("{}\n")
    assert expand_inputs([str(named)]) == [str(named)]
    assert expand_inputs([str(tmp_path / "x[0-9].jsonl")]) == [str(tmp_path / "x1.jsonl")]


def test_one_file_by_many_names_is_read_once_under_its_first_name(tmp_path, monkeypatch, caplog):
    path = tmp_path / "in.jsonl"
    path.write_text("{}\n")
    (tmp_path / "link.jsonl").symlink_to(path)
    os.link(path, tmp_path / "hard.jsonl")
    monkeypatch.chdir(tmp_path)
    names = [
        "in.jsonl",
        f"{tmp_path}/./in.jsonl",
        str(tmp_path / "*.jsonl"),
        "link.jsonl",
        "./in.jsonl",
    ]
    with caplog.at_level(logging.WARNING, "kvtrace"):
        once = expand_inputs(names)
    assert once == ["./in.jsonl"]  # the least of its names, in sorted order
    assert expand_inputs(list(reversed(names))) == once
    assert "one file named 7 ways" in caplog.text


def test_distinct_files_are_all_kept(tmp_path):
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_text("{}\n")
    assert expand_inputs([str(tmp_path / "*.jsonl"), str(tmp_path / "a.jsonl")]) == [
        str(tmp_path / "a.jsonl"),
        str(tmp_path / "b.jsonl"),
    ]


@pytest.mark.parametrize("path", ["/proc/self/status", "/dev/null"])
def test_a_file_that_is_not_regular_or_whose_size_is_untrue_is_refused(path):
    with pytest.raises(ValueError, match="not a regular file|size cannot be trusted"):
        expand_inputs([path])


def test_a_dangling_link_is_kept_for_its_read_to_dead_letter(tmp_path):
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "missing")
    assert expand_inputs([str(tmp_path / "gone.jsonl")]) == [str(tmp_path / "gone.jsonl")]


def test_a_parquet_read_takes_only_its_columns_and_reports_rows_over_the_bound(tmp_path):
    """Rows are numbered in the file across row groups; a row over the bound (its entry in a
    dictionary page within the page ceiling) is reported by its number, never decoded; a
    column not asked for is not read, whatever it holds."""
    path = tmp_path / "trace.parquet"
    pq.write_table(
        pa.table(
            {
                "n": list(range(6)),
                "s": ["a", "b", "x" * 5000, "c", "d", "e"],
                "junk": [b"y" * 50_000] * 6,
            }
        ),
        path,
        row_group_size=4,
    )
    table, numbers, oversized = read_parquet_within(str(path), 4000, ("n", "s"))
    assert table.column_names == ["n", "s"]
    assert table["n"].to_pylist() == [0, 1, 3, 4, 5]
    assert numbers.tolist() == [1, 2, 4, 5, 6]
    assert [row for row, _ in oversized] == [3]


def test_a_dictionary_column_is_read_as_one_its_entries_shared_by_every_row(tmp_path):
    """A 2 KB file may reference one large entry from every row: it is held and converted
    once, not once per row; row groups read dense (no dictionary) join it as one column."""
    path = tmp_path / "bomb.parquet"
    entry = "x" * 200_000
    pq.write_table(
        pa.table({"s": [entry] * 50 + [None]}),
        path,
        dictionary_pagesize_limit=1 << 20,
        compression="zstd",
        row_group_size=30,
    )
    table = read_parquet_within(str(path), 1 << 20, ("s",)).table
    assert pa.types.is_dictionary(table["s"].type)
    values = python_values(table["s"])
    assert values[:50] == [entry] * 50 and values[50] is None
    assert len({id(value) for value in values[:30]}) == 1  # one row group: one object
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"s": ["a", "b"]}), plain, use_dictionary=False)
    assert python_values(read_parquet_within(str(plain), 1000, ("s",)).table["s"]) == ["a", "b"]


def test_a_parquet_page_over_the_bound_in_an_unread_column_does_not_refuse_the_file(tmp_path):
    path = tmp_path / "wide.parquet"
    pq.write_table(pa.table({"n": [1, 2], "junk": ["z" * 100_000] * 2}), path, use_dictionary=False)
    assert read_parquet_within(str(path), 1000, ("n",)).table["n"].to_pylist() == [1, 2]
    with pytest.raises(ValueError, match="junk"):
        read_parquet_within(str(path), 1000, ("n", "junk"))


def test_a_parquet_file_naming_a_column_twice_is_refused_before_any_row(tmp_path):
    path = tmp_path / "twice.parquet"
    pq.write_table(
        pa.Table.from_arrays([pa.array([1]), pa.array([2]), pa.array([3])], names=["a", "b", "a"]),
        path,
    )
    with pytest.raises(ValueError, match=r"naming a column twice \(a\)"):
        read_parquet_within(str(path), 1 << 20, ["a"])


@pytest.mark.parametrize(("lists", "refused"), [(63, False), (64, True), (5000, True)])
def test_a_parquet_column_nested_past_a_record_s_depth_is_refused_without_recursion(
    tmp_path, lists, refused
):
    """A row is one level and each list one more: 63 lists nest a row 64 deep, what a JSON
    record may (json_tree.MAX_NESTING_DEPTH); deeper is refused from the schema, walked
    without recursion however deep it goes."""
    kind = pa.int64()
    for _ in range(lists):
        kind = pa.list_(kind)
    path = tmp_path / "deep.parquet"
    pq.write_table(
        pa.table({"a": pa.array([1], pa.int64()), "deep": pa.nulls(1, kind)}),
        path,
        store_schema=False,
    )
    if refused:
        with pytest.raises(ValueError, match="column deep nests its rows deeper than 64"):
            read_parquet_within(str(path), 1 << 20, ["a"])
    else:
        assert read_parquet_within(str(path), 1 << 20, ["a"]).table["a"].to_pylist() == [1]


@pytest.mark.parametrize(
    "created_by",
    [
        "parquet-mr version 1.2.8 (build abc)",
        "parquet-mr version 1.2.8",
        "parquet-mr",  # no version: not known to be one with the fix
        "Parquet-MR version 1.2",
        "parquet-mr version 0.9.99",
    ],
)
def test_a_file_arrow_reads_past_its_chunks_stated_ends_is_refused(created_by):
    """Arrow pads a chunk's read by 100 bytes for parquet-mr before 1.2.9 (PARQUET-816): the
    page walk stops at the stated end, so such a file is refused, never half checked."""
    with pytest.raises(ValueError, match="PARQUET-816"):
        _check_writer("f.parquet", created_by)


@pytest.mark.parametrize(
    "created_by",
    [
        None,
        "parquet-cpp-arrow version 17.0.0",
        "parquet-mr version 1.2.9 (build x)",
        "parquet-mr version 1.12.3 (build f8dced182c4c1fbdec6ccb3185537b5a01e6ed6b)",
        "parquet-rs version 53.0.0",
    ],
)
def test_a_file_arrow_reads_within_its_chunks_is_accepted(created_by):
    _check_writer("f.parquet", created_by)


def test_a_chunk_named_by_many_row_groups_is_walked_once(tmp_path):
    """The page walk of an open file is kept by the bytes walked: a footer whose row groups
    all name one chunk costs its bytes once, not once per group."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from kvtrace.transforms.read.paths import checked_levels, chunk_pages

    buf = io.BytesIO()
    pq.write_table(pa.table({"ids": [[1, 2], [3]]}), buf)
    column = pq.ParquetFile(buf).metadata.row_group(0).column(0)
    assert chunk_pages(buf, column) is chunk_pages(buf, column)
    assert checked_levels(buf, column, 1) is checked_levels(buf, column, 1)
    assert checked_levels(buf, column, 1).rows == 2
    other = io.BytesIO(buf.getvalue())  # another open file: walked on its own
    assert chunk_pages(other, column) == chunk_pages(buf, column)
    assert chunk_pages(other, column) is not chunk_pages(buf, column)
