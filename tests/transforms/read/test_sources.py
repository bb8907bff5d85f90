"""Reading files: byte ranges, BOM, compressed and Parquet files that break off; the read and
parse transforms in TestPipelines."""

from __future__ import annotations

import bz2
import datetime
import gzip
import io
import json
import lzma
import os
import random
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import records_of
from kvtrace.transforms.dead_letters import DEAD_LETTER_TAG, WHOLE_ROW, DeadLetter
from kvtrace.transforms.read.paths import Oversized, read_lines
from kvtrace.transforms.read.records import ParseOptions, row_weight, without_nulls
from kvtrace.transforms.read.sources import BOM, FileRange, file_ranges, unread_bytes
from kvtrace.transforms.read.timestamps import timestamp_ms

LINES = [json.dumps({"timestamp": i, "prompt": f"p{i}" * (i % 7)}).encode() for i in range(2000)]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=40),
    st.integers(1, 64),
    st.booleans(),
)
def test_every_line_is_read_once_however_the_file_is_split(lines, split, final_newline):
    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    read = []
    for piece in file_ranges("x.jsonl", len(data), split):
        read += [line for _, line in read_lines(io.BytesIO(data), piece.start, piece.end, 1 << 20)]
    expected = data.split(b"\n")
    if expected and expected[-1] == b"":
        expected.pop()
    assert read == [line.rstrip(b"\r") for line in expected]  # CRLF files read like LF ones


def test_an_oversized_line_is_skipped_not_held():
    data = b"short\n" + b"x" * 5000 + b"\nafter\n"
    got = list(read_lines(io.BytesIO(data), 0, None, 1024))
    assert got == [(0, b"short"), (6, Oversized(b"x" * 1025, 5001)), (5007, b"after")]


