"""Readers trust only a whole published folder: its manifest there, every file it lists and no
other trace file, each file's bytes those the manifest's sha256 names, its rows the records it
exported; however it is named, and whatever is published over it while it is read."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import weakref
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.read.paths import count_lines
from kvtrace.transforms.read.trace_inputs import (
    MAX_HELD_FOLDERS,
    NotWholeOutput,
    declared_block_size,
    opened_folder,
    published_shards,
    trace_files,
)
from kvtrace.transforms.read.trace_io import _read_file, _Tally, read_trace

ROWS = [
    {"timestamp": 1000 * i, "input_length": 8, "output_length": 1, "hash_ids": [0, i]}
    for i in range(5)
]


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def published(
    folder: Path, shards: list[list[dict]], exported: int | None = None, block_size: int = 4
) -> Path:
    """A folder as kvtrace publishes it: JSONL and Parquet twins, stats.json, a manifest
    listing them."""
    folder.mkdir()
    for index, rows in enumerate(shards):
        name = f"trace-{index:05d}-of-{len(shards):05d}"
        (folder / f"{name}.jsonl").write_bytes(_jsonl(rows))
        pq.write_table(pa.Table.from_pylist(rows), folder / f"{name}.parquet")
    (folder / "stats.json").write_text(json.dumps({"rows": sum(map(len, shards))}))
    sha256 = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    (folder / "manifest.json").write_text(
        json.dumps(
            {
                "format": "mooncake-trace",
                "block_size": block_size,
                "files": sorted(sha256),
                "sha256": sha256,
                "records": {"exported": sum(map(len, shards)) if exported is None else exported},
            }
        )
    )
    return folder


def _read(argument: str):
    return read_trace(trace_files([argument]))


def test_a_whole_folder_is_read(tmp_path):
    folder = published(tmp_path / "out", [ROWS[:2], ROWS[2:]])
    assert len(_read(str(folder))) == 5
    assert len(_read(str(folder / "trace-*.parquet"))) == 5  # either twin, each checked


@pytest.mark.parametrize(
    "cut",
    [
        lambda rows: rows[:-1],  # whole lines dropped
        lambda rows: rows[:-1] + [{**rows[-1], "input_length": 9}],  # one number changed
        lambda rows: [],  # emptied
    ],
)
def test_a_shard_that_is_not_the_published_one_is_refused(tmp_path, cut):
    folder = published(tmp_path / "out", [ROWS[:2], ROWS[2:]])
    (folder / "trace-00001-of-00002.jsonl").write_bytes(_jsonl(cut(ROWS[2:])))
    for argument in (folder, folder / "trace-*.jsonl", folder / "trace-00001-of-00002.jsonl"):
        with pytest.raises(
            NotWholeOutput,
            match=r"out is not a whole kvtrace output: "
            r"trace-00001-of-00002\.jsonl differs from its manifest "
            r"\(copied partly\?\)$",
        ):
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


@pytest.mark.parametrize(
    "manifest", [b"{", b"[]", b'{"block_size": 4}', b'{"format": "mooncake-trace", "sha256": {}}']
)
def test_a_manifest_kvtrace_would_not_write_is_refused(tmp_path, manifest):
    folder = published(tmp_path / "out", [ROWS])
    (folder / "manifest.json").write_bytes(manifest)
    with pytest.raises(NotWholeOutput, match="manifest.json"):
        _read(str(folder))


@pytest.mark.parametrize("block_size", ["16", 16.0, 0, -4, True, 1 << 21, 1 << 60])
def test_a_declared_block_size_no_block_size_flag_takes_is_refused_not_read_as_none(
    tmp_path, block_size
):
    folder = published(tmp_path / "out", [ROWS], block_size=block_size)
    with pytest.raises(NotWholeOutput, match="declares block size"):
        _read(str(folder))


def test_a_derived_manifest_is_checked_against_its_declared_schema(tmp_path):
    folder = published(tmp_path / "out", [ROWS])
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["derived_from"] = {"command": "no-such-command"}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(NotWholeOutput, match=r"not one kvtrace writes \(.*required property"):
        _read(str(folder))


def test_a_block_size_within_the_flags_bound_is_read_as_declared(tmp_path):
    folder = published(tmp_path / "out", [ROWS], block_size=1 << 20)
    assert declared_block_size(trace_files([str(folder)])) == 1 << 20


def test_rows_that_do_not_add_up_to_the_records_exported_are_refused(tmp_path):
    folder = published(tmp_path / "out", [ROWS[:2], ROWS[2:]], exported=6)
    with pytest.raises(NotWholeOutput, match="its shards hold 5 rows, its manifest says 6"):
        _read(str(folder))
    assert len(_read(str(folder / "trace-00000-of-00002.jsonl"))) == 2  # a part: no sum


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


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=64),
        JSON.map(lambda v: json.dumps(v).encode()),
        st.fixed_dictionaries(
            {"format": st.just("mooncake-trace"), "sha256": JSON, "records": JSON}
        ).map(lambda v: json.dumps(v).encode()),
    )
)
def test_any_manifest_is_read_or_refused_in_one_line(tmp_path_factory, manifest):
    folder = tmp_path_factory.mktemp("out")
    (folder / "manifest.json").write_bytes(manifest)
    try:
        with opened_folder(str(folder)):
            pass
    except NotWholeOutput as err:
        assert "\n" not in str(err) and str(err).endswith("(copied partly?)")


def test_a_folder_is_read_by_its_own_name_not_as_a_glob(tmp_path):
    named = published(tmp_path / "night[1]", [ROWS[:2]])
    published(tmp_path / "night1", [ROWS])  # what night[1] matches as a glob
    assert len(_read(str(named))) == 2


@pytest.mark.parametrize("lost", ["manifest.json", "trace-00001-of-00002.jsonl"])
@pytest.mark.parametrize(
    "spelling", ["trace-*.jsonl", "trace-*.parquet", "trace-00000-of-00002.jsonl"]
)
def test_a_shard_read_however_named_makes_its_folder_read_whole(tmp_path, lost, spelling):
    folder = published(tmp_path / "out", [ROWS[:2], ROWS[2:]])
    (folder / lost).unlink()
    with pytest.raises(
        NotWholeOutput, match=f"{'its ' if lost == 'manifest.json' else ''}{lost} is missing"
    ):
        _read(str(folder / spelling))


@pytest.mark.parametrize("damage", ["cut", "missing"])
@pytest.mark.parametrize("name", ["trace-00000-of-00002.parquet", "stats.json"])
def test_every_file_the_manifest_lists_is_there_with_its_sha256(tmp_path, damage, name):
    folder = published(tmp_path / "out", [ROWS[:2], ROWS[2:]])
    if damage == "cut":
        (folder / name).write_bytes((folder / name).read_bytes()[:-1])
    else:
        (folder / name).unlink()
    why = "differs from its manifest" if damage == "cut" else "is missing"
    for argument in (folder, folder / "trace-00001-of-00002.jsonl"):
        with pytest.raises(NotWholeOutput, match=f"{name} {why}"):
            _read(str(argument))


def test_a_file_of_the_folder_that_is_a_link_or_a_fifo_is_refused_in_one_line(tmp_path):
    folder = published(tmp_path / "out", [ROWS])
    (folder / "stats.json").rename(tmp_path / "stats.json")
    (folder / "stats.json").symlink_to(tmp_path / "stats.json")  # the same bytes, elsewhere
    with pytest.raises(NotWholeOutput, match=r"stats\.json cannot be read"):
        _read(str(folder))
    (folder / "stats.json").unlink()
    os.mkfifo(folder / "stats.json")  # opened without waiting: refused, never blocks
    with pytest.raises(NotWholeOutput, match=r"stats\.json cannot be read .*not a regular"):
        _read(str(folder))


def test_a_lone_shard_among_other_traces_is_refused_not_read_in_part(tmp_path):
    (tmp_path / "trace-00000-of-00001.jsonl").write_bytes(_jsonl(ROWS[:3]))
    (tmp_path / "other.jsonl").write_bytes(_jsonl(ROWS))
    with pytest.raises(NotWholeOutput, match="its manifest.json is missing"):
        _read(str(tmp_path / "*.jsonl"))
    assert len(_read(str(tmp_path / "other.jsonl"))) == 5  # the folder's other traces read


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize("blank_line", [False, True])  # True: the line-by-line path
def test_a_shard_is_read_from_the_folder_opened_with_its_manifest(tmp_path, suffix, blank_line):
    """A publish swaps the folder (rename) after its manifest was read: the shard read is the
    one of the output whose manifest was read, from the bytes checked against it."""
    old = published(tmp_path / "out", [ROWS[:2]])
    new = published(tmp_path / "next", [ROWS[2:]])
    if blank_line and suffix == ".jsonl":
        for folder in (old, new):
            shard = folder / "trace-00000-of-00001.jsonl"
            shard.write_bytes(shard.read_bytes() + b"\n")
            manifest = json.loads((folder / "manifest.json").read_text())
            manifest["sha256"][shard.name] = hashlib.sha256(shard.read_bytes()).hexdigest()
            (folder / "manifest.json").write_text(json.dumps(manifest))
    path = str(old / f"trace-00000-of-00001{suffix}")
    found = published_shards([path])
    try:
        os.rename(old, tmp_path / "previous")  # the next output published in out's place
        os.rename(new, old)
        (part,) = _read_file(path, found[path])
    finally:
        found[path].close()
    assert list(part["input_length"]) == [8, 8] and list(part["line"]) == [1, 2]
    assert len(_read(str(old))) == 3  # the next read meets the new output, whole


def test_a_shard_read_line_by_line_is_checked_too(tmp_path):
    folder = published(tmp_path / "out", [ROWS])
    shard = folder / "trace-00000-of-00001.jsonl"
    shard.write_bytes(shard.read_bytes().replace(b'"input_length": 8', b'"input_length": "8"', 1))
    with pytest.raises(NotWholeOutput, match="trace-00000-of-00001.jsonl differs"):
        _read(str(shard))


DAMAGE = st.sampled_from(["unlink", "cut", "grow", "none"])


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 5),
    DAMAGE,
    st.integers(0, 10_000),
    st.sampled_from(["", "trace-*.jsonl", "trace-*.parquet", "trace-00001-of-00002.jsonl"]),
)
def test_a_damaged_copy_is_refused_or_read_whole(tmp_path_factory, victim, damage, cut, spelling):
    """Whatever one file of a published folder (6: manifest, stats, 2 twins of 2 shards) loses or
    gains, and however the folder is named, a reader refuses it in one line or reads exactly
    the published rows."""
    folder = published(tmp_path_factory.mktemp("copy") / "out", [ROWS[:2], ROWS[2:]])
    target = sorted(folder.iterdir())[victim]
    data = target.read_bytes()
    if damage == "unlink":
        target.unlink()
    elif damage in ("cut", "grow"):
        target.write_bytes(data[: cut % max(len(data), 1)] if damage == "cut" else data + b" ")
    # A space after the manifest's JSON promises the same; any other change breaks a promise.
    whole = damage == "none" or (damage == "grow" and target.name == "manifest.json")
    try:
        trace = _read(str(folder / spelling) if spelling else str(folder))
    except NotWholeOutput as err:
        assert not whole and "\n" not in str(err)
        return
    except FileNotFoundError as err:  # the one file named is the one gone: "matches no file"
        assert damage == "unlink" and target.name == spelling and "\n" not in str(err)
        return
    assert whole
    rows = 3 if spelling == "trace-00001-of-00002.jsonl" else 5
    assert trace.input_length.tolist() == [8] * rows and trace.malformed_count == 0


def _swap(out: Path, staged: Path) -> None:
    """The next night's publish: out moved aside, the staged folder renamed into its place."""
    os.rename(out, out.with_name("previous"))
    os.rename(staged, out)


