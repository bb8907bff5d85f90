"""Red team round 18, determinism: reproducers of records that publish as JSONL and not as the
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
# Strings longer than the 64 bytes parquet-mr (parquet.columnindex.truncate.length) keeps of a
# column index's max, each with the max parquet-mr writes (BinaryTruncator.incrementUtf8: cut at
# a character, then the LAST BYTE that leaves valid UTF-8 raised) and arrow-rs wrote before it
# raised whole characters. Neither is the page's bytes, nor them with the last byte or the last
# character one more (what paths._unraised tries).
CUTS = {
    # 64th byte ends U+4E3F (E4 B8 BF): BF cannot become C0, so B8 becomes B9 (U+4E7F)
    "cjk": ("z" * 61 + "\u4e3f" + "zz", "z" * 61 + "\u4e7f"),
    # 64th byte DEL: 0x80 alone is no character, so the byte before it is raised instead
    "del": ("z" * 63 + "\x7f" + "zz", "z" * 62 + "{\x7f"),
}


def _records(longest: str) -> list[dict]:
    notes = ["a", longest, "b", "a", "c", "a"]  # a field no reader reads
    return [
        {
            "timestamp": DAY0 + 1000 * i,
            "prompt": "hello world this is",
            "output_length": 1,
            "note": n,
        }
        for i, n in enumerate(notes)
    ]


def _with_note_index_max(records: list[dict], longest: str, written_max: str) -> bytes:
    """The records as Parquet with a page index, the `note` column index's max replaced by
    written_max (as a truncating writer writes it); the offsets after it moved to match."""
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
    full = thrift_uvarint(len(longest.encode())) + longest.encode()
    assert index.count(full) == 1  # pyarrow writes the max whole
    cut = thrift_uvarint(len(written_max.encode())) + written_max.encode()
    body = body[:start] + index.replace(full, cut) + body[start + length :]
    shift = len(full) - len(cut)
    thrift_field(note, 7)[2] -= shift
    for group in groups:
        for chunk in thrift_field(group, 1)[2][1]:
            for field in (4, 6):  # offset and column index offsets past the edit
                if thrift_field(chunk, field)[2] > start:
                    thrift_field(chunk, field)[2] -= shift
    return with_parquet_footer(body, footer)


@pytest.mark.parametrize("cut", sorted(CUTS))
def test_a_column_index_max_raised_by_its_last_valid_byte_publishes_as_its_jsonl(
    tiny_tokenizer, tmp_path, cut
):
    """Promise (docs/ANONYMIZE.md, Input: JSONL 'and Parquet with the same fields'; docs/
    BOUNDS.md, Parquet body: a max 'truncated as writers truncate one'; the rule since round 17:
    a real writer's file reads as its JSONL twin). Round 17 accepted a UTF-8 max cut at a
    character and raised by ONE CODE POINT (paths._unraised lowers the last byte or the last
    character), saying parquet-mr raises it so; but parquet-mr (Spark, Hive: column indexes on by
    default since 1.11, 64 bytes) raises the last BYTE that keeps the string valid UTF-8, as
    arrow-rs did before it raised characters: a max whose last kept character ends in 0xBF
    (1 in 64 CJK ideographs) or is DEL has an earlier byte raised. Such a file is refused whole
    (a damaged_file letter: 'statistics ... are bytes its values do not hold'), its JSONL twin
    publishes. Fixed by construction in paths._Chunk.holds: accept a max that sorts above a
    prefix of a value the page holds and shares all but its last one or two characters with
    it (what every truncating writer guarantees: the max bounds the values), not one list of
    raised forms per writer."""
    longest, written_max = CUTS[cut]
    records = _records(longest)
    (tmp_path / "salt").write_text(SALT)
    flags = ("--block-size", "4", "--salt-file", str(tmp_path / "salt"))
    log = write_jsonl(tmp_path / "log.jsonl", records)
    parquet = tmp_path / "log.parquet"
    parquet.write_bytes(_with_note_index_max(records, longest, written_max))
    assert anonymize(tiny_tokenizer, [log], tmp_path / "jsonl", *flags) == 0
    assert anonymize(tiny_tokenizer, [parquet], tmp_path / "parquet", *flags) == 0
    assert trace(tmp_path / "parquet") == trace(tmp_path / "jsonl")
