"""publish.plan_locations: every location a command reads and writes, checked together before
any work; the relations (equal, inside, around) hold whatever the spelling."""

from __future__ import annotations

import errno
import json
import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtrace.transforms.write.publish import (
    FILE,
    FOLDER,
    NAME_MAX,
    Location,
    OutputRefused,
    file_output,
    folder_output,
    mark_output,
    plan_locations,
    spots_beneath,
    staging_folder,
)

SEGMENTS = st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=3)
# What makes a manifest one kvtrace writes, by the readers' test (trace_inputs.published_folder).
KVTRACES = {"sha256": {}, "records": {"exported": 0}}
EXAMPLES = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _spelled(base, segments: list[str], data, folder: bool) -> str:
    """The same location spelled another way: through a link to its base, or through `deep`,
    a link two folders down, then `../..` (the kernel takes `..` after the link: a lexical
    fold would leave base), with `.`, `x/..` and doubled slashes between segments, and (a
    folder) a trailing `/` or `/.`."""
    root = data.draw(st.sampled_from([str(base), str(base / "link"), f"{base}/deep/../.."]))
    parts = [root]
    for segment in segments:
        parts.append(data.draw(st.sampled_from(["", ".", "x/..", "/"])))
        parts.append(segment)
    path = "/".join(p for p in parts if p != "")
    if folder:
        path += data.draw(st.sampled_from(["", "/", "/."]))
    return path


def _related(first: list[str], second: list[str]) -> bool:
    shorter = min(len(first), len(second))
    return first[:shorter] == second[:shorter]


def _refused(reads: list[str], writes: list[Location]) -> bool:
    try:
        plan_locations(reads, writes)
    except OutputRefused:
        return True
    return False


@pytest.fixture
def base(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path)
    (tmp_path / "d1" / "d2").mkdir(parents=True)
    (tmp_path / "deep").symlink_to("d1/d2")
    return tmp_path


@EXAMPLES
@given(first=SEGMENTS, second=SEGMENTS, data=st.data())
def test_two_written_locations_overlap_whatever_their_spelling(base, first, second, data):
    writes = [
        Location("--output", _spelled(base, first, data, folder=True), FOLDER),
        Location("--dead-letter", _spelled(base, second, data, folder=True), FOLDER),
    ]
    assert _refused([], writes) == _related(first, second), writes


@EXAMPLES
@given(read=SEGMENTS, written=SEGMENTS, data=st.data())
def test_a_written_location_never_meets_a_read_one_whatever_the_spelling(base, read, written, data):
    writes = [Location("--json", _spelled(base, written, data, folder=False), FILE)]
    reads = [_spelled(base, read, data, folder=False)]
    assert _refused(reads, writes) == _related(read, written), (reads, writes)


@pytest.mark.parametrize(
    "pattern, output, refused",
    [
        ("*.jsonl", "out.jsonl", True),  # the next run would read it
        ("*.jsonl", "out.json", False),
        ("*.jsonl", "sub/out.jsonl", False),  # a plain glob reads no subfolder
        ("**/*.jsonl", "sub/x.jsonl", True),  # a local ** is one name's *, as glob reads it
        ("**/*.jsonl", "sub/deeper/x.jsonl", False),
        ("logs/*.jsonl", ".", True),  # around the folder it reads
        ("n?ght/*.jsonl", "night/out.jsonl", True),  # a wildcard in a folder's name
        ("n?ght/*.jsonl", "day/out.jsonl", False),
    ],
)
def test_a_glob_reaches_what_it_would_read_next_time(tmp_path, pattern, output, refused):
    reads = [str(tmp_path / pattern)]
    assert _refused(reads, [Location("-o", str(tmp_path / output), FILE)]) == refused


@pytest.mark.parametrize(
    "pattern, output, kind, refused",
    [
        ("logs/*/*.jsonl", "logs/night", FOLDER, True),  # its files would be read next run
        ("logs/*/*.jsonl", "logs/night", FILE, False),  # a file holds no file
        ("logs/*/*.jsonl", "logs/night/sub", FOLDER, False),
        ("logs/d?y/*.jsonl", "logs/night", FOLDER, False),
        ("logs/d?y/*.jsonl", "logs/day/letters", FOLDER, False),
        ("logs/*/x/*.jsonl", "logs/night/x", FOLDER, True),
        ("logs/*.jsonl", "logs/night", FOLDER, False),
        ("logs/*", "logs/night", FOLDER, True),
    ],
)
def test_a_written_folder_meets_a_glob_that_could_match_inside_it(
    tmp_path, pattern, output, kind, refused
):
    (tmp_path / "logs" / "day").mkdir(parents=True)
    reads = [str(tmp_path / pattern)]
    assert _refused(reads, [Location("--output", str(tmp_path / output), kind)]) == refused


