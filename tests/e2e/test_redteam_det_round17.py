"""Red team round 17, determinism: reproducers of records that publish as JSONL and not as the
Parquet file a listed writer makes of them. Each test asserts the promised behaviour and fails
today (issue 33)."""

from __future__ import annotations

import io

import pytest

from helpers import (
    SALT,
    anonymize,
    parquet_footer,
    thrift_field,
    thrift_uvarint,
    trace,
    with_parquet_footer,
    write_jsonl,
)

pytestmark = pytest.mark.slow

DAY0 = 1_763_703_600_000
# A string longer than the 64 bytes arrow-rs (DataFusion, default column_index_truncate_length)
# and parquet-mr (parquet.columnindex.truncate.length) keep of a column index's max: both cut it
# at a character boundary within 64 bytes and raise its last CHARACTER by one code point.
LONGEST = "z" * 61 + "\u4e3f" + "zz"  # its 64th byte ends U+4E3F, UTF-8 E4 B8 BF
TRUNCATED_MAX = "z" * 61 + "\u4e40"  # U+4E40 is E4 B9 80: two bytes differ, not the last alone


def _records() -> list[dict]:
    notes = ["a", LONGEST, "b", "a", "c", "a"]  # a field no reader reads
    return [
        {
            "timestamp": DAY0 + 1000 * i,
            "prompt": "hello world this is",
            "output_length": 1,
            "note": note,
        }
        for i, note in enumerate(notes)
    ]


def _as_a_truncating_writer_writes(records: list[dict]) -> bytes:
    """The records as Parquet with a page index, the `note` column index's max as arrow-rs and
    parquet-mr write it (TRUNCATED_MAX); the parts after it moved to match."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    table = pa.table({name: [r[name] for r in records] for name in records[0]})
    pq.write_table(table, buffer, write_page_index=True, use_dictionary=False)
    footer, body = parquet_footer(buffer.getvalue())
    groups = thrift_field(footer, 4)[2][1]
    note = thrift_field(groups[0], 1)[2][1][3]
    start, length = thrift_field(note, 6)[2], thrift_field(note, 7)[2]
    index = body[start : start + length]
    full = thrift_uvarint(len(LONGEST.encode())) + LONGEST.encode()
    assert index.count(full) == 1  # pyarrow writes the max whole
    cut = thrift_uvarint(len(TRUNCATED_MAX.encode())) + TRUNCATED_MAX.encode()
    body = body[:start] + index.replace(full, cut) + body[start + length :]
    shift = len(full) - len(cut)
    thrift_field(note, 7)[2] -= shift
    for group in groups:
        for chunk in thrift_field(group, 1)[2][1]:
            for field in (4, 6):  # offset and column index offsets past the edit
                if thrift_field(chunk, field)[2] > start:
                    thrift_field(chunk, field)[2] -= shift
    return with_parquet_footer(body, footer)


def test_a_column_index_max_truncated_at_a_character_publishes_as_its_jsonl(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/ANONYMIZE.md, Input: JSONL 'and Parquet with the same fields'; docs/
    BOUNDS.md, Parquet body: files of 'DataFusion (arrow-rs, bloom filters)' account for their
    bodies, a BYTE_ARRAY max may be 'truncated as parquet-mr truncates one'). paths._Chunk.holds
    accepts a max that is bytes of the page or those bytes with the LAST BYTE one more, but
    arrow-rs and parquet-mr truncate a UTF-8 column's max to whole characters and raise the
    last character by one code point: a character whose UTF-8 ends in 0xBF (1 in 64 of the
    CJK ideographs, U+00BF, ...) or DEL becomes bytes neither form matches. The six records as
    JSONL publish; as such a Parquet file the whole file is refused ('statistics ... are bytes
    its values do not hold'). Fixed by construction: a truncated max held as a prefix the page
    holds followed by ONE raised character (decode the max's last character, lower its code
    point by one, search for the prefix with it), or any max accepted that sorts at or above a
    value the page holds and shares all but its last character with it."""
    records = _records()
    (tmp_path / "salt").write_text(SALT)
    flags = ("--block-size", "4", "--salt-file", str(tmp_path / "salt"))
    log = write_jsonl(tmp_path / "log.jsonl", records)
    parquet = tmp_path / "log.parquet"
    parquet.write_bytes(_as_a_truncating_writer_writes(records))
    assert anonymize(tiny_tokenizer, [log], tmp_path / "jsonl", *flags) == 0
    assert anonymize(tiny_tokenizer, [parquet], tmp_path / "parquet", *flags) == 0
    assert trace(tmp_path / "parquet") == trace(tmp_path / "jsonl")


def test_a_categorical_column_with_a_bloom_filter_publishes_as_its_jsonl(tiny_tokenizer, tmp_path):
    """Promise (docs/ANONYMIZE.md, Input: JSONL 'and Parquet with the same fields'; docs/
    BOUNDS.md, Parquet body: 'Files of pyarrow (with page indexes, bloom filters, v2 pages)'
    account for their bodies, and 'pyarrow writes a dictionary array's whole dictionary ... in
    every row group', an entry named by another chunk of its column holding the same dictionary
    being no stray byte). A pandas categorical (a dictionary array) written by pyarrow in two
    row groups, each group naming only some of its categories, with a bloom filter on it: the
    file opens without the filter, but with it paths' rebuild (bloom_filter.py) sets another
    bitset than pyarrow's and the whole file is refused ('a bloom filter ... whose bitset is not
    the one its chunk's values set'): six records publish as JSONL, none as Parquet. pyarrow
    hashes each group's values (group 0's filter holds model-a alone); _ChunkValues.walk hashes
    the dictionary page's every entry (plain_hashes over page.values), so a dictionary holding
    entries its chunk does not index never matches. Fixed by construction: the filter rebuilt
    from the chunk's values, the dictionary entries its data pages' indices name (what every
    writer inserts), not the dictionary page whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [
        {
            "timestamp": DAY0 + 1000 * i,
            "prompt": "hello world this is",
            "output_length": 1,
            "model": "model-a" if i < 3 else "model-b",  # a field no reader reads
        }
        for i in range(6)
    ]
    (tmp_path / "salt").write_text(SALT)
    flags = ("--block-size", "4", "--salt-file", str(tmp_path / "salt"))
    log = write_jsonl(tmp_path / "log.jsonl", records)
    columns = {name: pa.array([r[name] for r in records]) for name in records[0]}
    columns["model"] = columns["model"].dictionary_encode()  # as pandas' category dtype writes
    parquet = tmp_path / "log.parquet"
    options = {"model": {"ndv": 8}}
    pq.write_table(pa.table(columns), parquet, 3, bloom_filter_options=options)
    assert anonymize(tiny_tokenizer, [log], tmp_path / "jsonl", *flags) == 0
    assert anonymize(tiny_tokenizer, [parquet], tmp_path / "parquet", *flags) == 0
    assert trace(tmp_path / "parquet") == trace(tmp_path / "jsonl")