class CountingBytes(io.BytesIO):
    """Bytes that count how many of them are read."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self.consumed = 0

    def readline(self, size: int = -1) -> bytes:
        line = super().readline(size)
        self.consumed += len(line)
        return line


@pytest.mark.parametrize("split", [1, 7, 100, 4096])
def test_a_line_without_end_is_read_about_once_however_many_ranges_it_crosses(split):
    """A range skips the line straddling its start only as far as its own end: a 64 KiB line
    with no newline costs its own range one read of it, every other range its own length."""
    data = b"first\n" + b"x" * (64 << 10)
    consumed, read = 0, []
    for piece in file_ranges("x.jsonl", len(data), split):
        stream = CountingBytes(data)
        read += [line for _, line in read_lines(stream, piece.start, piece.end, 1024)]
        consumed += stream.consumed
    assert read == [b"first", Oversized(b"x" * 1025, 64 << 10)]
    assert consumed <= 2 * len(data) + len(file_ranges("x.jsonl", len(data), split))


def check_read(paths, check_records, check_letters, max_record_bytes=1 << 20):
    """Read the files in a TestPipeline; the checks get the records and the dead letters as
    (reason, source, message) and raise when wrong (they run where the pipeline runs)."""
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that

    from kvtrace.transforms.read.steps import ReadRecords

    files = [(str(p), p.stat().st_size) for p in paths]
    with TestPipeline() as pipeline:
        read = pipeline | ReadRecords(files, max_record_bytes)
        assert_that(read.records, check_records)
        letters = (
            read[DEAD_LETTER_TAG]
            | "NoShares" >> beam.Filter(lambda d: d.share is None)  # sources.RowShare: no letter
            | "Letters" >> beam.Map(lambda d: (d.reason, d.source, d.message, d.lost_bytes))
        )
        assert_that(letters, check_letters, label="CheckLetters")


@pytest.mark.beam
def test_read_records_in_a_test_pipeline(tmp_path):
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.read.steps import ReadRecords

    path = tmp_path / "a.jsonl"
    path.write_bytes(BOM + b"\n".join(LINES[:3]) + b"\n\n  \n")
    with TestPipeline() as pipeline:
        read = pipeline | ReadRecords([(str(path), path.stat().st_size)], 1 << 20)
        assert_that(read.records, equal_to([(str(path), line) for line in LINES[:3]]))
        assert_that(read[DEAD_LETTER_TAG], equal_to([]), label="NoDeadLetters")


CODECS = [
    (".gz", gzip.compress, lambda: zlib.decompressobj(31)),
    (
        ".zst",
        zstandard.ZstdCompressor().compress,
        lambda: zstandard.ZstdDecompressor().decompressobj(),
    ),
    (".bz2", bz2.compress, bz2.BZ2Decompressor),
    (".xz", lzma.compress, lzma.LZMADecompressor),
]


def _decodable_prefix(data: bytes, decoder) -> bytes:
    """What one-shot decoding recovers of a cut stream: the reference for what must be read."""
    return decoder().decompress(data)


@pytest.mark.beam
@pytest.mark.parametrize("records", [150_000, 40])  # ~6 MB, past any decoder's buffer; tiny
@pytest.mark.parametrize("suffix, compress, decoder", CODECS)
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_a_truncated_compressed_file_gives_every_complete_record_and_its_cut_tail(
    tmp_path, suffix, compress, decoder, records
):
    many = [
        json.dumps({"timestamp": i, "prompt": f"p{i * 7919 % 10007}"}).encode()
        for i in range(records)
    ]
    whole = compress(b"\n".join(many) + b"\n")
    cut = whole[: len(whole) * 2 // 3]
    path = tmp_path / f"logs.jsonl{suffix}"
    path.write_bytes(cut)
    prefix = _decodable_prefix(cut, decoder)
    complete = prefix.count(b"\n")
    tail = prefix[prefix.rfind(b"\n") + 1 :]

    def check_records(read):
        assert [line for _, line in read] == many[:complete]  # every whole record, none made up

    def check_letters(letters):
        assert [(reason, source) for reason, source, _, _ in letters] == [
            ("damaged_file", str(path))
        ]
        assert f"breaks off at byte {len(prefix) - len(tail)}" in letters[0][2]
        # The loss: the stored bytes no record was decoded from, never less than the cut record.
        assert len(tail) <= letters[0][3] <= len(cut)

    check_read([path], check_records, check_letters)


@pytest.mark.beam
def test_a_corrupt_member_gives_the_records_of_the_members_before_it(tmp_path):
    many = [json.dumps({"timestamp": i, "prompt": "x" * (i % 50)}).encode() for i in range(2000)]
    first = gzip.compress(b"\n".join(many[:1000]) + b"\n")
    second = bytearray(gzip.compress(b"\n".join(many[1000:]) + b"\n"))
    second[:10] = bytes(10)  # not a gzip header
    path = tmp_path / "logs.jsonl.gz"
    path.write_bytes(first + bytes(second))

    def check_records(read):
        assert [line for _, line in read] == many[:1000]

    def check_letters(letters):
        assert [reason for reason, _, _, _ in letters] == ["damaged_file"]
        assert "corrupt" in letters[0][2]

    check_read([path], check_records, check_letters)


@pytest.mark.beam
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_a_whole_compressed_file_reads_completely(tmp_path):
    from apache_beam.testing.util import equal_to

    path = tmp_path / "logs.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(BOM + b"\n".join(LINES)))
    check_read([path], equal_to([(str(path), line) for line in LINES]), equal_to([]))


@pytest.mark.beam
@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_parquet_damage_is_a_dead_letter_naming_the_file(tmp_path):
    table = pa.table({"timestamp": list(range(100)), "prompt": [f"p{i}" for i in range(100)]})
    good = tmp_path / "good.parquet"
    pq.write_table(table, good, row_group_size=25)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(good.read_bytes()[:-200])  # footer gone

    def check_letters(letters):
        assert [(r, s) for r, s, _, _ in letters] == [("damaged_file", str(broken))]

    check_read(
        [good, broken],
        lambda records: len(records) == 100 or pytest.fail(len(records)),
        check_letters,
    )


def test_a_parquet_value_python_cannot_hold_is_its_rows_dead_letter_alone(tmp_path):
    """A timestamp Arrow holds but Python's datetime cannot (year ~33,658): that row is a
    dead letter numbered and saying why; every other row, in its batch and after, is read."""
    stamps = [1_764_000_000 + i for i in range(200)]
    stamps[70] = 10**12
    path = tmp_path / "stamps.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array(stamps, pa.timestamp("s")),
                "prompt": [f"p{i}" for i in range(200)],
            }
        ),
        path,
        row_group_size=100,
    )
    read = list(records_of(FileRange(str(path), 0, None), 1 << 20))
    letters = [item for item in read if isinstance(item, DeadLetter)]
    assert [(d.reason, d.message[:7]) for d in letters] == [("malformed_record", "row 70 ")]
    assert "OverflowError" in letters[0].message
    assert [item[1]["prompt"] for item in read if isinstance(item, tuple)] == [
        f"p{i}" for i in range(200) if i != 70
    ]


def test_parquet_maps_bytes_and_narrow_floats_read_as_their_json_values(tmp_path):
    """A map is an object (a key twice fails its row alone), bytes their UTF-8 text (bytes
    that are not UTF-8 fail their row alone), a float32 the number its shortest text writes."""
    path = tmp_path / "kinds.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array(range(4), pa.int64()),
                "prompt": pa.array([b"hello", b"caf\xc3\xa9", b"\xff", b"ok"], pa.binary()),
                "latency": pa.array([1.3, 0.7, 2.3, 4.7], pa.float32()),
                "tags": pa.array(
                    [[("a", 1)], [("b", 2)], [("c", 3)], [("d", 4), ("d", 5)]],
                    pa.map_(pa.string(), pa.int64()),
                ),
            }
        ),
        path,
    )
    read = list(records_of(FileRange(str(path), 0, None), 1 << 20))
    assert [item for item in read if isinstance(item, tuple)] == [
        (str(path), {"timestamp": 0, "prompt": "hello", "latency": 1.3, "tags": {"a": 1}}),
        (str(path), {"timestamp": 1, "prompt": "café", "latency": 0.7, "tags": {"b": 2}}),
    ]
    letters = [item for item in read if isinstance(item, DeadLetter)]
    assert [(d.reason, d.message[:6]) for d in letters] == [
        ("malformed_record", "row 2 "),
        ("malformed_record", "row 3 "),
    ]
    assert "UnicodeDecodeError" in letters[0].message and "duplicate key" in letters[1].message


@pytest.mark.parametrize("kind", [pa.date32(), pa.date64()])
def test_a_parquet_date_reads_as_its_jsonl_text(tmp_path, kind):
    """One rule for a date in either form: its ISO text, which a timestamp reads as midnight
    UTC, as it does the JSONL "2025-11-21"."""
    path = tmp_path / "dates.parquet"
    day = datetime.date(2025, 11, 21)
    pq.write_table(pa.table({"timestamp": pa.array([day], kind), "prompt": ["hi"]}), path)
    [(_, row)] = records_of(FileRange(str(path), 0, None), 1 << 20)
    assert row == json.loads('{"timestamp": "2025-11-21", "prompt": "hi"}')
    assert timestamp_ms(row["timestamp"]) == 1_763_683_200_000


def test_parquet_view_columns_read_as_their_plain_twins(tmp_path):
    """Newer Arrow writers keep string_view in the file; dictionary chunks cast to plain
    strings only, so the rows are read through the plain twin of the file's schema."""
    path = tmp_path / "views.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array(range(4), pa.int64()),
                "prompt": pa.array(["hello"] * 4, pa.string_view()),
                "tags": pa.array([["a"]] * 4, pa.list_view(pa.string_view())),
            }
        ),
        path,
    )
    read = list(records_of(FileRange(str(path), 0, None), 1 << 20))
    assert [row for _, row in read] == [
        {"timestamp": i, "prompt": "hello", "tags": ["a"]} for i in range(4)
    ]