@pytest.mark.parametrize("spelled", ["out.jsonl/", "out.jsonl/.", "."])
def test_a_file_output_spelled_as_a_folder_is_refused(tmp_path, spelled):
    with pytest.raises(OutputRefused, match="names a folder"):
        plan_locations([], [Location("-o", f"{tmp_path}/{spelled}", FILE)])


@pytest.mark.parametrize("kind", [FILE, FOLDER])
def test_standard_output_is_refused_as_a_written_location(tmp_path, kind, monkeypatch):
    """'-' is no file kvtrace can stage and rename, wherever it is run (not a file named '-')."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputRefused, match="standard output"):
        plan_locations([], [Location("--json", "-", kind)])
    assert not os.path.lexists(tmp_path / "-")


def test_a_file_where_a_folder_goes_and_a_folder_where_a_file_goes_are_refused(tmp_path):
    (tmp_path / "file").write_text("")
    (tmp_path / "folder").mkdir()
    with pytest.raises(OutputRefused, match="is a file; it names a folder"):
        plan_locations([], [Location("--output", str(tmp_path / "file"), FOLDER)])
    with pytest.raises(OutputRefused, match="is a folder; the output is one file"):
        plan_locations([], [Location("--json", str(tmp_path / "folder"), FILE)])


def test_an_output_folder_that_is_a_link_is_refused_not_followed(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    with pytest.raises(OutputRefused, match="symbolic link"):
        plan_locations([], [Location("--output", str(tmp_path / "link"), FOLDER, writer="analyze")])


@pytest.mark.parametrize(
    "manifest, writer",
    [
        ({"format": "mooncake-trace", "files": [], **KVTRACES}, "anonymize"),
        (
            {"format": "mooncake-trace", "converted_from": "bailian", "files": [], **KVTRACES},
            "convert",
        ),
    ],
)
def test_another_commands_output_folder_is_refused_its_own_is_not(tmp_path, manifest, writer):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(OutputRefused, match=f"an output of kvtrace {writer}"):
        plan_locations([], [Location("--output", str(out), FOLDER, writer="analyze")])
    plan_locations([], [Location("--output", str(out), FOLDER, writer=writer)])


def test_an_analysis_folder_is_known_by_its_mark_never_by_its_files(tmp_path):
    """analyze's folder has no manifest: the run marks it (publish.mark_output); a folder of
    the user's holding files by the same names is the user's, and refused."""
    out = tmp_path / "an"
    out.mkdir()
    (out / "analysis.txt").write_text("my notes")
    with pytest.raises(OutputRefused, match=r"kvtrace did not write \(analysis.txt\)"):
        plan_locations([], [Location("--output", str(out), FOLDER, writer="analyze")])
    (out / "analysis.txt").unlink()
    with folder_output(str(out), "analyze") as staged:  # an empty folder is taken
        with open(os.path.join(staged.path, "analysis.json"), "w") as handle:
            handle.write("{}")
    with pytest.raises(OutputRefused, match="an output of kvtrace analyze"):
        plan_locations([], [Location("--output", str(out), FOLDER, writer="anonymize")])
    plan_locations([], [Location("--output", str(out), FOLDER, writer="analyze")])
    (out / "notes.txt").write_text("")  # beside what the mark lists: foreign, refused as such
    with pytest.raises(OutputRefused, match=r"kvtrace did not write \(notes.txt\)"):
        plan_locations([], [Location("--output", str(out), FOLDER, writer="analyze")])


def test_an_existing_file_is_refused_without_overwrite(tmp_path):
    (tmp_path / "page.html").write_text("someone's")
    with pytest.raises(OutputRefused, match="--overwrite"):
        plan_locations([], [Location("-o", str(tmp_path / "page.html"), overwrite=False)])


def test_a_name_past_name_max_is_refused_a_long_valid_one_is_staged_under_a_digest(tmp_path):
    for kind in (FILE, FOLDER):
        with pytest.raises(OutputRefused, match=f"longer than {NAME_MAX} bytes"):
            plan_locations([], [Location("--output", str(tmp_path / ("a" * 256)), kind)])
    out = tmp_path / ("a" * 250)
    staging = os.path.basename(staging_folder(str(out), "0123456789ab"))
    assert len(staging) + len(".previous") <= NAME_MAX
    assert staging == os.path.basename(staging_folder(str(out), "0123456789ab"))
    with file_output(str(out)) as staged:
        staged.write(b"whole\n")
    assert out.read_bytes() == b"whole\n"
    assert os.listdir(tmp_path) == [out.name]


def test_an_output_folder_is_the_same_however_spelled(tmp_path):
    """out/. and out/sub/.. stage beside out, not inside it, and make nothing in it."""
    for spelling in ("out/.", "out/sub/..", "out//"):
        with folder_output(f"{tmp_path}/{spelling}", "analyze") as staged:
            assert os.path.dirname(os.path.abspath(staged.path)) == str(tmp_path)
            with open(os.path.join(staged.path, "a.txt"), "w") as handle:
                handle.write(spelling)
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert os.listdir(tmp_path / "out") == ["a.txt"]


NAMES = st.lists(st.sampled_from(["a", "[a]", "a?", "*"]), min_size=1, max_size=3)


@EXAMPLES
@given(read=NAMES, written=NAMES)
def test_an_existing_read_is_that_path_whatever_its_characters(read, written):
    """A read location that exists is read as that path (as the readers do), even with `[`,
    `*` or `?` in its names: a glob of it would match other names, or none."""
    with tempfile.TemporaryDirectory() as folder:
        trace = os.path.join(folder, *read)
        os.makedirs(os.path.dirname(trace), exist_ok=True)
        open(trace, "w").close()
        writes = [Location("--json", os.path.join(folder, *written), FILE)]
        assert _refused([trace], writes) == _related(read, written), (read, written)


def test_a_tilde_is_a_name_not_the_home_folder(tmp_path, monkeypatch):
    """The shell expands `~`; kvtrace reads and writes `~/t` in the current folder, so it is
    placed there."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert _refused(["~/t.jsonl"], [Location("--json", str(tmp_path / "~" / "t.jsonl"))])
    assert not _refused(["~/t.jsonl"], [Location("--json", str(tmp_path / "home" / "t.jsonl"))])


