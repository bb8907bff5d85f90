"""--input words: which files they name (paths.expand_inputs); Parquet read within a bound, one
row sized before it is decoded (paths.read_parquet_within, python_values)."""

from __future__ import annotations

import copy
import io
import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import parquet_footer, thrift_decode, thrift_encode, thrift_field, with_parquet_footer
from kvtrace.transforms.read.parquet_payload import byte_array_ends
from kvtrace.transforms.read.paths import (
    FOOTER_STRUCT_BYTES,
    FOOTER_WEIGHT_FLOOR,
    SCHEMA_ELEMENT_BYTES,
    FooterOverBound,
    StrayBytes,
    _FooterWalk,
    _Named,
    _OverWeight,
    _page_header,
    _unraised,
    check_footer,
    chunk_pages,
    column_bytes,
    expand_inputs,
    group_bytes,
    parquet_file,
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
    column not asked for is not read, whatever its values weigh (each over the bound)."""
    path = tmp_path / "trace.parquet"
    pq.write_table(
        pa.table(
            {
                "n": list(range(6)),
                "s": ["a", "b", "x" * 5000, "c", "d", "e"],
                "junk": [b"y" * 5000] * 6,
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


def test_a_page_over_the_ceiling_in_a_column_not_read_refuses_its_group(tmp_path):
    """Such a page is left unchecked when the file is opened (paths._check_chunks), so a
    reader refuses its group whatever columns it reads: no unchecked byte is read past."""
    path = tmp_path / "trace.parquet"
    junk = [b"y" * 50_000, b"z" * 50_000]
    pq.write_table(pa.table({"n": [0, 1], "junk": junk}), path)
    with pytest.raises(ValueError, match="column junk has a page of .* over the reader's ceiling"):
        read_parquet_within(str(path), 4000, ("n",))


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
    bound = 16 << 20  # a footer of 10,000 schema elements within it (check_footer)
    if refused:
        with pytest.raises(ValueError, match="column deep nests its rows deeper than 64"):
            read_parquet_within(str(path), bound, ["a"])
    else:
        assert read_parquet_within(str(path), bound, ["a"]).table["a"].to_pylist() == [1]


def _two_pages(path) -> None:
    """A Parquet file whose one column chunk holds two pages of one value each."""
    pq.write_table(
        pa.table({"a": pa.array([1, 2], pa.int64())}), path, compression="none",
        use_dictionary=False, write_statistics=False, data_page_size=1, write_batch_size=1,
    )  # fmt: skip


def test_a_chunk_whose_pages_hold_fewer_values_than_its_footer_is_refused(tmp_path):
    """Arrow reads a chunk's pages until they hold its footer's values, past the stated end
    (by 100 bytes for what it takes for an old parquet-mr) where the walk does not look: a
    chunk whose stated bytes end before that is refused (the footer's writer is not read at
    all: tests/e2e/test_redteam_input_round9.py names it), and the whole chunk passes."""
    from types import SimpleNamespace

    path = tmp_path / "two.parquet"
    _two_pages(path)
    column = pq.ParquetFile(path).metadata.row_group(0).column(0)
    with open(path, "rb") as raw:
        pages = chunk_pages(raw, column)
    assert [page.values for page in pages] == [1, 1]
    first_page_end = pages[0].start + pages[0].stored
    fields = ("data_page_offset", "has_dictionary_page", "dictionary_page_offset",
              "num_values", "path_in_schema")  # fmt: skip
    cut = SimpleNamespace(
        **{name: getattr(column, name) for name in fields},
        total_compressed_size=first_page_end - column.data_page_offset,
    )
    with open(path, "rb") as raw, pytest.raises(ValueError, match="hold 1 values, its footer 2"):
        chunk_pages(raw, cut)


def test_a_page_header_is_read_by_its_type_as_arrow_reads_it(tmp_path):
    """A page whose type says v2 but which carries a v1 header: Arrow reads it by its type (a
    v2 header of no values), so the walk does too, and refuses it as damaged."""
    path = tmp_path / "two.parquet"
    _two_pages(path)
    column = pq.ParquetFile(path).metadata.row_group(0).column(0)
    data = bytearray(path.read_bytes())
    at = column.data_page_offset
    assert data[at : at + 2] == b"\x15\x00"  # PageHeader.type: DATA_PAGE
    data[at + 1] = 6  # DATA_PAGE_V2, zigzag
    with pytest.raises(ValueError, match="damaged page header"):
        chunk_pages(io.BytesIO(bytes(data)), column)


def _wide(columns: int, groups: int = 1) -> bytes:
    table = pa.table({f"c{i}": pa.nulls(groups) for i in range(columns)})
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=1, write_statistics=False)
    return sink.getvalue()


def _footer(data: bytes) -> bytes:
    size = int.from_bytes(data[-8:-4], "little")
    return data[-8 - size : -8]


@pytest.mark.parametrize("columns, groups", [(1, 1), (40, 1), (3, 30)])
def test_a_footer_is_weighed_by_its_structs_and_schema_elements(columns, groups):
    """Every struct is weighed, at any depth (at least a column chunk and its metadata per
    column per row group, and each schema element), each schema element the more, and the
    walk stops as soon as the weight is over."""
    data = _wide(columns, groups)
    weight = _FooterWalk(_footer(data)).weight(1 << 40)
    structs = 1 + (columns + 1) + groups * (1 + 2 * columns)
    assert weight >= structs * FOOTER_STRUCT_BYTES + (columns + 1) * SCHEMA_ELEMENT_BYTES
    assert _FooterWalk(_footer(data)).weight(weight) == weight
    with pytest.raises(_OverWeight):
        _FooterWalk(_footer(data)).weight(weight - 1)


def test_a_footer_is_bounded_in_weight_by_the_bound_with_a_floor():
    footer = _footer(_wide(1000))
    weight = _FooterWalk(footer).weight(1 << 40)
    assert weight > FOOTER_WEIGHT_FLOOR
    with pytest.raises(FooterOverBound, match="too many schema elements and column chunks"):
        check_footer("f", footer, weight - 1)
    check_footer("f", footer, weight)
    check_footer("f", _footer(_wide(40)), 1000)  # a small bound reads a few columns


def test_a_file_of_many_columns_is_refused_before_arrow_parses_its_footer(tmp_path, monkeypatch):
    """Within the bound in bytes, over it in weight: refused as too large (FooterOverBound),
    Arrow's reader never built."""
    from kvtrace.transforms.read import paths

    path = tmp_path / "wide.parquet"
    path.write_bytes(_wide(2000))
    assert len(_footer(path.read_bytes())) < 1 << 20

    def never(*args, **kwargs):
        raise AssertionError("Arrow parsed the footer")

    monkeypatch.setattr(paths.pq, "ParquetFile", never)
    with pytest.raises(FooterOverBound, match="too many schema elements"):
        read_parquet_within(str(path), 1 << 20, ["c0"])


@pytest.mark.parametrize(
    "footer, says",
    [
        (b"\x19" * 200 + b"\x00", "nested too deep"),  # lists of lists, 200 deep
        (b"\x15\x02\x19\x2c", "ends inside a value"),  # a list of 2 structs cut short
        (b"\x1d", "unknown Thrift type 13"),
    ],
)
def test_a_footer_that_is_not_thrift_is_refused_in_one_line_without_recursion(footer, says):
    with pytest.raises(ValueError, match=says) as refused:
        check_footer("f", footer, 1 << 20)
    assert not isinstance(refused.value, FooterOverBound)


@given(st.binary(max_size=300))
def test_any_footer_bytes_are_weighed_or_refused_in_one_line(footer):
    try:
        check_footer("f", footer, 1 << 20)
    except ValueError:  # FooterOverBound too
        pass


def test_a_list_of_numbers_is_skipped_whole():
    """A footer's lists of integers (encodings, offsets) are stepped over at C speed: a list
    of 100,000 varints in one step, the struct after it still counted."""
    varints = b"\xff\x7f" * 100_000  # zigzag 8191, two bytes each
    size = bytearray()
    n = 100_000
    while n >= 0x80:
        size.append(n & 0x7F | 0x80)
        n >>= 7
    size.append(n)
    # field 1: list<i32> of 100,000; field 2: an empty struct; the struct's end
    footer = b"\x19\xf5" + bytes(size) + varints + b"\x1c\x00" + b"\x00"
    assert _FooterWalk(footer).weight(1 << 20) == 2 * FOOTER_STRUCT_BYTES


def test_a_chunk_named_by_many_row_groups_is_walked_once(tmp_path):
    """The page walk of an open file is kept by the bytes walked: the page checks, the row
    count and the reader's sizing of one chunk cost its bytes once, not once each."""
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


@pytest.mark.parametrize("claimed", [0, 2, 4])
@pytest.mark.parametrize("columns", [("n", "ids"), ("ids",), ("absent",)])
def test_a_row_group_whose_footer_claims_other_rows_than_its_pages_hold_is_refused(
    tmp_path, claimed, columns
):
    """Arrow reads a group up to its footer's count: the rows its pages hold are counted from
    them, read or not (a list column's from its repetition levels when no flat one is
    read)."""
    buffer = io.BytesIO()
    table = pa.table({"n": [1, 2, 3, 4, 5, 6], "ids": [[1, 2], [3], [], [4], [5, 6], [7]]})
    pq.write_table(table, buffer, row_group_size=3)
    footer, body = parquet_footer(buffer.getvalue())
    thrift_field(thrift_field(footer, 4)[2][1][1], 3)[2] = claimed
    path = tmp_path / "t.parquet"
    path.write_bytes(with_parquet_footer(body, footer))
    with pytest.raises(ValueError, match=f"row group 1's pages hold 3 rows of .*claims {claimed}"):
        read_parquet_within(str(path), 1 << 20, columns)


@pytest.mark.parametrize("claimed", [0, 5])
def test_a_row_group_of_no_column_holds_no_row_whatever_its_footer_claims(tmp_path, claimed):
    """A group of no column chunk has no page to count from: it holds no row, and a footer
    claiming more is a damaged file, never a count Arrow reads rows of nothing to."""
    buffer = io.BytesIO()
    pq.write_table(pa.table({"a": [1]}), buffer, store_schema=False)
    footer, _ = parquet_footer(buffer.getvalue())
    group = thrift_field(footer, 4)[2][1][0]
    thrift_field(footer, 2)[2] = (12, [[[4, 8, b"schema"], [5, 5, 0]]])  # the root alone
    thrift_field(group, 1)[2] = (12, [])
    footer = [field for field in footer if field[0] != 7]  # nor a column order
    thrift_field(footer, 3)[2] = thrift_field(group, 3)[2] = claimed
    thrift_field(group, 2)[2] = 0  # its bytes: none
    path = tmp_path / "t.parquet"
    path.write_bytes(with_parquet_footer(b"PAR1", footer))
    if claimed:
        with pytest.raises(ValueError, match=f"hold 0 rows of no column, .* claims {claimed}"):
            read_parquet_within(str(path), 1 << 20, ["a"])
    else:
        assert read_parquet_within(str(path), 1 << 20, ["a"]).numbers.tolist() == []


def test_a_file_without_a_column_required_is_refused_before_its_rows(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"note": ["x"]}), path)
    with pytest.raises(ValueError, match="no input_length column"):
        read_parquet_within(str(path), 1 << 20, ["input_length"], required=["input_length"])
    assert read_parquet_within(str(path), 1 << 20, ["note"], required=["note"]).numbers == [1]