def test_fields_null_in_every_row_read_as_their_jsonl_twin_at_any_depth(tmp_path):
    """pyarrow types a field null in every row as Arrow `null` and reads it shorter than its
    struct in a list of structs whose rows differ in length, which fails any cast keeping it:
    such a field, a column or a struct's at any depth (in a list, a map's values, a struct
    all of whose fields are null), is never cast, and each row reads as its JSONL twin."""
    path = tmp_path / "nulls.parquet"
    entry = pa.struct([("q", pa.null()), ("r", pa.int64())])
    records = [
        {
            "timestamp": i,
            "refusal": None,
            "meta": {"x": None},
            "messages": [
                {
                    "role": "user",
                    "name": None,
                    "extra": {"tool_calls": None, "parts": [{"id": None, "n": i}] * (i % 3)},
                }
            ]
            * (1 + i % 2),
            "tags": {"a": [{"q": None, "r": 1}] * (i % 3)},
        }
        for i in range(6)
    ]
    table = pa.Table.from_pylist([{k: v for k, v in r.items() if k != "tags"} for r in records])
    assert pa.types.is_null(table.schema.field("messages").type.value_type.field("name").type)
    tags = pa.array(
        [list(r["tags"].items()) for r in records], pa.map_(pa.string(), pa.list_(entry))
    )
    pq.write_table(table.append_column("tags", tags), path)  # a map's type is never inferred
    read = list(records_of(FileRange(str(path), 0, None), 1 << 20))
    assert [row for _, row in read] == [without_nulls(record) for record in records]
    assert read[1][1]["messages"][0] == {"role": "user", "extra": {"parts": [{"n": 1}]}}


def test_nanosecond_columns_read_floored_to_microseconds_with_or_without_pandas(tmp_path):
    """pandas writes timestamps in ns: Arrow converts a value with nanoseconds only through
    pandas, so without it every row was refused (and read otherwise with it). Any column in
    ns, the request's timestamp or one kvtrace ignores (a latency), reads floored to us."""
    import datetime as dt

    epoch_ns = 1_763_700_061_007_654_321
    path = tmp_path / "pandas.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array([epoch_ns], pa.timestamp("ns", tz="UTC")),
                "latency": pa.array([1_234_567], pa.duration("ns")),
                "at": pa.array([5_000_000_001], pa.time64("ns")),
                "prompt": ["hello"],
            }
        ),
        path,
    )
    [(_, row)] = list(records_of(FileRange(str(path), 0, None), 1 << 20))
    assert row["timestamp"] == dt.datetime(2025, 11, 21, 4, 41, 1, 7654, tzinfo=dt.timezone.utc)
    assert row["latency"] == dt.timedelta(microseconds=1234)
    assert row["at"] == dt.time(0, 0, 5)


def test_a_coarse_time_past_what_microseconds_hold_fails_its_row_beside_a_floored_one(tmp_path):
    """Reading makes every time microseconds: nanoseconds floored, coarser units scaled up. A
    millisecond value scaled past int64 is a row's letter, never wrapped into a believable
    time, even in the struct whose nanosecond field beside it is floored."""
    import datetime as dt

    real_ms, real_ns = 1_735_689_600_000, 1_735_689_600_000_000_789
    kinds = pa.struct([("sent", pa.timestamp("ns")), ("seen", pa.timestamp("ms"))])
    times = [{"sent": real_ns, "seen": real_ms}, {"sent": real_ns, "seen": real_ms + 2**61}]
    path = tmp_path / "times.parquet"
    pq.write_table(pa.table({"times": pa.array(times, kinds), "prompt": ["p0", "p1"]}), path)
    read = list(records_of(FileRange(str(path), 0, None), 1 << 20))
    [(_, row)] = [item for item in read if isinstance(item, tuple)]
    moment = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
    assert row["times"] == {"sent": moment, "seen": moment}
    [letter] = [item for item in read if isinstance(item, DeadLetter)]
    assert letter.message.startswith("row 1 ") and "out of bounds" in letter.message


def test_an_int96_time_past_what_microseconds_hold_fails_its_row(tmp_path):
    """INT96 (Spark's legacy timestamps) counts days in 32 bits, which Arrow scales without a
    check: read in microseconds a day past year ~294,000 wraps. Read in milliseconds, it never
    does, and the checked cast to microseconds refuses its row."""
    import datetime as dt
    import struct

    stamps = pa.array([dt.datetime(2025, 1, 1, 0, 0, 0, 123456)] * 2, pa.timestamp("us"))
    written = io.BytesIO()
    pq.write_table(
        pa.table({"timestamp": stamps, "prompt": ["p0", "p1"]}),
        written,
        use_deprecated_int96_timestamps=True,
        compression="none",
        use_dictionary=False,
        write_statistics=False,
    )
    data = bytearray(written.getvalue())
    day = struct.pack("<I", 2_460_677)  # 2025-01-01 as a Julian day
    second = data.find(day, data.find(day) + 1)
    assert second > 0 and data.count(day) == 2
    data[second : second + 4] = struct.pack("<I", 200_000_000)  # wraps to 1926 in microseconds
    path = tmp_path / "spark.parquet"
    path.write_bytes(data)
    read = list(records_of(FileRange(str(path), 0, None), 1 << 20))
    [(_, row)] = [item for item in read if isinstance(item, tuple)]
    assert row["timestamp"] == dt.datetime(2025, 1, 1, 0, 0, 0, 123000, tzinfo=dt.timezone.utc)
    [letter] = [item for item in read if isinstance(item, DeadLetter)]
    assert letter.message.startswith("row 1 ") and "out of bounds" in letter.message


@pytest.mark.parametrize("padding, whole", [(4, True), (8, True), (3, False), (5, False)])
def test_xz_stream_padding_between_streams(tmp_path, padding, whole):
    """.xz lets NUL bytes, a multiple of 4, follow a stream (xz -dc reads past them); any other
    count is damage."""
    streams = (
        lzma.compress(b"\n".join(LINES[:2]) + b"\n")
        + bytes(padding)
        + lzma.compress(b"\n".join(LINES[2:4]) + b"\n")
    )
    path = tmp_path / "logs.jsonl.xz"
    path.write_bytes(streams)
    read = list(records_of(FileRange(str(path), 0, None), 1 << 20))
    lines = [item[1] for item in read if isinstance(item, tuple)]
    letters = [item.reason for item in read if isinstance(item, DeadLetter)]
    assert (lines, letters) == ((LINES[:4], []) if whole else (LINES[:2], ["damaged_file"]))


@pytest.mark.beam
def test_oversized_records_become_dead_letters_with_an_excerpt(tmp_path):
    from apache_beam.testing.util import equal_to

    path = tmp_path / "big.jsonl"
    path.write_bytes(
        LINES[0] + b"\n" + b'{"prompt": "' + b"y" * 10_000 + b'"}\n' + LINES[1] + b"\n"
    )

    def check_letters(letters):
        # Refused unread, it weighs its bytes (its newline included) on the Beam engine too.
        assert [(reason, lost) for reason, _, _, lost in letters] == [("too_large", 10_015)]

    check_read(
        [path],
        equal_to([(str(path), line) for line in LINES[:2]]),
        check_letters,
        max_record_bytes=2048,
    )


