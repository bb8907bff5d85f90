"""Id map segment files: sorted by hash, indexed, and read only where a night's keys can be."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.ids import segments
from kvtrace.transforms.ids.dense_ids import NUMBERED, shard_of


def numbered(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    table = np.empty(n, dtype=NUMBERED)
    table["hi"] = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
    table["lo"] = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
    table["id"] = rng.permutation(n)
    return table


def as_set(table: np.ndarray) -> set[tuple[int, int, int]]:
    return set(zip(table["hi"].tolist(), table["lo"].tolist(), table["id"].tolist()))


def test_whole_segment_round_trips_split_by_shard(tmp_path):
    table = numbered(5000, 0)
    path = str(tmp_path / "blocks-00000.parquet")
    segment = segments.write_segment(path, [table[:400], table[400:]])
    assert segment.rows == 5000
    parts = dict(segments.read_segment(segment, shards=7))
    assert as_set(np.concatenate(list(parts.values()))) == as_set(table)
    for shard, part in parts.items():
        assert (shard_of(part, 7) == shard).all()


def test_rows_are_sorted_by_hash_in_row_groups_the_index_describes(tmp_path):
    table = numbered(5000, 1)
    path = str(tmp_path / "blocks-00000.parquet")
    segment = segments.write_segment(path, [table])
    hi = pq.read_table(path).column("hi").to_numpy()
    assert (np.diff(hi.astype(np.float64)) >= 0).all()
    index = segments.read_index(segment)
    groups = pq.ParquetFile(path).metadata.num_row_groups
    assert (
        groups == len(index.first_hi) == len(index.last_hi) == -(-5000 // segments.ROW_GROUP_ROWS)
    )
    assert index.first_hi[0] == hi[0] and index.last_hi[-1] == hi[-1]


def test_a_few_keys_read_a_few_row_groups_and_exactly_their_rows(tmp_path):
    table = numbered(50_000, 2)
    path = str(tmp_path / "blocks-00000.parquet")
    segment = segments.write_segment(path, [table])
    known = table[[3, 17_000, 42_000]]
    tonight = np.concatenate([known, numbered(5_000, 3)])  # mostly keys the map lacks
    matched = segments.read_matching(segment, tonight)
    assert as_set(matched.rows) == as_set(known)
    assert matched.row_groups == 49
    # 3 known keys, and ~0.045% of 5,000 unknown ones passing the filter (~2).
    assert 3 <= matched.row_groups_read <= 10
    whole = (tmp_path / "blocks-00000.parquet").stat().st_size
    assert matched.bytes_read < whole / 3


def test_keys_absent_from_the_map_read_only_the_index(tmp_path):
    path = str(tmp_path / "blocks-00000.parquet")
    segment = segments.write_segment(path, [numbered(3000, 4)])
    matched = segments.read_matching(segment, numbered(10, 5))
    assert len(matched.rows) == 0 and matched.row_groups_read == 0
    assert matched.bytes_read == segments.read_index(segment).size


def test_equal_high_halves_across_a_row_group_boundary_are_found(tmp_path):
    table = numbered(3 * segments.ROW_GROUP_ROWS, 6)
    table["hi"][segments.ROW_GROUP_ROWS - 5 : segments.ROW_GROUP_ROWS + 5] = 12345
    path = str(tmp_path / "blocks-00000.parquet")
    segment = segments.write_segment(path, [table])
    wanted = table[table["hi"] == 12345]
    assert as_set(segments.read_matching(segment, wanted).rows) == as_set(wanted)


def test_an_empty_segment_holds_nothing(tmp_path):
    path = str(tmp_path / "blocks-00000.parquet")
    segment = segments.write_segment(path, [])
    assert segment.rows == 0
    assert len(segments.read_matching(segment, numbered(5, 7)).rows) == 0
    assert list(segments.read_segment(segment, 4)) == []


@settings(max_examples=30, deadline=None)
@given(
    size=st.integers(0, 4000),
    asked=st.integers(0, 300),
    foreign=st.integers(0, 300),
    seed=st.integers(0, 2**32 - 1),
    narrow=st.booleans(),
)
def test_read_matching_returns_exactly_the_rows_of_the_keys_asked_for(
    tmp_path_factory, size, asked, foreign, seed, narrow
):
    table = numbered(size, seed)
    if narrow:  # few distinct high halves: runs of equal hi cross row-group boundaries
        table["hi"] %= 7
    path = str(tmp_path_factory.mktemp("segment") / "blocks-00000.parquet")
    segment = segments.write_segment(path, [table])
    rng = np.random.default_rng(seed)
    chosen = table[rng.choice(size, min(asked, size), replace=False)] if size else table
    keys = np.concatenate([chosen, numbered(foreign, seed + 1)])
    assert as_set(segments.read_matching(segment, keys).rows) == as_set(chosen)


# Each merge batch is a Parquet read, so the rows are capped at 64 batches' worth: tiny
# batches are still drawn, over few rows.
MAX_BATCHES_PER_FOLD = 64


@st.composite
def fold_shapes(draw) -> tuple[list[int], int, int]:
    batch = draw(st.one_of(st.integers(1, 16), st.integers(17, 5000)))
    cap = min(3000, batch * MAX_BATCHES_PER_FOLD)
    sizes = draw(st.lists(st.integers(0, cap), max_size=4))
    return sizes, draw(st.integers(0, cap)), batch


@settings(max_examples=25, deadline=None)
@given(shape=fold_shapes(), seed=st.integers(0, 2**32 - 1), narrow=st.booleans())
def test_folding_runs_gives_the_bytes_of_writing_all_rows_at_once(
    tmp_path_factory, shape, seed, narrow
):
    """Streamed k-way folding equals write_segment, whatever the run sizes and batch size."""
    sizes, new, batch = shape
    folder = tmp_path_factory.mktemp("fold")
    everything = numbered(sum(sizes) + new, seed)
    if narrow:  # equal high halves across runs and batches
        everything["hi"] %= 3
    runs, start = [], 0
    for i, size in enumerate(sizes):
        runs.append(
            segments.write_segment(
                str(folder / f"run{i}.parquet"), [everything[start : start + size]]
            )
        )
        start += size
    original = segments.MERGE_BATCH_ROWS
    segments.MERGE_BATCH_ROWS = batch
    try:
        folded = segments.merge_segment(str(folder / "folded.parquet"), runs, everything[start:])
    finally:
        segments.MERGE_BATCH_ROWS = original
    assert folded.rows == len(everything)
    segments.write_segment(str(folder / "whole.parquet"), [everything])
    for name in ("folded", "whole"):
        assert (folder / f"{name}.parquet").exists()
    assert (folder / "folded.parquet").read_bytes() == (folder / "whole.parquet").read_bytes()
    assert (folder / "folded.index.npz").read_bytes() == (folder / "whole.index.npz").read_bytes()


def test_a_segment_files_footer_holds_its_rows_digest(tmp_path):
    """Two files of one row count: without the rows' digest their footers (layout only) could be
    one, and a swap of them would pass the carried-files check (check_listed). A merged file
    holds the digest write_segment gives for the same rows."""
    first, second = numbered(5, 1), numbered(5, 2)
    a = segments.write_segment(str(tmp_path / "a" / "blocks-00000.parquet"), [first])
    b = segments.write_segment(str(tmp_path / "b" / "blocks-00000.parquet"), [second])
    assert a.data["footer_sha256"] != b.data["footer_sha256"]
    merged = segments.merge_segment(str(tmp_path / "m" / "blocks-00000.parquet"), [a], second)
    whole = segments.write_segment(str(tmp_path / "w" / "blocks-00000.parquet"), [first, second])
    assert merged.data == whole.data
    digest = pq.read_metadata(merged.path).metadata[segments.ROWS_SHA256.encode()]
    assert len(digest) == 64


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 20_000))
def test_what_write_segment_writes_is_within_most_bytes(tmp_path_factory, n):
    """most_bytes bounds a staged file by the rows it says it holds: every file write_segment
    writes (its data, footer and index) lies within it, so a launcher that refuses a larger
    one never refuses kvtrace's own."""
    path = str(tmp_path_factory.mktemp("segment") / "blocks-00000.parquet")
    segment = segments.write_segment(path, [numbered(n, n)])
    data = open(path, "rb").read()
    most_data, most_footer, most_index = segments.most_bytes(n)
    assert len(data) <= most_data
    assert int.from_bytes(data[-8:-4], "little") <= most_footer
    assert segment.index["bytes"] <= most_index


