"""A segment file read in part is checked unit by unit: its footer against the record's footer
sha256, every row group read against the sha256 its index holds (the index itself checked
against the record, which the salt's MAC binds). Without the salt nothing read can be changed:
Parquet's page CRCs, which anyone recomputes, are not what is trusted."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_segments import as_set, numbered

from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.ids import segments
from kvtrace.transforms.ids.segments import SegmentFile, checksum, index_path, read_matching


def _written(folder: Path, rows: np.ndarray) -> SegmentFile:
    return segments.write_segment(str(folder / "blocks-00000.parquet"), [rows])


def _outcome(segment: SegmentFile, keys: np.ndarray | None) -> set | str:
    """The rows read for keys (None: the whole file, as a folding night reads it), or
    "refused" when the read stopped with one line naming the file."""
    try:
        if keys is None:
            return as_set(np.concatenate([t for _, t in segments.read_segment(segment, 1)]))
        return as_set(read_matching(segment, keys).rows)
    except JobStopped as err:
        assert "\n" not in str(err) and segment.path in str(err)
        return "refused"


@settings(max_examples=80, deadline=None)
@given(data=st.data(), size=st.integers(1, 2500), seed=st.integers(0, 2**32 - 1))
def test_any_change_to_a_unit_read_without_the_salt_is_refused(tmp_path_factory, data, size, seed):
    """Bytes of the Parquet file overwritten anywhere (its record, so its size, footer sha256
    and index, untouched: they are bound by the MAC): a read of every key, or of the whole file,
    is refused or gives exactly the rows written (bytes it never reads, such as the leading
    magic, may differ)."""
    rows = numbered(size, seed)
    segment = _written(tmp_path_factory.mktemp("digests"), rows)
    path = Path(segment.path)
    raw = bytearray(path.read_bytes())
    start = data.draw(st.integers(0, len(raw) - 1), label="at")
    put = data.draw(st.binary(min_size=1, max_size=8), label="put")
    put = put[: len(raw) - start]
    if raw[start : start + len(put)] == put:
        put = bytes(b ^ 0xFF for b in put)
    raw[start : start + len(put)] = put
    path.write_bytes(bytes(raw))
    assert _outcome(segment, rows) in ("refused", as_set(rows))
    assert _outcome(segment, None) in ("refused", as_set(rows))


def _same_footer_with_ids_swapped(segment: SegmentFile, rows: np.ndarray) -> bytes:
    """The file written again as kvtrace writes it (page CRCs recomputed by the writer) with two
    rows' ids exchanged, where that keeps its size and footer: only page bytes differ. The
    footer's rows digest (segments.ROWS_SHA256) is copied: nothing checks it against the rows
    on a read, the index's row group digests do."""
    from kvtrace.transforms.ids.segments import ROW_GROUP_ROWS, ROWS_SHA256, _arrow, _footer

    original = Path(segment.path).read_bytes()
    claimed = pq.read_metadata(segment.path).metadata[ROWS_SHA256.encode()].decode()
    ordered = np.sort(rows, order=["hi", "lo"])
    for i in range(len(ordered)):
        swapped = ordered.copy()
        j = (i + 1) % len(ordered)
        swapped["id"][[i, j]] = swapped["id"][[j, i]]
        sink = io.BytesIO()
        with segments._writer(sink) as writer:
            writer.write_table(_arrow(swapped), row_group_size=ROW_GROUP_ROWS)
            writer.add_key_value_metadata({ROWS_SHA256: claimed})
        forged = sink.getvalue()
        if len(forged) == len(original) and _footer(forged) == _footer(original):
            return forged
    raise AssertionError("no swap kept the file's size and footer")


def test_ids_swapped_in_a_page_with_its_crc_recomputed_are_refused(tmp_path):
    # A seed whose first swap keeps the footer (seed 11 wrote 1,025 files to find one).
    rows = numbered(3000, 17)
    segment = _written(tmp_path, rows)
    Path(segment.path).write_bytes(_same_footer_with_ids_swapped(segment, rows))
    with pytest.raises(JobStopped, match=r"row group \d+ differs from the digest its index"):
        read_matching(segment, rows)
    assert pq.read_table(segment.path).num_rows == 3000  # a valid Parquet file, CRCs and all