@pytest.mark.beam
def test_parse_records_in_a_test_pipeline():
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.read.steps import ParseRecords

    good = b'{"timestamp": 5, "prompt": "p"}'
    with TestPipeline() as pipeline:
        parsed = (
            pipeline
            | beam.Create([("s", good), ("s", b"junk"), ("s", {"timestamp": 1})])
            | beam.ParDo(ParseRecords(ParseOptions())).with_outputs(DEAD_LETTER_TAG, main="ok")
        )
        assert_that(
            parsed.ok | beam.Map(lambda r: (r.prompt, r.timestamp_ms)), equal_to([("p", 5)])
        )
        assert_that(
            parsed[DEAD_LETTER_TAG] | "Reasons" >> beam.Map(lambda d: d.reason),
            equal_to(["invalid_json", "no_input"]),
            label="Rejected",
        )


def test_file_range_of_compressed_and_parquet_files_is_whole():
    assert file_ranges("a.jsonl.gz", 10**9, 100) == [FileRange("a.jsonl.gz", 0, None)]
    assert file_ranges("a.parquet", 10**9, 100) == [FileRange("a.parquet", 0, None)]
    assert len(file_ranges("a.jsonl", 1000, 100)) == 10


@pytest.mark.beam
def test_a_file_whose_name_is_not_utf8_is_read_on_beam_and_named_as_a_letter_names_it(tmp_path):
    """Beam carries text between steps as UTF-8, which a surrogate (a byte of a Linux name
    that is not UTF-8) breaks: the path stays in the step, and `source` leaves it escaped, as
    the local engine's letter (dead_letters.shown_name) shows it, byte for byte."""
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.read.steps import ReadRecords

    name = os.fsdecode(os.fsencode(str(tmp_path)) + b"/in\xff.jsonl")
    with open(name, "wb") as handle:
        handle.write(LINES[0] + b"\n" + b"x" * 100 + b"\n")
    shown = str(tmp_path) + "/in\\xff.jsonl"
    local = [
        item for piece in file_ranges(name, os.path.getsize(name)) for item in records_of(piece, 64)
    ]
    assert isinstance(local[1], DeadLetter) and local[1].to_line().startswith(
        json.dumps({"source": shown}).encode()[:-1]
    )
    with TestPipeline() as pipeline:
        read = pipeline | ReadRecords([(name, os.path.getsize(name))], 64)
        assert_that(read.records, equal_to([(shown, LINES[0])]))
        assert_that(
            read[DEAD_LETTER_TAG] | beam.Map(DeadLetter.to_line),
            equal_to([local[1].to_line()]),
            label="SameLetter",
        )


def test_parquet_rows_are_numbered_across_row_groups_as_the_groups_go_by(tmp_path):
    """Each group's first row is counted as the groups are read (not summed again per group:
    16,000 one-row groups took minutes): a group refused in a later group has its rows' file
    numbers, one letter for them."""
    bound = 4096
    prompts = ["a", "b", "c", "z" * (3 * bound), "e", "f"]
    path = tmp_path / "logs.parquet"
    pq.write_table(
        pa.table({"timestamp": list(range(6)), "prompt": prompts}),
        path,
        row_group_size=2,
        use_dictionary=False,
    )
    out = list(records_of(FileRange(str(path), 0, None), bound))
    letters = [item.message for item in out if isinstance(item, DeadLetter)]
    assert len(out) == 5 and [m.split(" not ")[0] for m in letters] == [
        "row group 1 (rows 2 to 3, 2 as its footer claims)"
    ]


def test_a_refused_row_group_is_one_letter_whatever_rows_its_footer_claims(tmp_path):
    """The footer's row count is a claim: a refused group costs one dead letter stating it,
    and weighs as lost its stored bytes (at most the file's), never a letter per claimed row."""
    bound = 4096
    path = tmp_path / "logs.parquet"
    pq.write_table(
        pa.table({"timestamp": [0, 1], "prompt": ["a", "z" * (3 * bound)]}),
        path,
        use_dictionary=False,
        compression="none",
    )
    data = path.read_bytes()
    footer_bytes = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_bytes
    # FileMetaData.num_rows and RowGroup.num_rows (field 3, i64: 0x16 delta 1 from field 2),
    # the first and last 2s so written, -> 10^12, zigzag varint (the columns' num_values
    # between them are kept: pages holding fewer values than claimed are refused first)
    claimed = 10**12
    zigzag, varint = claimed << 1, bytearray()
    while zigzag >= 0x80:
        varint.append(zigzag & 0x7F | 0x80)
        zigzag >>= 7
    varint.append(zigzag)
    parts = data[start:-8].split(b"\x16\x04")
    claim = b"\x16" + bytes(varint)
    footer = parts[0] + claim + b"\x16\x04".join(parts[1:-1]) + claim + parts[-1]
    path.write_bytes(data[:start] + footer + len(footer).to_bytes(4, "little") + b"PAR1")
    assert pq.ParquetFile(path).metadata.row_group(0).num_rows == claimed
    [letter] = records_of(FileRange(str(path), 0, None), bound)
    assert letter.reason == "too_large"
    assert f"rows 0 to {claimed - 1}, {claimed} as its footer claims" in letter.message
    assert 0 < letter.lost_bytes <= path.stat().st_size


# Records that share some fields and lack others, at the top and nested: a Parquet struct
# column gives each the fields of all (null where absent).
_PART = st.fixed_dictionaries({"type": st.just("text")}, optional={"text": st.text(max_size=3)})
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"])},
    optional={"content": st.lists(_PART, min_size=1, max_size=2), "name": st.just("n")},
)
_RECORD = st.fixed_dictionaries(
    {"timestamp": st.integers(0, 10)},
    optional={
        "system": st.just("s"),
        "messages": st.lists(_MESSAGE, min_size=1, max_size=3),
        "tools": st.lists(
            st.fixed_dictionaries({"name": st.just("g")}, optional={"type": st.just("f")}),
            min_size=1,
            max_size=2,
        ),
        "input_ids": st.lists(st.integers(0, 9), max_size=4),
    },
)