def test_the_block_size_and_the_rows_come_from_the_one_pin(tmp_path):
    out = published(tmp_path / "out", [ROWS[:2]], block_size=4)
    staged = published(tmp_path / "next", [ROWS[2:]], block_size=8)
    files = trace_files([str(out)])  # pinned here
    _swap(out, staged)
    assert declared_block_size(files) == 4
    assert len(read_trace(files)) == 2
    fresh = trace_files([str(out)])
    assert declared_block_size(fresh) == 8 and len(read_trace(fresh)) == 3


def test_traces_read_together_are_read_at_the_one_block_size_they_declare(tmp_path):
    four = published(tmp_path / "four", [ROWS[:2]], block_size=4)
    again = published(tmp_path / "again", [ROWS[2:]], block_size=4)
    eight = published(tmp_path / "eight", [ROWS[2:]], block_size=8)
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(_jsonl(ROWS))
    assert declared_block_size(trace_files([str(four), str(again)])) == 4
    assert declared_block_size(trace_files([str(plain)])) is None  # the command's default
    assert declared_block_size(trace_files([str(plain)]), 16) == 16
    assert declared_block_size(trace_files([str(four), str(plain)]), 4) == 4
    with pytest.raises(
        ConfigError,
        match=r"four/manifest.json declares block size 4, .*eight/"
        r"manifest.json declares 8: read them apart$",
    ):
        declared_block_size(trace_files([str(four), str(eight)]))
    with pytest.raises(
        ConfigError,
        match=r"eight/manifest.json declares block size 8, .*plain"
        r".jsonl declares none: read them apart, or give "
        r"--block-size 8$",
    ):  # never read at the default
        declared_block_size(trace_files([str(plain), str(eight)]))
    with pytest.raises(ConfigError, match=r"--block-size 4, but .*eight/manifest.json declares 8"):
        declared_block_size(trace_files([str(four), str(eight)]), 4)