def _six_rows_in_two_groups() -> tuple[list, bytes]:
    buffer = io.BytesIO()
    pq.write_table(
        pa.table({"n": [1, 2, 3, 4, 5, 6], "ids": [[1], [2], [], [3], [4, 5], [6]]}), buffer, 3
    )
    return parquet_footer(buffer.getvalue())


@pytest.mark.parametrize("tail", [b"", b"\0" * 5000])
def test_zeros_between_the_parts_a_footer_lists_are_a_writers_padding(tmp_path, tail):
    """parquet-mr pads row groups with zeros: a gap of them reads as nothing lost."""
    footer, body = _six_rows_in_two_groups()
    path = tmp_path / "t.parquet"
    path.write_bytes(with_parquet_footer(body + tail, footer))
    assert read_parquet_within(str(path), 1 << 20, ["n"]).table["n"].to_pylist() == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]


@pytest.mark.parametrize("tail", [b"\1", b"\0" * 4000 + b"x" + b"\0" * 100])
def test_bytes_a_footer_does_not_list_refuse_the_trace_and_are_weighed(tmp_path, tail):
    footer, body = _six_rows_in_two_groups()
    path = tmp_path / "t.parquet"
    path.write_bytes(with_parquet_footer(body + tail, footer))
    with pytest.raises(
        ValueError, match=f"{len(tail)} bytes from byte {len(body)} on lie in no part"
    ):
        read_parquet_within(str(path), 1 << 20, ["n"])
    stray: list = []
    with parquet_file(str(path), 1 << 20, stray=stray):
        pass
    assert stray == [StrayBytes(len(body), len(tail))]