def test_a_whole_read_checks_every_row_group_as_it_reads_it(tmp_path):
    rows = numbered(3000, 15)
    segment = _written(tmp_path, rows)
    Path(segment.path).write_bytes(_same_footer_with_ids_swapped(segment, rows))
    with pytest.raises(JobStopped, match=r"row group \d+ differs from the digest its index"):
        list(segments.read_segment(segment, 2))


def test_a_row_group_read_is_only_the_bytes_verified(tmp_path):
    """Of a file whose other row groups are garbage, the verified one still reads: Parquet
    decodes only what was checked (the rest stays zero, never the file's bytes)."""
    rows = numbered(5 * segments.ROW_GROUP_ROWS, 12)
    segment = _written(tmp_path, rows)
    metadata = pq.read_metadata(segment.path)
    raw = bytearray(Path(segment.path).read_bytes())
    wanted = np.sort(rows, order=["hi", "lo"])[2 * segments.ROW_GROUP_ROWS :][:5]
    for group in (0, 1, 3, 4):
        for start, length in segments.chunk_ranges(metadata, group):
            raw[start : start + length] = b"\xee" * length
    Path(segment.path).write_bytes(bytes(raw))
    matched = read_matching(segment, wanted)
    assert as_set(matched.rows) == as_set(wanted) and matched.row_groups_read == 1
    with pytest.raises(JobStopped, match="row group 0 differs"):
        read_matching(segment, rows[:50])


def _without_digests(segment: SegmentFile) -> SegmentFile:
    """The index as kvtrace wrote it before row groups had digests, its checksum as the
    version record then held it."""
    path = index_path(segment.path)
    with np.load(path) as arrays:
        older = {name: arrays[name] for name in ("filter", "first_hi", "last_hi")}
    sink = io.BytesIO()
    np.savez(sink, **older)
    Path(path).write_bytes(sink.getvalue())
    return segment._replace(index=checksum(sink.getvalue()))


def test_a_file_whose_index_has_no_digests_is_read_whole_and_verified(tmp_path):
    rows = numbered(3000, 13)
    segment = _without_digests(_written(tmp_path, rows))
    whole = Path(segment.path).stat().st_size
    matched = read_matching(segment, rows[:3])
    assert as_set(matched.rows) == as_set(rows[:3])
    assert matched.bytes_read == segments.read_index(segment).size + whole
    Path(segment.path).write_bytes(_same_footer_with_ids_swapped(segment, rows))
    with pytest.raises(JobStopped, match="sha256 or size differs"):
        read_matching(segment, rows[:3])


def test_digests_are_of_each_row_groups_column_chunks(tmp_path):
    segment = _written(tmp_path, numbered(2500, 14))
    data = Path(segment.path).read_bytes()
    digests = segments.read_index(segment).group_sha256
    metadata = pq.read_metadata(segment.path)
    assert digests.shape == (metadata.num_row_groups, 32) == (3, 32)
    for group in range(3):
        chunks = b"".join(data[s : s + n] for s, n in segments.chunk_ranges(metadata, group))
        assert digests[group].tobytes() == hashlib.sha256(chunks).digest()


@pytest.mark.parametrize("part", ["footer", "index", "row group"])
def test_a_listed_file_is_checked_by_its_index_and_footer_before_a_commit(tmp_path, part):
    """check_listed (a commit's check of each file it carries over) refuses a changed index or
    footer in one line naming the file; a row group changed under an intact footer passes it
    (the accepted window, docs/BOUNDS.md) and is refused when it is read."""
    rows = numbered(3000, 7)
    segment = _written(tmp_path, rows)
    path = Path(index_path(segment.path) if part == "index" else segment.path)
    raw = bytearray(path.read_bytes())
    raw[{"footer": -9, "index": 100, "row group": 100}[part]] ^= 0xFF
    path.write_bytes(bytes(raw))
    if part == "row group":
        segments.check_listed(segment)
        assert _outcome(segment, None) == "refused"
        return
    with pytest.raises(JobStopped) as refused:
        segments.check_listed(segment)
    assert str(path) in str(refused.value) and "\n" not in str(refused.value)