@pytest.fixture
def every_folder_held(monkeypatch):
    """Pins other tests of this worker still hold count against MAX_HELD_FOLDERS: a test of
    what a held descriptor does must hold its folder whatever ran before it."""
    from kvtrace.transforms.read import trace_inputs

    monkeypatch.setattr(trace_inputs, "MAX_HELD_FOLDERS", 1 << 20)


def test_a_pin_that_travels_reads_the_pinned_output_or_is_refused(tmp_path, every_folder_held):
    """A Beam worker gets the files pickled: in this process the folder as opened (the
    previous night, whole); in another, that has no descriptor of it, the file opened by path
    and checked against the pinned sha256 (the next night's: refused in one line)."""
    out = published(tmp_path / "out", [ROWS[:2]])
    staged = published(tmp_path / "next", [ROWS[2:]])
    files = trace_files([str(out)])
    sent = pickle.dumps(files)
    _swap(out, staged)
    assert read_trace(pickle.loads(sent)).input_length.tolist() == [8, 8]
    elsewhere = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pickle, sys\n"
            "from kvtrace.transforms.read.trace_io import read_trace\n"
            "read_trace(pickle.loads(sys.stdin.buffer.read()))",
        ],
        input=sent,
        capture_output=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert elsewhere.returncode != 0
    assert (
        b"trace-00000-of-00001.jsonl differs from its manifest (copied partly?)" in elsewhere.stderr
    )