def test_a_column_chunk_a_footer_names_twice_refuses_the_file(tmp_path):
    """Row group 1 naming row group 0's chunks (its own left unread): no writer makes that."""
    footer, body = _six_rows_in_two_groups()
    groups = thrift_field(footer, 4)[2][1]
    groups[1] = copy.deepcopy(groups[0])
    path = tmp_path / "t.parquet"
    path.write_bytes(with_parquet_footer(body, footer))
    stray: list = []
    with pytest.raises(ValueError, match="overlap at byte 4 .a column chunk named twice"):
        with parquet_file(str(path), 1 << 20, stray=stray):
            pass


def test_the_metadata_copy_a_writer_leaves_behind_a_chunk_is_accounted_for(tmp_path):
    """The spec's first layout (polars, parquet-cpp 1.x): each chunk's metadata written again
    behind its pages. Such a copy reads as part of the file; bytes that only look like one
    (another chunk's metadata, or one decoding alike whose strings hold more) do not."""
    buffer = io.BytesIO()
    pq.write_table(pa.table({"n": [1, 2, 3]}), buffer)
    footer, body = parquet_footer(buffer.getvalue())
    chunk = thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1][0]
    copied = thrift_encode(thrift_field(chunk, 3)[2])
    path = tmp_path / "t.parquet"
    path.write_bytes(with_parquet_footer(body + copied, footer))
    assert read_parquet_within(str(path), 1 << 20, ["n"]).table["n"].to_pylist() == [1, 2, 3]
    other = copy.deepcopy(thrift_field(chunk, 3)[2])
    thrift_field(other, 5)[2] += 1  # another num_values
    path.write_bytes(with_parquet_footer(body + thrift_encode(other), footer))
    with pytest.raises(ValueError, match="lie in no part"):
        read_parquet_within(str(path), 1 << 20, ["n"])
    alike = copy.deepcopy(thrift_field(chunk, 3)[2])
    thrift_field(alike, 3)[2] = (8, [b"n" + b"hidden row group" * 8])  # path_in_schema
    path.write_bytes(with_parquet_footer(body + thrift_encode(alike), footer))
    with pytest.raises(ValueError, match="lie in no part"):
        read_parquet_within(str(path), 1 << 20, ["n"])
    metadata = thrift_field(chunk, 3)[2]  # key-value metadata, in the footer and its copy
    metadata.append([8, 9, (12, [[[1, 8, b"k"], [2, 8, b"hidden row group" * 8]]])])
    metadata.sort(key=lambda field: field[0])
    path.write_bytes(with_parquet_footer(body + thrift_encode(metadata), footer))
    with pytest.raises(ValueError, match="lie in no part"):
        read_parquet_within(str(path), 1 << 20, ["n"])