@settings(max_examples=40, deadline=None)
@given(st.lists(_RECORD, min_size=1, max_size=5))
def test_parquet_rows_read_as_the_records_written_absent_fields_absent(tmp_path_factory, records):
    path = tmp_path_factory.mktemp("absent") / "log.parquet"
    pq.write_table(pa.Table.from_struct_array(pa.array(records)), path)
    assert [row for _, row in records_of(FileRange(str(path), 0, None), 1 << 20)] == records


@given(st.integers(0, 1 << 40), st.integers(-(1 << 40), 1 << 41), st.integers(0, 1 << 30))
def test_what_is_lost_is_never_negative_nor_more_than_stored_or_less_than_the_cut(
    stored, reached, partial
):
    lost = unread_bytes(stored, reached, partial)
    assert partial <= lost <= max(stored, partial)
    assert unread_bytes(stored, 0) == stored  # nothing decoded: the whole of it


def test_a_gzip_damaged_in_its_first_block_weighs_the_whole_file(tmp_path):
    """No record decoded: the file refused whole weighs its bytes as stored, not the 0 bytes
    of the partial record it never got to."""
    data = bytearray(gzip.compress(b"".join(line + b"\n" for line in LINES)))
    data[20] ^= 0xFF  # inside the first deflate block's header
    path = tmp_path / "logs.jsonl.gz"
    path.write_bytes(bytes(data))
    [letter] = records_of(FileRange(str(path), 0, None), 1 << 20)
    assert letter.reason == "damaged_file"
    assert letter.lost_bytes == len(data)


def test_a_line_refused_unread_weighs_its_bytes_however_many_records_it_holds(tmp_path):
    """A writer that left out the newlines: one too_large letter, weighing every byte of the
    line (its newline included), as a row group refused unread weighs its stored bytes."""
    joined = b"".join(LINES)
    path = tmp_path / "logs.jsonl"
    path.write_bytes(LINES[0] + b"\n" + joined + b"\n" + LINES[1] + b"\n")
    read = list(records_of(FileRange(str(path), 0, None), 1 << 16))
    [letter] = [item for item in read if isinstance(item, DeadLetter)]
    assert letter.reason == "too_large"
    assert letter.lost_bytes == len(joined) + 1
    assert len(read) == 3


def test_a_row_group_refused_unread_weighs_every_byte_it_owns(tmp_path):
    """A chunk holding a page over the ceiling is never decompressed, so its column index's
    statistics and its bloom filter, outside its pages, are checked against nothing: they are
    the group's as much as its chunks, and its letter weighs them all (paths.group_bytes),
    the whole body here, however a crafted file fills them."""
    path = tmp_path / "logs.parquet"
    table = pa.table({"prompt": ["x" * 50_000, "y"], "n": [1, 2]})
    options = {"prompt": {"ndv": 2}, "n": {"ndv": 2}}
    pq.write_table(table, path, write_page_index=True, bloom_filter_options=options)
    data = path.read_bytes()
    footer = int.from_bytes(data[-8:-4], "little")
    [letter] = records_of(FileRange(str(path), 0, None), 4000)
    assert letter.reason == "too_large"
    assert letter.lost_bytes == len(data) - 4 - footer - 8  # all but the magics and footer