def _opened_under(folder: Path) -> int:
    """Descriptors of this process open on folder or what is in it: threads other tests leave
    behind (a runner's channels) open others, and must not count."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed between listing and reading
            continue
        count += target == str(folder) or target.startswith(f"{folder}/")
    return count


def test_the_folders_held_open_are_a_few_however_many_are_read(tmp_path):
    """Past MAX_HELD_FOLDERS, a folder is open only while a file of it is opened: descriptors
    do not grow with the folders a command reads (docs/BOUNDS.md)."""
    count = MAX_HELD_FOLDERS + 20
    folders = [str(published(tmp_path / f"out{i}", [ROWS])) for i in range(count)]
    files = trace_files(folders)
    assert _opened_under(tmp_path) <= MAX_HELD_FOLDERS
    assert len(read_trace(files)) == 5 * count
    assert _opened_under(tmp_path) <= MAX_HELD_FOLDERS


def test_a_folder_not_held_and_swapped_after_it_was_pinned_is_refused_not_read(tmp_path):
    """A folder pinned past the ones held keeps its identity: opened again to read a shard, it
    must be the one whose manifest was read, as a held descriptor makes sure."""
    held = [str(published(tmp_path / f"held{i}", [ROWS])) for i in range(MAX_HELD_FOLDERS)]
    out = published(tmp_path / "out", [ROWS])
    files = trace_files([*held, str(out)])
    staged = published(tmp_path / "next", [ROWS])  # the same bytes, another folder
    _swap(out, staged)
    with pytest.raises(NotWholeOutput, match="replaced since its manifest was read"):
        read_trace(files)


def test_a_pinned_folder_is_closed_once_its_files_are_dropped(tmp_path, every_folder_held):
    folder = published(tmp_path / "out", [ROWS[:2], ROWS[2:]])
    files = trace_files([str(folder)])
    assert len(read_trace(files)) == 5
    assert {f.published for f in files} == {files[0].published}  # one pin, held by the files
    descriptor, pin = files[0].published.descriptor, weakref.ref(files[0].published)
    assert os.readlink(f"/proc/self/fd/{descriptor}") == str(folder)
    del files
    gc.collect()
    assert pin() is None
    with contextlib.suppress(FileNotFoundError):  # closed, or the number taken by another file
        assert os.readlink(f"/proc/self/fd/{descriptor}") != str(folder)


@pytest.mark.parametrize(
    "name",
    [
        "trace-00000-of-00001.jsonl",
        "trace-00001-of-00003.jsonl",
        "trace-00000-of-00003.jsonl",
        "trace-00000-of-00002.parquet",
    ],
)
def test_a_shard_without_its_manifest_is_refused_whatever_its_name_says(tmp_path, name):
    """A one-shard night copied halfway is still trace-00000-of-00001: only a manifest proves
    a shard whole, so a shard with none is refused however it is named, or read directly."""
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / name).write_bytes(_jsonl(ROWS[:3]) if name.endswith(".jsonl") else b"")
    why = (
        f"copy is not a whole kvtrace output: its manifest.json is missing, and only it "
        f"proves {name} whole"
    )
    for argument in (copy, copy / name, copy / "*"):
        with pytest.raises(NotWholeOutput, match=why):
            trace_files([str(argument)])
    with pytest.raises(NotWholeOutput, match=why):
        read_trace([str(copy / name)])
    os.rename(copy / name, copy / "night.jsonl")  # a trace of its own, by a name of its own
    assert len(_read(str(copy / "night.jsonl"))) == (3 if name.endswith(".jsonl") else 0)


SPELLINGS = [
    "out",
    "./out",
    "{abs}",
    "alias",
    "out/",
    "out/trace-*.jsonl",
    "out/trace-*",
    "./out/trace-00001-of-00002.parquet",
    "alias/trace-00000-of-00002.jsonl",
]


@pytest.mark.parametrize("second", SPELLINGS)
def test_an_output_named_twice_is_read_once(tmp_path, monkeypatch, caplog, second):
    published(tmp_path / "out", [ROWS[:2], ROWS[2:]])
    (tmp_path / "alias").symlink_to("out")
    monkeypatch.chdir(tmp_path)
    files = trace_files(["out", second.format(abs=tmp_path / "out")])
    assert files == ["out/trace-00000-of-00002.jsonl", "out/trace-00001-of-00002.jsonl"]
    assert len(read_trace(files)) == 5
    if not second.endswith(".parquet"):  # a shard named twice, not only its twin
        assert "read once as out/trace-0000" in caplog.text


FILES = [
    "manifest.json",
    "stats.json",
    "trace-00000-of-00002.jsonl",
    "trace-00000-of-00002.parquet",
    "trace-00001-of-00002.jsonl",
    "trace-00001-of-00002.parquet",
]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(FILES), st.sampled_from(["", "./", "{abs}/"])),
        min_size=1,
        max_size=8,
    )
)
def test_any_files_of_an_output_named_are_its_rows_once_or_refused(tmp_path_factory, named):
    """However often and however spelled its files are named: all of them (a glob of the
    folder) read the folder; shards alone, each shard's rows once (one twin or the other); the
    manifest or stats.json among some of them: no trace, refused in one line."""
    root = tmp_path_factory.mktemp("named")
    published(root / "out", [ROWS[:2], ROWS[2:]])
    arguments = [f"{prefix.format(abs=root)}out/{name}" for name, prefix in named]
    names = {name for name, _ in named}
    os.chdir(root)  # the relative spellings
    try:
        trace = read_trace(trace_files(arguments))
    except ConfigError as err:  # the manifest or stats.json named as a trace
        assert "\n" not in str(err) and "not a trace: name the folder, or its shards" in str(err)
        assert names & {"manifest.json", "stats.json"} and names != set(FILES)
        return
    shards = {name[: len("trace-00000-of-00002")] for name in names if name.startswith("trace")}
    assert len(trace) == 2 * ("trace-00000-of-00002" in shards) + 3 * (
        "trace-00001-of-00002" in shards
    )
    assert names == set(FILES) or not names & {"manifest.json", "stats.json"}


def test_a_glob_of_a_whole_output_reads_the_folder(tmp_path):
    folder = published(tmp_path / "out", [ROWS[:2], ROWS[2:]])
    assert trace_files([str(folder / "*")]) == trace_files([str(folder)])
    (folder / "notes.txt").write_text("mine")  # not kvtrace's: the glob names a trace file
    with pytest.raises(NotWholeOutput, match="notes.txt differs from its manifest"):
        trace_files([str(folder / "*")])


LINKED = [dict(row, parent_row=0) if i in (1, 3) else row for i, row in enumerate(ROWS)]


def test_each_outputs_parents_name_its_own_rows_however_many_are_read_together(tmp_path):
    """parent_row counts from its output's first row (its first shard's): read after another
    output, or after a file of its own, it is offset to where that output's rows are read."""
    first = published(tmp_path / "n1", [LINKED[:2], LINKED[2:]])
    second = published(tmp_path / "n2", [LINKED[:3], LINKED[3:]])
    loose = tmp_path / "loose.jsonl"
    loose.write_bytes(_jsonl(LINKED))
    parents = read_trace(trace_files([str(first), str(loose), str(second)])).parents()
    assert parents.tolist() == [-1, 0, -1, 0, -1] + [-1, 5, -1, 5, -1] + [-1, 10, -1, 10, -1]