@pytest.mark.parametrize("carrier", ["an unknown field", "its statistics", "its path"])
def test_a_metadata_copy_holding_strings_no_check_holds_is_stray(tmp_path, carrier):
    """A copy counts only when read closed, its path its column's and its statistics' strings
    bytes its pages hold: polars' copies of a string column (its name holding a dot, as a path
    joins names), statistics and all, count; one
    carrying a field the format does not define, a max no page holds or another path, not."""
    buffer = io.BytesIO()
    pq.write_table(pa.table({"s.t": ["apple", "banana", "cherry"]}), buffer)
    footer, body = parquet_footer(buffer.getvalue())
    chunk = thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1][0]
    metadata = thrift_field(chunk, 3)[2]
    path = tmp_path / "t.parquet"
    path.write_bytes(with_parquet_footer(body + thrift_encode(metadata), footer))
    assert read_parquet_within(str(path), 1 << 20, ["s.t"]).table.num_rows == 3
    if carrier == "an unknown field":
        metadata.append([30, 8, b"hidden row group"])
    elif carrier == "its statistics":
        thrift_field(thrift_field(metadata, 12)[2], 5)[2] = b"hidden row group"  # max_value
    else:
        thrift_field(metadata, 3)[2] = (8, [b"hidden row group"])
    path.write_bytes(with_parquet_footer(body + thrift_encode(metadata), footer))
    with pytest.raises(ValueError, match="lie in no part"):
        read_parquet_within(str(path), 1 << 20, ["s.t"])