def test_dot_dot_after_a_link_is_placed_where_the_kernel_resolves_it(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "elsewhere" / "sub").mkdir(parents=True)
    (tmp_path / "a" / "link").symlink_to("../elsewhere/sub")
    read = str(tmp_path / "a" / "link" / ".." / "t.jsonl")  # elsewhere/t.jsonl to the kernel
    assert _refused([read], [Location("--json", str(tmp_path / "elsewhere" / "t.jsonl"))])
    assert not _refused([read], [Location("--json", str(tmp_path / "a" / "t.jsonl"))])
    with file_output(read) as staged:  # and written where it was placed
        staged.write(b"x")
    assert (tmp_path / "elsewhere" / "t.jsonl").read_bytes() == b"x"
    assert not (tmp_path / "a" / "t.jsonl").exists()


def _kvtrace_output(folder) -> None:
    folder.mkdir()
    (folder / "trace-00000-of-00001.jsonl").write_text("")
    (folder / "manifest.json").write_text(
        json.dumps(
            {"format": "mooncake-trace", "files": ["trace-00000-of-00001.jsonl"], **KVTRACES}
        )
    )


@pytest.mark.parametrize("read", ["trace-00000-of-00001.jsonl", "trace-*.jsonl"])
def test_a_shard_read_reaches_its_whole_kvtrace_output(tmp_path, read):
    out = tmp_path / "out"
    _kvtrace_output(out)
    with pytest.raises(OutputRefused, match="part of the kvtrace output"):
        plan_locations([str(out / read)], [Location("--json", str(out / "report.json"))])
    plain = tmp_path / "plain"  # no manifest: the folder is not one output
    plain.mkdir()
    assert not _refused([str(plain / "t.jsonl")], [Location("--json", str(plain / "r.json"))])