def test_a_line_refused_unread_before_a_break_is_weighed_once(tmp_path):
    """An oversized line the compressed stream breaks off in: its letter weighs its bytes as
    stored, and the break's letter none of them again (nothing was read past it)."""
    cut = os.urandom(150_000).hex().encode()  # incompressible: its stored bytes are many
    data = gzip.compress(LINES[0] + b"\n" + cut + b"\n" + LINES[1] + b"\n")
    path = tmp_path / "logs.jsonl.gz"
    path.write_bytes(data[: len(data) * 3 // 4])
    read = list(records_of(FileRange(str(path), 0, None), 1 << 16))
    oversized, broken = [item for item in read if isinstance(item, DeadLetter)]
    assert (oversized.reason, broken.reason) == ("too_large", "damaged_file")
    assert 0 < oversized.lost_bytes <= path.stat().st_size
    assert broken.lost_bytes == 0


def test_a_compressed_line_refused_unread_weighs_its_stored_bytes_not_its_decoded_ones(tmp_path):
    """The gate divides by bytes as stored: two lines of 15 MB of one byte in a 30 KB gzip
    weigh the file at most, together, so --max-rejected-fraction 1 still means no bound."""
    big = b"x" * 15_000_000 + b"\n"
    data = gzip.compress(LINES[0] + b"\n" + big + LINES[1] + b"\n" + big)
    path = tmp_path / "logs.jsonl.gz"
    path.write_bytes(data)
    read = list(records_of(FileRange(str(path), 0, None), 1 << 16))
    letters = [item for item in read if isinstance(item, DeadLetter)]
    assert [letter.reason for letter in letters] == ["too_large"] * 2
    assert sum(letter.lost_bytes for letter in letters) == len(data)
    assert len(read) == 4


def _stored_row(row: dict, stored: int) -> dict:
    from kvtrace.transforms.read.records import RowSize
    from kvtrace.transforms.read.sources import StoredRow

    return StoredRow.weighing(row, RowSize.of((stored,)))


@pytest.mark.parametrize(
    ("record", "reason", "lost"),
    [
        (b"{broken", "invalid_json", 7),
        (b"\xff\xfe", "invalid_utf8", 2),
        (b"[{}, {}]", "not_an_object", 8),
        (b'{"timestamp": 1}', "no_input", 16),
        (b'{"object": "list", "data": [{}]}', "no_input", 32),
        ({"timestamp": 1}, "no_input", 16),  # a row read from no file: its rendering
        (_stored_row({"timestamp": 1}, 3), "no_input", 3),  # its size (no file's share: 1)
    ],
)
def test_every_letter_of_a_record_weighs_its_bytes_whatever_it_decodes_to(record, reason, lost):
    """A line may wrap any number of records (a writer that left out newlines, a JSON array
    export, a list response's `data`): whatever JSON it decodes to and whatever its reason,
    its letter weighs its bytes as read, as a line refused unread does (round 16)."""
    from kvtrace.transforms.dead_letters import Tally
    from kvtrace.transforms.read.sources import parse_one

    letter = parse_one("logs.jsonl", record, ParseOptions())
    assert (letter.reason, Tally.of([letter]).lost_bytes) == (reason, lost)


def test_a_compressed_line_and_a_row_keep_their_weight_between_beam_steps():
    """Beam pickles what it does not know between steps: the weight travels with the record,
    and with the request parsed from it (its letters after the parse weigh it too)."""
    import pickle

    from kvtrace.transforms.read.sources import StoredLine, parse_one

    line = pickle.loads(pickle.dumps(StoredLine.weighing(b"{broken", 2)))
    assert (line, line.stored) == (b"{broken", 2)
    assert parse_one("logs.jsonl.gz", line, ParseOptions()).lost_bytes == 2
    row = pickle.loads(pickle.dumps(_stored_row({"timestamp": 1}, 3)))
    assert (row, row.stored, row.stored.columns) == ({"timestamp": 1}, 3, (3,))
    chat = {"timestamp": 1, "messages": [{"role": "user", "content": "hi"}]}
    request = parse_one("logs.parquet", _stored_row(chat, 5), ParseOptions())
    letter = pickle.loads(pickle.dumps(request)).letter("no_input", "x")
    assert (letter.row_bytes, letter.row_columns) == (5, (5,))


def _file_share(share: DeadLetter) -> int:
    """The bytes as stored a file's share record places its rows in (sources.RowShare)."""
    return sum(stored for _, stored, _ in share.share)


@pytest.mark.parametrize("wrapper_at", [0, 10])
def test_a_parquet_rows_letter_weighs_its_own_size_at_its_files_share(tmp_path, wrapper_at):
    """A row's letter weighs its bytes as JSON (sized once, as it is read) at its file's share
    (sources.RowShare, dead_letters.Tally), not an even share of its row group: a row wrapping
    a log among 10 chats weighs nearly the whole file wherever it stands, and the file's rows
    together weigh its row groups' bytes, never more than the file (round 17)."""
    from kvtrace.transforms.dead_letters import Tally
    from kvtrace.transforms.read.sources import parse_one, read_range

    chats = [{"timestamp": i, "prompt": f"p{i}"} for i in range(10)]
    wrapper = {"object": "list", "data": [{"prompt": f"{i:x}" * 40} for i in range(2_000)]}
    rows = chats[:wrapper_at] + [wrapper] + chats[wrapper_at:]
    path = tmp_path / "log.parquet"
    pq.write_table(pa.Table.from_struct_array(pa.array(rows)), path, row_group_size=4)
    items = list(read_range(FileRange(str(path), 0, None), 1 << 20))
    [share] = [item for item in items if isinstance(item, DeadLetter)]
    parsed = [parse_one(*item, ParseOptions()) for item in items if item is not share]
    [letter] = [item for item in parsed if isinstance(item, DeadLetter)]
    stored = path.stat().st_size
    assert letter.reason == "no_input"
    whole = _file_share(share)
    assert 0.9 * whole < Tally.of([letter, share]).lost_bytes <= whole < stored
    every = [DeadLetter(share.source, b"", "r", "m", **row_weight(r.stored)) for _, r in items[:-1]]
    assert Tally.of([*every, share]).lost_bytes == whole


@pytest.mark.parametrize("groups", [1, 3])
def test_a_parquet_rows_letter_weighs_the_column_chunks_its_values_were_stored_in(tmp_path, groups):
    """A row's size as JSON is a lower bound (a number 1 byte, a string all of its), so a row
    of numbers beside rows of text would weigh far less than it holds at one share for the
    file: its letter weighs each column's chunks at its part of that column's size (round 19).
    A wrapper of 300 token-id requests beside 10 long prompts weighs nearly all of `data`'s
    chunks (the other rows' nulls the rest), most of the file; the file's rows together weigh
    exactly its groups' owned bytes."""
    from kvtrace.transforms.dead_letters import Tally
    from kvtrace.transforms.read.sources import parse_one, read_range

    rng = random.Random(19)
    prompt = " ".join(f"w{rng.randrange(10_000)}" for _ in range(2_000))
    data = [{"input_ids": [rng.randrange(10**5, 10**6) for _ in range(100)]} for _ in range(300)]
    rows = [{"timestamp": i, "prompt": prompt} for i in range(10)]
    rows.insert(5, {"object": "list", "data": data})
    path = tmp_path / "log.parquet"
    pq.write_table(pa.Table.from_struct_array(pa.array(rows)), path, row_group_size=11 // groups)
    items = list(read_range(FileRange(str(path), 0, None), 1 << 22))
    [share] = [item for item in items if isinstance(item, DeadLetter)]
    assert {column for column, _, _ in share.share} == {WHOLE_ROW, 0, 1, 2, 3}
    parsed = [parse_one(*item, ParseOptions()) for item in items if item is not share]
    [letter] = [item for item in parsed if isinstance(item, DeadLetter)]
    owned = _file_share(share)
    data_chunks = {column: stored for column, stored, _ in share.share}[3]
    assert Tally.of([letter, share]).lost_bytes > 0.99 * data_chunks > 0.8 * owned
    every = [DeadLetter(share.source, b"", "r", "m", **row_weight(r.stored)) for _, r in items[:-1]]
    assert Tally.of([*every, share]).lost_bytes == owned < path.stat().st_size


def _letters_of(path) -> list[DeadLetter]:
    from kvtrace.transforms.read.sources import parse_one

    letters = []
    for item in records_of(FileRange(str(path), 0, None), 1 << 20):
        parsed = item if isinstance(item, DeadLetter) else parse_one(*item, ParseOptions())
        letters += [parsed] if isinstance(parsed, DeadLetter) else []
    return letters


@pytest.mark.parametrize("lines", [2_000, 60_000])  # read in one chunk, in many
def test_junk_lines_of_a_gzip_weigh_their_share_of_its_stored_bytes(tmp_path, lines):
    """A compressed file's lines are weighed in its bytes as stored, as the gate divides by
    (paths.stored_share): one line in 20 junk (not JSON) in a gzip weighs about a twentieth of
    the file, not its decoded bytes (~9 x as many), so an ordinary .gz log with a few percent
    of bad lines stays well under the default --max-rejected-fraction 0.5; a file all junk
    weighs about all of it, never much more."""
    data = b"".join(
        (b"junk " + line[:-1] if i % 20 == 0 else line) + b"\n"
        for i, line in enumerate(LINES[j % len(LINES)] for j in range(lines))
    )
    path = tmp_path / "logs.jsonl.gz"
    path.write_bytes(gzip.compress(data))
    stored = path.stat().st_size
    letters = [letter for letter in _letters_of(path) if letter.reason == "invalid_json"]
    assert len(letters) == lines // 20
    junk = sum(len(line) + 1 for line in data.split(b"\n")[:-1] if line.startswith(b"junk"))
    assert junk / len(data) * stored < sum(letter.lost_bytes for letter in letters) < 0.1 * stored
    path.write_bytes(gzip.compress(b"".join(b"junk " + line + b"\n" for line in LINES)))
    lost = sum(letter.lost_bytes for letter in _letters_of(path))
    assert path.stat().st_size <= lost <= 1.01 * path.stat().st_size + len(LINES)


def test_a_gzip_line_weighs_the_same_wherever_it_stands_in_its_file(tmp_path):
    """Every line of a compressed file weighs its decoded bytes at the whole file's share
    (sources._whole_share), so its letters weigh alike whatever the order of its lines: junk
    first or last (round 16: a share so far weighed junk before compressible records at the
    junk's own ratio, after them at the records')."""
    junk = [b"junk " + bytes(range(256)) * 40 for _ in range(2)]
    good = [line + b" " * 4000 for line in LINES[:10]]
    shares = []
    for lines in (junk + good, good + junk):
        path = tmp_path / "logs.jsonl.gz"
        path.write_bytes(gzip.compress(b"".join(line + b"\n" for line in lines), mtime=0))
        letters = [x for x in _letters_of(path) if x.reason == "invalid_json"]
        shares.append(sum(letter.lost_bytes for letter in letters) / path.stat().st_size)
    # the same share of the file (its stored size differs by how the order compresses)
    assert shares[0] == pytest.approx(shares[1], rel=0.01)


def _parquet_bytes(lines: list[bytes]) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table({"line": [line.decode() for line in lines]}), buffer)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("form", "stored"),
    [
        (".jsonl.gz", lambda data: gzip.compress(data, mtime=0)),
        (".jsonl.bz2", bz2.compress),
        (".jsonl.xz", lzma.compress),
        (".jsonl.zst", zstandard.ZstdCompressor().compress),
        (".parquet", lambda _: _parquet_bytes(LINES)),
    ],
)
def test_another_form_under_a_plain_name_is_one_letter_weighing_the_whole_file(
    tmp_path, form, stored
):
    """Read as its name says, never guessed from its bytes: a compressed log (or a Parquet
    file) named .jsonl is refused whole, one damaged_file letter naming the name it needs,
    weighing every stored byte, however its ranges are split among workers."""
    data = stored(b"".join(line + b"\n" for line in LINES))
    path = tmp_path / "rotated.jsonl"
    path.write_bytes(data)
    read = [
        item
        for piece in file_ranges(str(path), len(data), len(data) // 3 + 1)
        for item in records_of(piece, 1 << 20)
    ]
    [letter] = read
    assert letter.reason == "damaged_file" and form in letter.message
    assert letter.lost_bytes == len(data)


@pytest.mark.parametrize("head", [b"", b"\x1f\x8b\x08 a damaged first line\n"])
def test_a_plain_file_is_read_as_plain_whatever_its_first_line_starts_like(tmp_path, head):
    """Only bytes another form's reader takes are another form: a first line that merely
    starts like gzip's magic is a plain file's record (parse_one's letter), its file read on."""
    path = tmp_path / "logs.jsonl"
    path.write_bytes(head + b"".join(line + b"\n" for line in LINES[:3]))
    read = list(records_of(FileRange(str(path), 0, None), 1 << 20))
    assert [line for _, line in read] == [head.rstrip(b"\n")] * bool(head) + LINES[:3]


def test_a_parquet_cut_short_weighs_the_whole_file(tmp_path):
    path = tmp_path / "logs.parquet"
    pq.write_table(pa.table({"timestamp": list(range(500)), "prompt": ["p"] * 500}), path)
    path.write_bytes(path.read_bytes()[:-100])
    [letter] = records_of(FileRange(str(path), 0, None), 1 << 20)
    assert letter.reason == "damaged_file"
    assert letter.lost_bytes == path.stat().st_size


def test_a_gzip_cut_in_its_middle_weighs_what_its_records_did_not_reach(tmp_path):
    """Records before the cut go on; the letter weighs the stored bytes after the last of them
    (at least the cut record), less than the whole file."""
    data = gzip.compress(b"".join(line + b"\n" for line in LINES * 40), compresslevel=1)
    path = tmp_path / "logs.jsonl.gz"
    path.write_bytes(data[: len(data) * 3 // 4])
    read = list(records_of(FileRange(str(path), 0, None), 1 << 20))
    [letter] = [item for item in read if isinstance(item, DeadLetter)]
    assert len(read) > len(LINES)
    assert 0 < letter.lost_bytes < path.stat().st_size


def _nested_times(path, ns: int) -> None:
    """A Parquet file holding a time in nanoseconds in each container a writer may use."""
    moment = pa.array([ns], pa.timestamp("ns"))
    dictionary = pa.DictionaryArray.from_arrays(pa.array([0], pa.int32()), moment)
    pq.write_table(
        pa.table(
            {
                "prompt": ["hello"],
                "fixed": pa.FixedSizeListArray.from_arrays(moment, 1),
                "map": pa.MapArray.from_arrays(
                    pa.array([0, 1], pa.int32()), pa.array(["a"]), moment
                ),
                "large": pa.LargeListArray.from_arrays(pa.array([0, 1], pa.int64()), moment),
                "dictionary": dictionary,
                "listed": pa.ListArray.from_arrays(pa.array([0, 1], pa.int32()), dictionary),
            }
        ),
        path,
    )


def test_times_in_every_container_read_from_their_storage(tmp_path):
    """Round 11: a time in a fixed_size_list (a Polars Array), a map or a dictionary was left
    in nanoseconds and turned into Python through pandas where it imports (a pandas Timestamp),
    refused where it does not: the output depended on the worker's packages. One walk over
    every container now reads each as UTC microseconds, floored, from its storage."""
    import datetime as dt

    path = tmp_path / "nested.parquet"
    _nested_times(path, 1_735_689_600_000_000_789)
    [(_, row)] = list(records_of(FileRange(str(path), 0, None), 1 << 20))
    moment = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
    assert row == {
        "prompt": "hello",
        "fixed": [moment],
        "map": {"a": moment},  # a map reads as its JSON object
        "large": [moment],
        "dictionary": moment,
        "listed": [moment],
    }
    assert type(row["fixed"][0]) is dt.datetime and type(row["dictionary"]) is dt.datetime


def test_an_extension_column_reads_as_what_it_stores(tmp_path):
    """A package may register an extension type (pandas registers its own on import): read as
    its storage, a column is the same on every worker."""
    path = tmp_path / "extension.parquet"
    text = pa.array(['{"a": 1}'], pa.json_())
    nested = pa.StructArray.from_arrays([text], ["j"])
    pq.write_table(pa.table({"prompt": ["hello"], "j": text, "nested": nested}), path)
    [(_, row)] = list(records_of(FileRange(str(path), 0, None), 1 << 20))
    assert row == {"prompt": "hello", "j": '{"a": 1}', "nested": {"j": '{"a": 1}'}}


@pytest.mark.parametrize(
    "kind",
    [
        pa.sparse_union([pa.field("a", pa.int64())]),
        pa.month_day_nano_interval(),
        pa.map_(pa.string(), pa.list_(pa.dense_union([pa.field("a", pa.int64())]))),
        pa.dictionary(pa.int32(), pa.run_end_encoded(pa.int32(), pa.string())),
    ],
    ids=["union", "interval", "nested_union", "dictionary_of_run_ends"],
)
def test_a_column_of_a_type_outside_the_read_ones_refuses_the_file(kind):
    """The types read are a closed list (paths._LEAVES in paths._CONTAINERS): any other, at
    any depth, refuses the file in one line, never turned into Python by whatever the worker
    has (Parquet stores none of these today; a file's ARROW:schema may name them)."""
    from kvtrace.transforms.read import paths

    schema = pa.schema([("prompt", pa.string()), ("other", kind)])
    with pytest.raises(ValueError, match="Parquet column other holds .*, a type not read"):
        paths._check_schema("f.parquet", schema)
    paths._check_schema("f.parquet", pa.schema([("prompt", pa.string())]))


def test_parquet_bytes_its_footer_does_not_list_are_one_letter_weighing_them(tmp_path):
    """A row group the footer leaves out of its list: its bytes are one damaged_file letter
    weighing them, the listed groups' rows read all the same (read = exported + rejected)."""
    from helpers import parquet_footer, thrift_field, with_parquet_footer

    buffer = io.BytesIO()
    pq.write_table(pa.table({"timestamp": list(range(6)), "prompt": ["p"] * 6}), buffer, 3)
    footer, body = parquet_footer(buffer.getvalue())
    groups = thrift_field(footer, 4)[2][1]
    second = thrift_field(groups[1], 6)[2]  # its total_compressed_size: its bytes
    del groups[1]
    path = tmp_path / "logs.parquet"
    path.write_bytes(with_parquet_footer(body, footer))
    read = list(records_of(FileRange(str(path), 0, None), 1 << 20))
    [letter] = [item for item in read if isinstance(item, DeadLetter)]
    assert letter.reason == "damaged_file" and "lie in no part" in letter.message
    assert letter.lost_bytes == second
    rows = [item[1] for item in read if not isinstance(item, DeadLetter)]
    assert [row["timestamp"] for row in rows] == [0, 1, 2]


def _cut_to(path, size: int) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(size)


def test_a_log_cut_between_the_plan_and_the_read_is_a_letter_weighing_its_planned_bytes(tmp_path):
    """logrotate's copytruncate before a range is read: the file is not the one planned, so
    the range is one damaged_file letter weighing every byte it was planned to hold."""
    data = b"".join(line + b"\n" for line in LINES[:100])
    path = tmp_path / "live.jsonl"
    path.write_bytes(data)
    ranges = file_ranges(str(path), len(data), 1_000)
    _cut_to(path, 500)
    for piece in ranges:
        [letter] = records_of(piece, 1 << 20)
        assert letter.reason == "damaged_file" and "changed before it was read" in letter.message
        assert letter.lost_bytes == piece.end - piece.start


def test_a_log_cut_as_it_is_read_weighs_what_its_range_did_not_read(tmp_path, monkeypatch):
    """Cut once the range is open, past its check: the records read go on, and the range's
    planned bytes none of them came from are one letter."""
    from kvtrace.transforms.read import sources

    data = b"".join(line + b"\n" for line in LINES)
    lines_of = sources.read_lines

    def cut_as_read(stream, *args):
        for number, item in enumerate(lines_of(stream, *args)):
            if number == 10 and not isinstance(stream, gzip.GzipFile):
                _cut_to(path, data.index(b"\n", 600) + 1)
            yield item

    monkeypatch.setattr(sources, "read_lines", cut_as_read)
    path = tmp_path / "live.jsonl"
    path.write_bytes(data)
    [piece] = file_ranges(str(path), len(data))
    read = list(records_of(piece, 1 << 20))
    [letter] = [item for item in read if isinstance(item, DeadLetter)]
    assert letter.reason == "damaged_file"
    assert "changed as it was read" in letter.message
    records = len(read) - 1
    assert 10 <= records < len(LINES)  # as far as the reader had buffered
    unread = len(data) - len(b"".join(line + b"\n" for line in LINES[:records]))
    assert 0 <= letter.lost_bytes - unread <= len(LINES[records - 1]) + 1  # the last, placed late


def test_a_file_renamed_away_after_the_plan_is_a_letter(tmp_path):
    """A rename rotation: the path names another file (its inode differs) than was planned."""
    data = b"".join(line + b"\n" for line in LINES[:10])
    path = tmp_path / "live.jsonl"
    path.write_bytes(data)
    [piece] = file_ranges(str(path), len(data))
    path.rename(tmp_path / "live.jsonl.1")
    path.write_bytes(data)
    [letter] = records_of(piece, 1 << 20)
    assert (letter.reason, letter.lost_bytes) == ("damaged_file", len(data))