def test_a_bloom_filter_is_part_of_the_file_its_size_read_from_its_header_when_not_stated(tmp_path):
    """parquet-mr before the footer stated a bloom filter's length wrote its offset alone:
    its header tells its size. A filter no chunk points to is stray."""
    buffer = io.BytesIO()
    table = pa.table({"n": [1, 2, 3], "s": ["a", "b", "a"]})
    pq.write_table(table, buffer, bloom_filter_options={"s": {"ndv": 10}})
    footer, body = parquet_footer(buffer.getvalue())
    [_, strings] = thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1]
    metadata = thrift_field(strings, 3)[2]
    assert {14, 15} <= {field[0] for field in metadata}
    path = tmp_path / "t.parquet"
    for dropped, accounted in (({15}, True), ({14, 15}, False)):
        kept = [field for field in metadata if field[0] not in dropped]
        thrift_field(strings, 3)[2] = kept
        path.write_bytes(with_parquet_footer(body, footer))
        if accounted:
            assert read_parquet_within(str(path), 1 << 20, ["s"]).table.num_rows == 3
        else:
            with pytest.raises(ValueError, match="lie in no part"):
                read_parquet_within(str(path), 1 << 20, ["s"])


def test_pyarrows_file_of_an_empty_table_reads_as_no_rows(tmp_path):
    """Its row group's chunks hold a dictionary page and no data page (data page offset 0):
    their bytes are the dictionaries', not a walk from the file's magic."""
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"n": pa.array([], pa.int64()), "s": pa.array([], pa.string())}), path)
    column = pq.ParquetFile(path).metadata.row_group(0).column(0)
    assert column.data_page_offset == 0 and column.has_dictionary_page
    assert read_parquet_within(str(path), 1 << 20, ["n", "s"]).table.num_rows == 0


def _indexed(tmp_path, **options) -> tuple[list, bytes, list]:
    """Six rows in two groups of three, each column's pages indexed (and bloom filters as
    options say): the footer, the body, row group 0's column chunks (ColumnChunk's fields)."""
    buffer = io.BytesIO()
    table = pa.table({"n": [1, 2, 3, 4, 5, 6], "s": ["a", "b", "a", "c", "d", "c"]})
    pq.write_table(table, buffer, 3, write_page_index=True, **options)
    footer, body = parquet_footer(buffer.getvalue())
    return footer, body, thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1]


def _opens(tmp_path, footer: list, body: bytes) -> None:
    path = tmp_path / "t.parquet"
    path.write_bytes(with_parquet_footer(body, footer))
    with parquet_file(str(path), 1 << 20, stray=[]):
        pass


def test_a_page_index_is_accounted_for_only_as_the_index_of_its_chunks_pages(tmp_path):
    """An offset index must locate exactly its chunk's walked data pages, and a region claimed
    as a column index must decode as one, to its last byte: a claim alone accounts for none."""
    footer, body, chunks = _indexed(tmp_path)
    _opens(tmp_path, footer, body)  # pyarrow's own indexes
    numbers, strings = chunks
    offsets = [thrift_field(chunk, 4)[2] for chunk in chunks]
    thrift_field(numbers, 4)[2], thrift_field(strings, 4)[2] = offsets[::-1]  # swapped
    thrift_field(numbers, 5)[2], thrift_field(strings, 5)[2] = (
        thrift_field(strings, 5)[2],
        thrift_field(numbers, 5)[2],
    )
    with pytest.raises(ValueError, match="offset index at byte .* does not locate"):
        _opens(tmp_path, footer, body)
    footer, body, chunks = _indexed(tmp_path)
    numbers = chunks[0]
    for field in (6, 7):  # a column index claimed over its chunk's offset index
        thrift_field(numbers, field)[2] = thrift_field(numbers, field - 2)[2]
    with pytest.raises(ValueError, match="column index at byte .* is not one of its chunk"):
        _opens(tmp_path, footer, body)


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_a_column_indexs_level_histograms_are_its_pages_levels_in_i64s(tmp_path, version):
    """pyarrow's histograms of a nested column with nulls, pages of either version, read; one
    of another element type (its bytes verbatim), length or count is refused."""
    buffer = io.BytesIO()
    table = pa.table({"l": [[1, 2], None, [], [3], [None], [4]] * 50})
    pq.write_table(
        table,
        buffer,
        write_page_index=True,
        data_page_version=version,
        data_page_size=64,
        write_batch_size=16,
    )
    footer, body = parquet_footer(buffer.getvalue())
    _opens(tmp_path, footer, body)
    chunk = thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1][0]
    index, _ = thrift_decode(body, thrift_field(chunk, 6)[2])
    levels = thrift_field(index, 7)[2][1]
    assert len(thrift_field(index, 1)[2][1]) > 1 and len(levels) % 4 == 0  # pages; def 0..3
    edits = [(3, [1] * len(levels)), (6, [*levels, 0]), (6, [levels[0] + 1, *levels[1:]])]
    for edit in edits:  # a list<i8>, one count more, a page's levels one more
        thrift_field(index, 7)[2] = edit
        encoded = thrift_encode(index)
        thrift_field(chunk, 6)[2], thrift_field(chunk, 7)[2] = len(body), len(encoded)
        with pytest.raises(ValueError, match="column index at byte .* is not one of its chunk"):
            _opens(tmp_path, footer, body + encoded)