@pytest.mark.parametrize("name", ["stats.json", "manifest.json", "report.json", "new/report.json"])
@pytest.mark.parametrize("kind", [FILE, FOLDER])
def test_nothing_is_written_inside_a_commands_output_folder(tmp_path, name, kind):
    """Over one of its files, beside them or in a folder made in it, through any spelling: the
    folder would no longer be the whole output its manifest describes."""
    _kvtrace_output(tmp_path / "out")
    (tmp_path / "link").symlink_to("out")
    for spelled in (tmp_path / "out" / name, tmp_path / "link" / name):
        with pytest.raises(OutputRefused, match="inside .*/out, an output of kvtrace anonymize"):
            plan_locations([], [Location("--json", str(spelled), kind)])
    plan_locations([], [Location("--json", str(tmp_path / name), kind)])


@pytest.mark.parametrize("where", ["out", "out/letters", "out/sub/letters"])
def test_a_private_folder_is_never_another_commands_output_nor_inside_one(tmp_path, where):
    _kvtrace_output(tmp_path / "out")
    with pytest.raises(OutputRefused, match="output of kvtrace anonymize"):
        plan_locations([], [Location("--dead-letter", str(tmp_path / where), FOLDER, private=True)])
    plan_locations([], [Location("--dead-letter", str(tmp_path / "letters"), FOLDER, private=True)])


def test_a_fifo_by_the_manifests_name_never_hangs_the_plan(tmp_path):
    """The plan reads the manifest of each folder it reads from or writes around: bounded,
    regular files only (a FIFO would block the open)."""
    (tmp_path / "in").mkdir()
    os.mkfifo(tmp_path / "in" / "manifest.json")
    assert not _refused(
        [str(tmp_path / "in" / "t.jsonl")],
        [
            Location("--dead-letter", str(tmp_path / "in" / "letters"), FOLDER, private=True),
            Location("--json", str(tmp_path / "r.json")),
        ],
    )


def test_a_second_name_of_an_input_is_the_input(tmp_path):
    """Locations are compared by what they are (st_dev, st_ino), not by spelling: a hard link
    is the file it names, as a bind mount is the folder it mounts (tests/e2e: round 3)."""
    trace = tmp_path / "a" / "t.jsonl"
    trace.parent.mkdir()
    trace.write_text("")
    (tmp_path / "b").mkdir()
    os.link(trace, tmp_path / "b" / "t.jsonl")
    with pytest.raises(OutputRefused, match="is the input"):
        plan_locations([str(trace)], [Location("--json", str(tmp_path / "b" / "t.jsonl"))])


def _spots_of(names: tuple[str, ...], existing: int) -> list:
    """The spots of /names whose first `existing` prefixes exist, each identified by its path
    with a top folder m taken for a (its second name, as a bind mount of a at m)."""

    def identity(prefix: tuple[str, ...]) -> tuple[int, int]:
        folded = tuple("a" if (d, n) == (0, "m") else n for d, n in enumerate(prefix))
        return (0, hash("/".join(folded)))

    return [(identity(names[:d]), names[d:]) for d in range(min(existing, len(names)) + 1)]


NAMES_BELOW = st.lists(st.sampled_from(["a", "b"]), max_size=3)


@EXAMPLES
@given(
    path=NAMES_BELOW,
    folder=NAMES_BELOW,
    tops=st.tuples(*[st.sampled_from("am")] * 2),
    made=st.integers(1, 4),
)
def test_spots_beneath_is_the_name_prefix_whatever_the_folders_second_name(
    path, folder, tops, made
):
    """Pure: a path lies beneath a folder exactly when their names, a top folder's second name
    (m: a mounted again) taken for the first, begin alike; however much of them exists (the
    top folders do; a name existing on one exists on the other, as on one filesystem)."""
    path, folder = [tops[0], *path], [tops[1], *folder]
    found = spots_beneath(_spots_of(tuple(path), made), _spots_of(tuple(folder), made))
    expected = (
        [tuple(path[len(folder) :])]
        if path[1 : len(folder)] == folder[1:] and len(path) >= len(folder)
        else []
    )
    assert found == expected