def test_a_parent_that_names_no_earlier_row_of_its_own_trace_is_refused_in_one_line(tmp_path):
    """Not a row of the file read before it: a parent past its own trace's rows so far."""
    before, after = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    before.write_bytes(_jsonl(ROWS))
    after.write_bytes(_jsonl([ROWS[0], dict(ROWS[1], parent_row=3)]))
    trace = read_trace([str(before), str(after)])
    assert len(trace) == 7  # read whole: only its parents are refused
    with pytest.raises(ValueError, match=r"^row 6's parent_row 3 does not precede it in its own"):
        trace.parents()


def test_a_shard_whose_place_in_its_output_is_not_read_has_its_parents_refused(tmp_path):
    """A later shard read without the ones before it (or before them): where its rows stand
    in their output, from which its parent_row counts, is not known."""
    folder = published(tmp_path / "out", [LINKED[:2], LINKED[2:]])
    later = str(folder / "trace-00001-of-00002.jsonl")
    with pytest.raises(ValueError, match=r"^row 1's parent_row 0 does not precede it in its own"):
        read_trace(trace_files([later])).parents()
    earlier = str(folder / "trace-00000-of-00002.jsonl")
    with pytest.raises(ValueError, match="^row 1's parent_row 0"):
        read_trace(trace_files([later, earlier])).parents()
    assert read_trace(trace_files([earlier])).parents().tolist() == [-1, 0]