def test_a_bloom_filter_counts_only_as_the_bitset_its_chunks_values_set(tmp_path):
    """A bitset of the spec's header and size is accounted for only when it is the filter the
    chunk's values set: one bit off, its bytes hold what no reader consumes."""
    footer, body, chunks = _indexed(tmp_path, bloom_filter_options={"s": {"ndv": 10}})
    metadata = thrift_field(chunks[1], 3)[2]
    end = thrift_field(metadata, 14)[2] + thrift_field(metadata, 15)[2]
    flipped = body[: end - 1] + bytes([body[end - 1] ^ 1]) + body[end:]
    with pytest.raises(ValueError, match="bloom filter at byte .* not the one its chunk's values"):
        _opens(tmp_path, footer, flipped)


def test_a_bloom_filter_over_a_dictionary_array_holds_the_entries_its_group_names(tmp_path):
    """pyarrow writes a dictionary array's whole dictionary in each row group but sets each
    group's bloom filter from its values alone: the rebuild hashes the entries its pages
    name, so each group's filter is accounted for."""
    path = tmp_path / "c.parquet"
    table = pa.table({"s": pa.array(["a", "a", "a", "b", "b", "b"]).dictionary_encode()})
    pq.write_table(table, path, 3, bloom_filter_options={"s": {"ndv": 10}})
    stray: list = []
    with parquet_file(str(path), 1 << 20, stray=stray):
        pass
    assert stray == []


def test_a_column_index_value_counts_only_as_bytes_its_page_holds(tmp_path):
    """A column index's min and max are held to bytes its page's values hold (of a
    dictionary-encoded page, the entries its indices name): a max the page never held, even
    of the same length, is refused."""
    footer, body, chunks = _indexed(tmp_path)
    strings = chunks[1]
    start = thrift_field(strings, 6)[2]
    index = body[start : start + thrift_field(strings, 7)[2]]
    assert index.count(b"\x01b") == 1  # group 0's strings: a, b, a; its max "b"
    edited = body[:start] + index.replace(b"\x01b", b"\x01z") + body[start + len(index) :]
    with pytest.raises(ValueError, match="statistics .* are bytes its values do not hold"):
        _opens(tmp_path, footer, edited)


def test_a_dictionary_encoded_pages_statistics_are_held_to_the_entries_its_indices_name(tmp_path):
    """A dictionary-encoded page's min and max are entries its own indices name, not any of
    the chunk's dictionary: page 0 names `aaaaa` alone, so a max of `zzzzz` (page 1's entry,
    in the dictionary) is refused; each bound is looked up among the page's named entries,
    never searched through the dictionary (pages x dictionary bytes, round 18)."""
    buffer = io.BytesIO()
    table = pa.table({"s": ["aaaaa", "zzzzz"]})
    pq.write_table(table, buffer, data_page_size=1, write_batch_size=1, write_page_index=True)
    footer, body = parquet_footer(buffer.getvalue())
    _opens(tmp_path, footer, body)
    chunk = thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1][0]
    start = thrift_field(chunk, 6)[2]
    index, end = thrift_decode(body, start)
    assert thrift_field(index, 3)[2][1] == [b"aaaaa", b"zzzzz"]  # each page's max
    thrift_field(index, 3)[2][1][0] = b"zzzzz"
    edited = body[:start] + thrift_encode(index) + body[end:]
    with pytest.raises(ValueError, match="statistics .* are bytes its values do not hold"):
        _opens(tmp_path, footer, edited)