@pytest.mark.parametrize("output", ["out", "new/deeper/out"])
def test_a_folder_output_is_published_only_where_a_folder_can_be_renamed(
    tmp_path, monkeypatch, output
):
    """The plan renames a staging folder where the publish will (the nearest existing folder
    on the way) and leaves nothing: a filesystem that refuses (overlay without redirect_dir:
    EXDEV, tests/e2e round 3 mounts one) is refused before any work, in one line."""
    where = Location("--output", str(tmp_path / output), FOLDER, writer="analyze")
    plan_locations([], [where])
    assert os.listdir(tmp_path) == []
    rename = os.rename

    def across_devices(source, target, *rest):
        if ".kvtrace-staging-" in os.fspath(source):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        return rename(source, target, *rest)

    monkeypatch.setattr(os, "rename", across_devices)
    with pytest.raises(
        OutputRefused,
        match=f"no folder can be renamed in {tmp_path} "
        r"\(Invalid cross-device link\)",
    ):
        plan_locations([], [where])
    assert os.listdir(tmp_path) == []


def test_a_killed_plans_staging_folder_goes_with_the_next_run(tmp_path):
    left = staging_folder(str(tmp_path / "out"), "0123456789ab")
    os.mkdir(left)
    with folder_output(str(tmp_path / "out"), "analyze") as staged:
        with open(os.path.join(staged.path, "analysis.txt"), "w") as handle:
            handle.write("a")
    assert os.listdir(tmp_path) == ["out"]


def test_a_double_star_glob_through_a_link_reaches_what_it_reads(tmp_path):
    """glob reads 'D/**/t*.jsonl' as 'D/*/t*.jsonl', through the link D/l -> ../E: E/t2.jsonl
    would be read next run, whichever of the two spellings, so both are refused."""
    (tmp_path / "D" / "sub").mkdir(parents=True)
    (tmp_path / "E").mkdir()
    (tmp_path / "E" / "t.jsonl").write_text("")
    (tmp_path / "D" / "l").symlink_to("../E")
    for pattern in ("D/*/t*.jsonl", "D/**/t*.jsonl"):
        reads = [str(tmp_path / pattern)]
        assert _refused(reads, [Location("--json", str(tmp_path / "E" / "t2.jsonl"), FILE)])


def test_a_private_file_in_a_folder_others_may_write_is_refused_before_the_work(tmp_path):
    """A private file is staged beside it: a folder others may write (a shared /tmp) is refused
    before any work, as make_folder would refuse it after; a folder of one's own is not."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    private = Location("--json", str(shared / "fit.json"), private=True)
    with pytest.raises(OutputRefused, match="may be written by other users"):
        plan_locations([], [private])
    plan_locations([], [Location("--json", str(shared / "fit.json"))])  # a public one may
    plan_locations([], [Location("--json", str(tmp_path / "fit.json"), private=True)])


@pytest.fixture
def bucket(s3):
    """s3://bucket on the S3 mock (conftest.s3)."""
    s3.create_bucket(Bucket="bucket")
    return "s3://bucket"


def _put(url: str, data: bytes = b"{}") -> None:
    from kvtrace.transforms import storage

    with storage.create(url) as handle:
        handle.write(data)


@pytest.mark.beam
@pytest.mark.parametrize("flag", ["--id-map", "--id-map-marks", "--dead-letter"])
def test_a_remote_private_folder_is_checked_as_private_not_as_an_output(bucket, flag):
    """What a map, its marks or dead letters hold is listed by no output's manifest: a remote
    private folder holding it is accepted as a local one is; a command's output there is refused
    by the flag that named it."""
    _put(f"{bucket}/private/map-0123.json")
    plan_locations([], [Location(flag, f"{bucket}/private", FOLDER, private=True)])
    _put(f"{bucket}/analysis/report.json")
    mark_output(f"{bucket}/analysis", "analyze")
    with pytest.raises(OutputRefused, match=f"^{flag} {bucket}/analysis is an output of kvtrace"):
        plan_locations([], [Location(flag, f"{bucket}/analysis", FOLDER, private=True)])


@pytest.mark.beam
def test_a_remote_output_is_refused_by_its_own_flag_and_never_replaces_another_commands(bucket):
    _put(f"{bucket}/out/notes.txt")
    with pytest.raises(OutputRefused, match=f"^--to {bucket}/out holds files kvtrace did not"):
        plan_locations([], [Location("--to", f"{bucket}/out", FOLDER, writer="convert")])
    _put(f"{bucket}/analysis/report.json")
    mark_output(f"{bucket}/analysis", "analyze")
    with pytest.raises(OutputRefused, match="is an output of kvtrace analyze; convert replaces"):
        plan_locations([], [Location("--to", f"{bucket}/analysis", FOLDER, writer="convert")])
    plan_locations([], [Location("--to", f"{bucket}/analysis", FOLDER, writer="analyze")])
