"""write/publish.py's names beside an output (staging, previous, parts, lock) at the bounds of
a file name, and the one-line refusals of a file or folder output before any work."""

from __future__ import annotations

import hashlib
import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.ids.id_map import new_run_id
from kvtrace.transforms.write.publish import (
    NAME_MAX,
    OutputRefused,
    check_file,
    check_output,
    foreign_files,
    lock_path,
    staging_folder,
    staging_leftover,
)

NAMES = st.integers(1, NAME_MAX).map(lambda n: "n" * n)
# What kvtrace puts after a staging folder's name: a run's own (12 hex digits) with the
# two-rename swap's .previous or Beam's synthesize .parts; a block-hashes folder's (16).
RUN_FORMS = [("0" * 12, ""), ("0" * 12, ".previous"), ("0" * 12, ".parts"), ("0" * 16, "")]


@settings(max_examples=80, deadline=None)
@given(NAMES, st.sampled_from(RUN_FORMS))
def test_every_name_beside_an_output_fits_a_file_name(name, form):
    """An output of any legal name has staging and lock names the filesystem takes."""
    run_id, suffix = form
    staged = os.path.basename(staging_folder(f"/data/{name}", run_id)) + suffix
    assert len(os.fsencode(staged)) <= NAME_MAX
    assert len(os.fsencode(os.path.basename(lock_path(f"/data/{name}")))) <= NAME_MAX


def test_a_block_hashes_folders_previous_name_fits_a_file_name():
    """Where RENAME_EXCHANGE is unsupported, publish_block_hashes moves the previous folder to
    its staging name + .previous: for a 213-216 byte folder name that is an OSError traceback
    after the trace is published."""
    for length in range(1, NAME_MAX + 1):
        staged = os.path.basename(staging_folder(f"/data/{'h' * length}", "0" * 16))
        assert len(os.fsencode(staged + ".previous")) <= NAME_MAX, length


@settings(max_examples=25, deadline=None)
@given(NAMES, st.sampled_from(RUN_FORMS))
def test_a_staging_name_is_found_again_as_its_outputs_leftover_only(name, form):
    """The stem of a long name is a digest, the same on every run: a next run finds a killed
    one's staging by it, and never takes it for another output's."""
    run_id, suffix = form
    other = name[:-1] + "m"
    with tempfile.TemporaryDirectory() as parent:
        staged = os.path.basename(staging_folder(f"{parent}/{name}", run_id)) + suffix
        assert staged.startswith(".")
        open(os.path.join(parent, staged), "wb").close()
        assert staging_leftover(parent, staged, name)
        assert not staging_leftover(parent, staged, other)


def test_a_long_names_killed_staging_is_cleared_and_a_neighbours_is_kept(tmp_path):
    name, neighbour = "x" * 240, "x" * 239 + "y"
    for output in (name, neighbour):
        os.mkdir(staging_folder(str(tmp_path / output), new_run_id()))
    entries = os.listdir(tmp_path)
    assert [staging_leftover(str(tmp_path), e, name) for e in entries].count(True) == 1
    assert [staging_leftover(str(tmp_path), e, neighbour) for e in entries].count(True) == 1


@pytest.mark.parametrize("output", ["out/", "out/.", "a/..", "."])
def test_a_file_output_spelled_as_a_folder_is_refused(tmp_path, output):
    with pytest.raises(OutputRefused, match="names a folder; the output is one file"):
        check_file(f"{tmp_path}/{output}" if output != "." else output, overwrite=True)


def test_a_file_output_under_a_file_is_refused_before_the_work(tmp_path):
    (tmp_path / "plain").write_bytes(b"")
    with pytest.raises(OutputRefused, match=r"plain is not a folder"):
        check_file(str(tmp_path / "plain" / "deeper" / "out.jsonl"), overwrite=True)


def test_a_file_in_a_folder_outputs_place_is_all_foreign(tmp_path):
    (tmp_path / "out").write_bytes(b"mine")
    assert foreign_files(str(tmp_path / "out")) == [str(tmp_path / "out")]
    assert foreign_files(str(tmp_path / "absent")) == []


def test_many_foreign_files_are_named_five_then_counted_in_one_line(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for i in range(8):
        (out / f"f{i}").write_bytes(b"")
    with pytest.raises(OutputRefused) as refused:
        check_output(str(out))
    message = str(refused.value)
    assert "\n" not in message and "f0, f1, f2, f3, f4 and 3 more" in message


@settings(max_examples=60, deadline=None)
@given(st.one_of(NAMES, st.text(min_size=1, max_size=40).filter(lambda n: "/" not in n)))
def test_no_two_outputs_share_a_lock_or_a_staging_name(name):
    """The stem is one output's: a short name spelled like a long name's digest stem (or any
    name starting with the digest's mark) is digested itself, so it never names the long
    output's lock or staging folder (whose `.previous` would be taken for its own)."""
    digest = "~" + hashlib.sha256(os.fsencode(name)).hexdigest()[:32]
    for a, b in ((name, digest), (digest, "~" + digest)):
        if a != b:
            assert lock_path(f"/d/{a}") != lock_path(f"/d/{b}")
            assert staging_folder(f"/d/{a}", "0" * 12) != staging_folder(f"/d/{b}", "0" * 12)


@pytest.mark.parametrize("name", ["trace-00000-of-00001.jsonl", "trace-00003-of-00010.parquet"])
def test_a_file_output_never_takes_a_shards_name(tmp_path, name):
    """kvtrace's readers take a file by a shard's name only with its folder's manifest
    (trace_inputs._check_lone): a single-file writer (synthesize, convert -o FILE) refuses the
    name before any work, rather than publish a file its own readers refuse."""
    from kvtrace.transforms.write.publish import FILE, Location, plan_locations

    with pytest.raises(OutputRefused, match="a shard's name"):
        plan_locations([], [Location("-o", str(tmp_path / name), FILE)])
    plan_locations([], [Location("-o", str(tmp_path / ("my-" + name)), FILE)])


def test_the_staging_and_lock_names_of_a_name_that_is_not_utf8_are_text():
    """Linux names are bytes: b'syn\\xff.jsonl' reaches Python as a surrogate, which Beam's
    steps (UTF-8 text) cannot carry. Its stem is a digest, so a Beam engine's staging paths
    (synthesize's parts, anonymize's shards) are text, one per name."""
    names = [os.fsdecode(b"syn\xff.jsonl"), os.fsdecode(b"syn\xfe.jsonl")]
    staged = [staging_folder(f"/d/{name}", "0" * 12) + ".parts" for name in names]
    assert all(path.encode() for path in staged) and staged[0] != staged[1]
    assert lock_path(f"/d/{names[0]}").encode() != lock_path(f"/d/{names[1]}").encode()
    assert staging_folder("/d/syn.jsonl", "0" * 12) == "/d/.syn.jsonl.kvtrace-staging-" + "0" * 12