def test_a_bound_is_found_among_many_named_entries_sharing_its_prefix():
    """Among more named entries than are compared whole, all sharing a long prefix, a bound
    starts exactly the entries it starts: the narrowing by windows loses none and admits
    none an entry is too short for or the page does not name."""
    entries = [b"x" * 300 + b"%03d" % i for i in range(40)] + [b"x" * 10]
    dictionary = b"".join(len(entry).to_bytes(4, "little") + entry for entry in entries)
    named = _Named(byte_array_ends(dictionary, 0, len(entries)))
    named.next_page()[np.arange(0, 40, 2)] = True  # the even entries, and the short one
    named[40] = True
    found = named.found()
    assert named.starts_one(dictionary, found, b"x" * 300 + b"03")  # entries 30..38
    assert named.starts_one(dictionary, found, b"x" * 300 + b"038")
    assert not named.starts_one(dictionary, found, b"x" * 300 + b"039")  # not named
    assert not named.starts_one(dictionary, found, b"x" * 304)  # no entry's prefix
    assert named.starts_one(dictionary, found, b"x" * 10)


def test_a_dictionary_page_other_than_a_chunks_first_is_refused_at_its_header(tmp_path):
    """A chunk holds one dictionary, its first page: a second (its first repeated, the footer's
    sizes moved to match) is refused by the page walk, before any page is decompressed, so a
    chunk's check never holds more than one dictionary."""
    buffer = io.BytesIO()
    pq.write_table(pa.table({"s": ["a", "b"]}), buffer)
    data = buffer.getvalue()
    column = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(0)
    start, pages = column.dictionary_page_offset, column.data_page_offset
    footer, body = parquet_footer(data)
    metadata = thrift_field(thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1][0], 3)[2]
    thrift_field(metadata, 9)[2] += pages - start  # data_page_offset
    thrift_field(metadata, 7)[2] += pages - start  # total_compressed_size
    doubled = body[:pages] + body[start:pages] + body[pages:]
    with pytest.raises(ValueError, match=f"dictionary page at byte {pages} .* not its chunk's"):
        _opens(tmp_path, footer, doubled)


def test_a_truncated_max_is_held_as_the_value_before_its_last_byte_or_character_was_raised():
    """A max cut and raised by a writer is looked for as the bytes it was raised from: its last
    byte one less (binary), or of a UTF-8 column its last character one code point less (the
    UTF-8 of U+4E40 differs from U+4E3F's in two bytes), past the surrogates."""
    raised = ("z" * 3 + "\u4e40").encode()
    assert raised[:-1] + b"\x7f" in _unraised(raised, False)
    assert ("z" * 3 + "\u4e3f").encode() not in _unraised(raised, False)
    assert ("z" * 3 + "\u4e3f").encode() in _unraised(raised, True)
    assert _unraised("\ue000".encode(), True)[-1] == "\ud7ff".encode()
    assert _unraised(b"a\x00", True) == (b"a\x00", b"`\x00", b"`\xff")  # never below a zero


@pytest.mark.parametrize(
    "original, written",
    [
        ("zz\u4e3f", "zz\u4e7f"),  # parquet-mr: BF cannot rise, B8 does (E4 B9 BF)
        ("zz\x7f", "z{\x7f"),  # parquet-mr: DEL cannot rise to 0x80, the byte before does
        ("zz\u07ff", "z{\u07ff"),  # parquet-mr: DF BF -> E0 BF is no character
        ("zz\u4fff", "zz\u5fff"),  # parquet-mr: E4 BF BF -> E5 BF BF
        ("zy", "zz"),  # a last byte raised (parquet-mr, arrow-rs over bytes)
        ("z\u4e3f", "z\u4e40"),  # arrow-rs: the last code point raised
    ],
    ids=["cjk-bf", "del", "u07ff", "u4fff", "byte", "code-point"],
)
def test_each_writers_truncated_max_is_unraised_to_its_original(original, written):
    """Each writer's raised max, parquet-mr's BinaryTruncator (the last byte that leaves
    valid UTF-8 raised, bytes after it kept) and arrow-rs's (the last character raised one
    code point), yields the bytes it was raised from among its forms."""
    assert original.encode() in _unraised(written.encode(), True)


def test_a_binary_max_raised_with_a_carry_is_unraised_over_its_zeros():
    """Bytes that are no UTF-8 are raised with a carry (trailing 0xFF become 0x00, the byte
    before them rises), however many: the zeros are 0xFF again, the raised byte lowered."""
    assert b"a\xff" in _unraised(b"b\x00", False)
    assert b"\x80a" + b"\xff" * 12 in _unraised(b"\x80b" + b"\x00" * 12, False)