def test_a_huge_footer_or_index_is_refused_unread(tmp_path):
    """check_listed on a just-written file: a footer length past most_bytes' is damage told
    before it is read, and an index of another size is refused within a read past its recorded
    size (never held whole); either says why, apart from the map's advice (DamagedFile.why),
    and the refusal survives a Beam child's pickling."""
    import os
    import pickle

    import pytest

    path = str(tmp_path / "blocks-00000.parquet")
    segment = segments.write_segment(path, [numbered(10, 0)])
    assert segments.check_listed(segment) == 10
    index = segments.index_path(path)
    os.truncate(index, 1 << 30)  # sparse: a digest of all of it would read a GiB
    with pytest.raises(segments.DamagedFile) as refused:
        segments.check_listed(segment)
    assert "sha256 or size" in refused.value.why
    assert pickle.loads(pickle.dumps(refused.value)).why == refused.value.why
    segment = segments.write_segment(path, [numbered(10, 0)])
    os.truncate(path, (1 << 30) + 16)  # sparse, its last 8 bytes a footer of a GiB
    with open(path, "r+b") as handle:
        handle.seek(-8, os.SEEK_END)
        handle.write((1 << 30).to_bytes(4, "little") + b"PAR1")
    grown = segment._replace(data=segment.data | {"bytes": (1 << 30) + 16})
    with pytest.raises(segments.DamagedFile, match=f"a footer of {1 << 30} bytes"):
        segments.check_listed(grown)
