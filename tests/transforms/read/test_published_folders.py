"""Readers trust only a whole published folder: its manifest there, every shard it lists and no
other, each shard's bytes those the manifest's sha256 names, its rows the records it exported."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.read.paths import count_lines
from transforms.read.trace_inputs import NotWholeOutput, published_folder, trace_files
from transforms.read.trace_io import _Tally, read_trace

ROWS = [{"timestamp": 1000 * i, "input_length": 8, "output_length": 1, "hash_ids": [0, i]}
        for i in range(5)]


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def published(folder: Path, shards: list[list[dict]], exported: int | None = None) -> Path:
    """A folder as kvtrace publishes it: JSONL and Parquet twins, a manifest listing both."""
    folder.mkdir()
    for index, rows in enumerate(shards):
        name = f"trace-{index:05d}-of-{len(shards):05d}"
        (folder / f"{name}.jsonl").write_bytes(_jsonl(rows))
        pq.write_table(pa.Table.from_pylist(rows), folder / f"{name}.parquet")
    sha256 = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    (folder / "manifest.json").write_text(json.dumps({
        "format": "mooncake-trace", "block_size": 4, "files": sorted(sha256), "sha256": sha256,
        "records": {"exported": sum(map(len, shards)) if exported is None else exported}}))
    return folder


def _read(argument: str):
    return read_trace(trace_files([argument]))


def test_a_whole_folder_is_read(tmp_path):
    folder = published(tmp_path / "out", [ROWS[:2], ROWS[2:]])
    assert len(_read(str(folder))) == 5
    assert len(_read(str(folder / "trace-*.parquet"))) == 5  # either twin, each checked


@pytest.mark.parametrize("cut", [
    lambda rows: rows[:-1],                       # whole lines dropped
    lambda rows: rows[:-1] + [{**rows[-1], "input_length": 9}],  # one number changed
    lambda rows: [],                              # emptied
])
def test_a_shard_that_is_not_the_published_one_is_refused(tmp_path, cut):
    folder = published(tmp_path / "out", [ROWS[:2], ROWS[2:]])
    (folder / "trace-00001-of-00002.jsonl").write_bytes(_jsonl(cut(ROWS[2:])))
    for argument in (folder, folder / "trace-*.jsonl", folder / "trace-00001-of-00002.jsonl"):
        with pytest.raises(NotWholeOutput, match=r"out is not a whole kvtrace output: "
                           r"trace-00001-of-00002\.jsonl differs from its manifest "
                           r"\(copied partly\?\)$"):
            _read(str(argument))


def test_a_parquet_twin_that_is_not_the_published_one_is_refused(tmp_path):
    folder = published(tmp_path / "out", [ROWS])
    pq.write_table(pa.Table.from_pylist(ROWS[:2]), folder / "trace-00000-of-00001.parquet")
    with pytest.raises(NotWholeOutput, match="trace-00000-of-00001.parquet differs"):
        _read(str(folder / "trace-*.parquet"))


def test_a_folder_without_its_manifest_or_a_listed_shard_is_refused_before_reading(tmp_path):
    folder = published(tmp_path / "out", [ROWS[:2], ROWS[2:]])
    (folder / "trace-00001-of-00002.jsonl").unlink()
    with pytest.raises(NotWholeOutput, match="trace-00001-of-00002.jsonl is missing"):
        trace_files([str(folder)])
    (folder / "manifest.json").unlink()
    with pytest.raises(NotWholeOutput, match="its manifest.json is missing"):
        trace_files([str(folder)])


@pytest.mark.parametrize("name", ["trace-00000-of-00002.jsonl", "trace-extra.jsonl"])
def test_a_trace_file_the_manifest_does_not_list_is_refused(tmp_path, name):
    folder = published(tmp_path / "out", [ROWS])
    (folder / name).write_bytes(_jsonl(ROWS))
    with pytest.raises(NotWholeOutput, match=f"{name} differs"):
        trace_files([str(folder)])
    if name.startswith("trace-0"):  # by kvtrace's name: the folder's, whoever names it
        with pytest.raises(NotWholeOutput, match=f"{name} differs"):
            _read(str(folder / name))


@pytest.mark.parametrize("manifest", [b"{", b"[]", b'{"block_size": 4}',
                                      b'{"format": "mooncake-trace", "sha256": {}}'])
def test_a_manifest_kvtrace_would_not_write_is_refused(tmp_path, manifest):
    folder = published(tmp_path / "out", [ROWS])
    (folder / "manifest.json").write_bytes(manifest)
    with pytest.raises(NotWholeOutput, match="manifest.json"):
        _read(str(folder))


def test_rows_that_do_not_add_up_to_the_records_exported_are_refused(tmp_path):
    folder = published(tmp_path / "out", [ROWS[:2], ROWS[2:]], exported=6)
    with pytest.raises(NotWholeOutput, match="its shards hold 5 rows, its manifest says 6"):
        _read(str(folder))
    assert len(_read(str(folder / "trace-00000-of-00002.jsonl"))) == 2  # a part: no sum


def test_a_lone_trace_file_is_read_as_it_is(tmp_path):
    lone = tmp_path / "trace-00000-of-00001.jsonl"  # kvtrace's name, but no folder's shard
    lone.write_bytes(_jsonl(ROWS[:3]))
    assert len(_read(str(lone))) == 3


def test_an_empty_published_shard_is_read(tmp_path):
    folder = published(tmp_path / "out", [[]])
    assert len(_read(str(folder))) == 0


@given(st.binary(max_size=3000), st.integers(1, 700))
def test_the_tally_counts_and_hashes_as_a_second_pass_would(data, size):
    tally = _Tally(io.BytesIO(data), hashed=True)
    while tally.read(size):
        pass
    assert tally.sha256() == hashlib.sha256(data).hexdigest()
    assert tally.lines == data.count(b"\n") + (not data.endswith(b"\n") and len(data) > 0)


def test_the_tally_counts_lines_as_count_lines_does(tmp_path):
    for data in (b"", b"a", b"a\n", b"a\nb", b"\n\n"):
        path = tmp_path / "t.jsonl"
        path.write_bytes(data)
        tally = _Tally(io.BytesIO(data), hashed=False)
        tally.drain()
        assert tally.lines == count_lines(str(path)) and tally.sha256() is None


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


@settings(max_examples=100, deadline=None)
@given(st.one_of(
    st.binary(max_size=64),
    JSON.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"format": st.just("mooncake-trace"), "sha256": JSON,
                           "records": JSON}).map(lambda v: json.dumps(v).encode())))
def test_any_manifest_is_read_or_refused_in_one_line(tmp_path_factory, manifest):
    folder = tmp_path_factory.mktemp("out")
    (folder / "manifest.json").write_bytes(manifest)
    try:
        published_folder(str(folder))
    except NotWholeOutput as err:
        assert "\n" not in str(err) and str(err).endswith("(copied partly?)")