@pytest.mark.parametrize(
    "value", ["z" * 70, "z" * 60 + "\U0010ffff\U0010ffff", "z" * 60 + "\u4e40\u4e40", "\xff" * 70]
)
def test_a_bounds_forms_are_few_and_differ_only_in_its_last_characters(value):
    """However long the bound, at most 10 forms, each of its length (one code point lowered
    may shorten it) and each its bytes but for the last two characters' (or a carry's 0xFF):
    a max that was no truncation is not unraised into arbitrary bytes, nothing left free."""
    for raw in (value.encode(), value.encode("latin-1", "replace")):
        forms = _unraised(raw, True)
        assert 1 <= len(forms) <= 10 and forms[0] == raw
        for form in forms[1:]:
            assert form[: len(raw) - 8] == raw[: len(raw) - 8] and form != raw
            assert len(raw) - 2 <= len(form) <= len(raw)


@pytest.mark.parametrize(
    "fields",
    [
        [[1, 5, 2], [2, 5, 3], [3, 5, 3], [7, 12, [[1, 5, 1]]], [15, 8, b"hidden"]],  # unknown
        [[1, 5, 2], [2, 5, 3], [3, 8, b"xyz"], [7, 12, [[1, 5, 1]]]],  # a size as a string
        [[1, 5, 2], [2, 5, 3], [3, 5, 3], [7, 12, [[1, 5, 1], [1, 5, 1]]]],  # a field twice
    ],
    ids=["unknown-field", "wrong-type", "repeated-field"],
)
def test_a_page_header_is_read_as_exactly_the_formats_fields(tmp_path, fields):
    """Page headers are read by a closed reader: a field the format does not define for its
    struct, of another type, or repeated, is a ValueError, never skipped."""
    path = tmp_path / "h"
    path.write_bytes(thrift_encode(fields) + bytes(8))
    with open(path, "rb") as raw, pytest.raises(ValueError, match="not the format's"):
        _page_header(raw, 0)


def test_a_bloom_filter_is_its_header_and_bitset_exactly(tmp_path):
    """A region claimed as a bloom filter counts only when it opens with the spec's header
    (split-block, xxhash, uncompressed) and ends where that header's bitset ends."""
    footer, body, chunks = _indexed(tmp_path, bloom_filter_options={"s": {"ndv": 10}})
    _opens(tmp_path, footer, body)
    metadata = thrift_field(chunks[1], 3)[2]
    thrift_field(metadata, 15)[2] += 32  # its length over the next part
    with pytest.raises(ValueError, match="bloom filter at byte .* its footer entry claims"):
        _opens(tmp_path, footer, body)
    thrift_field(metadata, 15)[2] -= 32
    thrift_field(metadata, 14)[2] = thrift_field(chunks[0], 4)[2]  # another part claimed
    with pytest.raises(ValueError, match="bloom filter at byte .* header not the spec's"):
        _opens(tmp_path, footer, body)


def test_a_row_groups_owned_bytes_are_placed_in_its_top_level_columns(tmp_path):
    """Each top-level column of every kind a file may hold owns its leaves' chunks, indexes and
    bloom filters (paths.column_bytes), so together they are exactly the group's (group_bytes):
    what a row letter weighs per column (sources.RowShare) adds up to what its group owns."""
    table = pa.table(
        {
            "a": pa.array([1, 2]),
            "m": pa.array([[("k", 1)], []], type=pa.map_(pa.string(), pa.int64())),
            "s": pa.array([{"x": 1, "y": {"z": "q", "w": [1.0]}}, None]),
            "d": pa.array(["u", "v"]).dictionary_encode(),
            "f": pa.array([[1, 2], [3, 4]], type=pa.list_(pa.int32(), 2)),
            "n": pa.array([None, None], type=pa.null()),
            "ll": pa.array([[[1]], [[2, 3]]]),
        }
    )
    path = tmp_path / "kinds.parquet"
    pq.write_table(table, path, write_page_index=True, bloom_filter_options={"d": True})
    with parquet_file(str(path), 1 << 20) as (raw, parquet):
        owned = column_bytes(raw, parquet, 0)
        assert parquet.metadata.num_columns == 10 and owned is not None
        assert len(owned) == 7 and min(owned) > 0 and sum(owned) == group_bytes(raw, 0)
